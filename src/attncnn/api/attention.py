"""Attention maps of a model in hand: :func:`attention_maps`, one :class:`LayerAttention` per layer.

The maps are taken from each attention layer's *real input* during an ordinary forward pass,
through forward hooks (:func:`attncnn.analysis.record_attention`), never by re-feeding
embeddings; see :mod:`attncnn.analysis.maps` for the machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..analysis import LayerMaps, attention_layers, attention_maps_by_kind, default_grid_size, position_maps
from ..errors import InputError
from .classifier import DEFAULT_BATCH_SIZE, Classifier, check_batch_size

__all__ = ["LayerAttention", "attention_maps"]


@dataclass
class LayerAttention(LayerMaps):
    """Attention of one layer: its probabilities and, where it has them, the two score terms.

    Shapes: ``(B, N_h, Q, H*W)`` with queries on dim -2 and keys on dim -1, tokens row-major
    (token ``(r, c)`` is index ``r * W + c``); ``B`` is 1 for position-only layers and for averaged
    maps; ``Q = H*W`` unless ``queries`` were chosen. All on the CPU in float32. It is a
    :class:`~attncnn.analysis.LayerMaps`, so the figure functions take a list of them.

    Attributes:
        layer: 0-based index of the block.
        probs: the attention probabilities, after the softmax.
        height, width: the token grid ``H x W`` the layer saw.
        position_only: True when the maps do not depend on the input (quadratic, learned).
        queries: the kept query indices, or None for all.
        content: the content term q.k / sqrt(D_h) of the pre-softmax score (paper eq. 8), or None
            (position-only layers, or ``scores=False``).
        positional: the positional term (q.r / sqrt(D_h), GPSA's positional score, or the whole
            score of a position-only layer), or None (plain content attention, or ``scores=False``).
    """

    content: torch.Tensor | None = None
    positional: torch.Tensor | None = None


def _score_kinds(network: nn.Module) -> list[str]:
    """The score terms every attention layer of ``network`` has (``"content"``, ``"positional"``)."""
    layers = attention_layers(network)           # a position-only layer's whole score is positional
    kinds = [] if any(layer.position_only for layer in layers) else ["content"]
    return kinds + (["positional"] if all(layer.has_positional_term for layer in layers) else [])


def _checked_queries(network: nn.Module, queries: Sequence[int], image: tuple[int, int]) -> list[int]:
    """``queries`` as a list of ints, each a token of the grid the network makes of ``image``
    ``(H_img, W_img)`` images (row-major, ``[0, H*W)``)."""
    height, width = default_grid_size(network, image)
    chosen = [int(q) for q in queries]
    wrong = [q for q in chosen if not 0 <= q < height * width]
    if wrong:
        raise InputError(f"queries must be token indices r * W + c in [0, {height * width}) for this model's "
                         f"{height}x{width} token grid, got {wrong}")
    return chosen


def _inputs(model: nn.Module, images, resize: bool | str) -> tuple[nn.Module, torch.Tensor | None]:
    """The bare network and its (normalised) input."""
    if isinstance(model, Classifier):
        return model.network, None if images is None else model.preprocess(images, resize=resize)
    if images is not None and not (isinstance(images, torch.Tensor) and images.dtype.is_floating_point):
        raise InputError("a bare network takes normalised float images (B, C, H, W); load the model with "
                         "attncnn.load_model or attncnn.pretrained to pass images in [0, 1] or uint8")
    if resize is not False:
        raise InputError("resize needs the training size a Classifier knows: load the model with "
                         "attncnn.load_model or attncnn.pretrained, or resize the images yourself")
    return model, images


def attention_maps(model: nn.Module, images=None, *, scores: bool = True, average: bool = False,
                   queries: Sequence[int] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                   resize: bool | str = False) -> list[LayerAttention]:
    """Attention probabilities (and score terms) of every layer, from real activations.

    Args:
        model: a :class:`Classifier` (``images`` in ``[0, 1]`` or uint8), or a bare image transformer
            (``images`` normalised as it was trained). Eval mode during the call, then restored.
        images: ``(B, 3, H_img, W_img)``, or None for a model whose layers are all position-only
            (computed for 32 x 32 images).
        scores: also return the pre-softmax score terms (``content``, ``positional``) each layer has.
        average: average the maps over the images (paper Fig. 6) instead of one per image.
        queries: keep only these query tokens (row-major ``r * W + c``, each in ``[0, H*W)``).
        batch_size: images per forward pass, a positive integer (default 50).
        resize: for a :class:`Classifier`, as :meth:`Classifier.preprocess`.

    Returns:
        One :class:`LayerAttention` per block, first block first. Memory: each tensor holds
        ``B * N_h * Q * (H*W)`` floats per layer; use ``queries``, ``average=True`` or fewer images
        for less.

    Raises:
        InputError: a model without attention layers (the ResNet baseline), images out of range,
            of the wrong shape or (without ``resize``) size, no images for a model whose attention
            depends on them, query indices outside the token grid, or a bad ``batch_size``.
    """
    batch_size = check_batch_size(batch_size)
    network, x = _inputs(model, images, resize)
    if queries is not None:
        queries = _checked_queries(network, queries, (32, 32) if x is None else tuple(x.shape[-2:]))
    layers = attention_layers(network)
    kinds = ["probs", *(_score_kinds(network) if scores else [])]
    if x is None:
        if not all(layer.position_only for layer in layers):
            raise InputError("this model's attention depends on the image: pass images, e.g. "
                             "attention_maps(model, images) with images (B, 3, 32, 32) in [0, 1]")
        by_kind = {kind: position_maps(network, kind=kind) for kind in kinds}
        if queries is not None:
            for maps in by_kind.values():
                for m in maps:
                    m.probs, m.queries = m.probs[:, :, list(queries), :], list(queries)
    else:
        by_kind = attention_maps_by_kind(network, x, kinds, average=average, queries=queries,
                                         batch_size=batch_size)
    out = []
    for i, probs in enumerate(by_kind["probs"]):
        terms = {kind: by_kind[kind][i].probs for kind in kinds if kind != "probs"}
        out.append(LayerAttention(probs.layer, probs.probs, probs.height, probs.width, probs.position_only,
                                  probs.queries, content=terms.get("content"), positional=terms.get("positional")))
    return out
