"""How local a model's attention is, and where it flows: :func:`locality` and :func:`attention_rollout`,
the companions of :func:`attncnn.attention_maps`, from each layer's real input (forward hooks).

Definitions and sources: :mod:`attncnn.analysis.locality` (mean attention distance, ViT Fig. 7;
normalised entropy) and :mod:`attncnn.analysis.rollout` (Abnar & Zuidema 2020).
"""

from __future__ import annotations

from torch import nn

from ..analysis import LayerMaps, attention_layers
from ..analysis.locality import DEFAULT_LOCALITY_IMAGES, Locality, model_locality
from ..analysis.rollout import model_rollout
from ..errors import InputError
from .attention import _inputs
from .classifier import DEFAULT_BATCH_SIZE, Classifier, check_batch_size

__all__ = ["locality", "attention_rollout"]


def _position_only(model: nn.Module, images, what: str) -> bool:
    """Whether every attention layer of ``model`` is position-only; refuses no ``images`` where one is not."""
    network = model.network if isinstance(model, Classifier) else model
    position_only = all(layer.position_only for layer in attention_layers(network))
    if images is None and not position_only:
        raise InputError(f"this model's attention depends on the image: pass test images for its {what}, e.g. "
                         f"the first {DEFAULT_LOCALITY_IMAGES} test images (N, 3, 32, 32) in [0, 1]")
    return position_only


def locality(model: nn.Module, images=None, *, n_images: int = DEFAULT_LOCALITY_IMAGES,
             batch_size: int = DEFAULT_BATCH_SIZE, resize: bool | str = False) -> Locality:
    """Mean attention distance and normalised entropy of every head, per layer
    (definitions and sources: :mod:`attncnn.analysis.locality`).

    Args:
        model: a :class:`~attncnn.Classifier` (``images`` in ``[0, 1]`` or uint8) or a bare image
            transformer (``images`` normalised as it was trained). Eval mode during the call.
        images: ``(N, 3, H_img, W_img)`` test images; the first ``n_images`` of them are used.
            None for a model whose layers are all position-only: the measures are computed once,
            for 32 x 32 images.
        n_images: how many of ``images`` to average over (default 1,000), a positive integer.
        batch_size: images per forward pass, a positive integer.
        resize: for a :class:`~attncnn.Classifier`, as :meth:`~attncnn.Classifier.preprocess`.

    Returns:
        A :class:`~attncnn.analysis.locality.Locality`: per layer, float64 ``(N_h,)`` tensors
        ``distance`` (tokens), ``normalized_distance`` and ``normalized_entropy``; ``images`` is the
        number of images averaged (0 when none was needed); ``to_dict()`` gives JSON.

    Raises:
        InputError: a model without attention layers (the ResNet baseline), no images for a model
            whose attention depends on them, images out of range or of the wrong shape, or an
            ``n_images`` / ``batch_size`` that is not a positive integer.
    """
    batch_size = check_batch_size(batch_size)
    if isinstance(n_images, bool) or not isinstance(n_images, int) or n_images < 1:
        raise InputError(f"n_images must be a positive integer, got {n_images!r}")
    if _position_only(model, images, "locality"):
        images = None                                       # nothing to average: the same maps for every image
    network, x = _inputs(model, None if images is None else images[:n_images], resize)
    return model_locality(network, x, batch_size=batch_size)


def attention_rollout(model: nn.Module, images=None, *, average: bool = False, batch_size: int = DEFAULT_BATCH_SIZE,
                      resize: bool | str = False) -> list[LayerMaps]:
    """Attention rollout after every layer (Abnar & Zuidema 2020, section 3; :mod:`attncnn.analysis.rollout`),
    from real activations.

    Args:
        model, images, batch_size, resize: as :func:`attncnn.attention_maps` (None images: a
            position-only model, computed for 32 x 32 images).
        average: average the rollout over the images instead of one per image.

    Returns:
        One :class:`~attncnn.analysis.LayerMaps` per block: ``probs`` float32 ``(B, 1, H*W, H*W)`` on
        the CPU, the rollout up to and including that block (queries on dim -2, input tokens on dim -1);
        batch 1 when averaged or position-only. Memory: ``B * (H*W)^2`` floats per layer.

    Raises:
        InputError: as :func:`locality`.
    """
    batch_size = check_batch_size(batch_size)
    _position_only(model, images, "rollout")
    network, x = _inputs(model, images, resize)
    return model_rollout(network, x, average=average, batch_size=batch_size)
