"""Attention maps captured from real activations (the paper's Figs. 5-6).

The fast forward path never materialises the probabilities. :func:`record_attention` puts a
forward pre-hook on every block's attention layer that hands the layer's *real input* (the output
of the previous block, not re-fed embeddings: the measurement bug of convit#23) to a callback.
:func:`attention_maps` asks for the probabilities ``(B or 1, N_h, H*W, H*W)`` (queries on dim -2,
keys on dim -1, tokens row-major), the scores or one of their terms (:func:`layer_values`);
:func:`attention_maps_by_kind` several of these in one pass (the viewer's export).

Position-only layers' maps come from ``layer.grid_probs(H, W)`` (batch dimension 1); without
images, :func:`position_maps` computes them for a given grid.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from ..errors import InputError
from ..layers import GridAttention, is_attention_layer

__all__ = ["LayerMaps", "attention_layers", "measured_layers", "default_grid_size", "record_attention", "run_recorded",
           "attention_maps", "attention_maps_by_kind", "position_maps", "layer_values", "layer_values_by_kind",
           "VALUE_KINDS"]

#: What :func:`layer_values` can compute: the probabilities, the full pre-softmax scores, the
#: positional term only (q.r or the position-only score) and the content term only (q.k).
VALUE_KINDS = ("probs", "scores", "positional", "content")


@dataclass
class LayerMaps:
    """Attention of one layer.

    Attributes:
        layer: 0-based index of the block.
        probs: ``(B or 1, N_h, H*W, H*W)`` attention probabilities (for the score kinds of
            :data:`VALUE_KINDS`, the scores they asked for), or ``(B or 1, N_h, len(queries), H*W)``
            when only some queries were kept; batch 1 for position-only layers or averaged maps.
        height, width: the token grid ``H x W`` the layer saw.
        position_only: True when the maps do not depend on the input.
        queries: the kept query indices (row-major), or None for all ``H*W``.
    """

    layer: int
    probs: torch.Tensor
    height: int
    width: int
    position_only: bool
    queries: list[int] | None = None

    @property
    def values(self) -> torch.Tensor:
        """The former name of :attr:`probs` (deprecated: "values" reads as the attention's V)."""
        warnings.warn("LayerMaps.values is deprecated; use .probs", DeprecationWarning, stacklevel=2)
        return self.probs


def attention_layers(model: nn.Module) -> list[GridAttention]:
    """The attention layer of every block of an image transformer, first block first.

    Raises:
        InputError: the model has no attention blocks (e.g. the ResNet18 baseline).
    """
    blocks = getattr(model, "blocks", None)
    layers = [getattr(b, "attention", None) for b in blocks] if blocks is not None else []
    if not layers or not all(is_attention_layer(a) for a in layers):
        raise InputError(f"{type(model).__name__} has no self-attention blocks; attention maps and "
                         "metrics need an image-transformer run (not the ResNet baseline)")
    return layers


def measured_layers(model: nn.Module, images: torch.Tensor | None, needs: str) -> tuple[list[GridAttention], bool]:
    """The attention layers of a model measured from ``images``, or from no images (None) when every
    layer is position-only; and whether every layer is.

    Raises:
        InputError: images that are not a non-empty ``(B, C, H, W)`` batch, no attention blocks, or
            no images for a model whose attention depends on the input (``needs`` ends the message).
    """
    if images is not None and (images.dim() != 4 or images.shape[0] == 0):
        raise InputError(f"expected a non-empty batch of images (B, C, H, W), got shape {tuple(images.shape)}")
    layers = attention_layers(model)
    position_only = all(layer.position_only for layer in layers)
    if images is None and not position_only:
        raise InputError(f"this model's attention depends on the input: {needs}")
    return layers, position_only


def default_grid_size(model: nn.Module, image_size: int | tuple[int, int] = 32) -> tuple[int, int]:
    """Token grid ``(H, W)`` of ``image_size x image_size`` images (CIFAR: 32), or of
    ``(height, width)`` images, after the model's pooling.

    Raises:
        InputError: a side not divisible by the pooling width.
    """
    pooling = getattr(getattr(model, "config", None), "pooling", 1)
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    if height % pooling or width % pooling:
        raise InputError(f"image size {height}x{width} is not divisible by the pooling width {pooling}")
    return height // pooling, width // pooling


Callback = Callable[[int, GridAttention, torch.Tensor], None]


@contextlib.contextmanager
def record_attention(model: nn.Module, callback: Callback) -> Iterator[None]:
    """Call ``callback(layer_index, attention_layer, x)`` with each attention layer's real input, the
    ``(B, H, W, D)`` grid entering block ``layer_index``'s attention in any forward pass inside the
    ``with`` block (hooks removed on exit). The callback runs under :func:`torch.no_grad` and must call
    ``layer.forward(...)``, not the layer itself (which would re-enter the hook).

    Raises:
        InputError: the model has no attention blocks.
    """
    handles = []

    def make_hook(index: int):
        def hook(module, args):
            with torch.no_grad():
                callback(index, module, args[0])
        return hook

    try:
        for i, layer in enumerate(attention_layers(model)):
            handles.append(layer.register_forward_pre_hook(make_hook(i)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_recorded(model: nn.Module, images: torch.Tensor, callback: Callback, batch_size: int = 50) -> None:
    """Run ``images (N, C, H, W)`` through ``model`` in eval mode, ``batch_size`` at a time, under
    :func:`record_attention` with ``callback``; the model's train/eval mode is restored after."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with record_attention(model, callback):
            for start in range(0, images.shape[0], batch_size):
                model(images[start:start + batch_size].to(device))
    finally:
        model.train(was_training)


def layer_values(layer: GridAttention, x: torch.Tensor, kind: str = "probs") -> torch.Tensor:
    """Attention probabilities or scores of ``layer`` for its input grid ``x (B, H, W, D)``.

    Args:
        layer: an attention layer in eval mode.
        x: its real input.
        kind: one of :data:`VALUE_KINDS`: ``"probs"`` (after the softmax), ``"scores"`` (before it,
            all terms), ``"positional"`` (q.r/sqrt(D_h), or the whole score of a position-only layer)
            or ``"content"`` (q.k/sqrt(D_h)): the layer's own
            :meth:`~attncnn.layers.ContentAttention.score_terms`.

    Returns:
        ``(B, N_h, H*W, H*W)``, or ``(1, N_h, H*W, H*W)`` for position-only layers.

    Raises:
        InputError: unknown ``kind``, or a kind the layer does not have (content scores of a
            position-only layer, positional scores of a plain content layer).
    """
    return layer_values_by_kind(layer, x, (kind,))[kind]


def layer_values_by_kind(layer: GridAttention, x: torch.Tensor, kinds: Sequence[str]) -> dict[str, torch.Tensor]:
    """:func:`layer_values` of several kinds for the same input, computing shared work once.

    ``"content"`` and ``"positional"`` come from one call of the layer's ``score_terms``.

    Returns:
        ``{kind: values}`` for every kind in ``kinds``, shaped as :func:`layer_values` says.

    Raises:
        InputError: as :func:`layer_values`.
    """
    _check_kinds(kinds)
    _, h, w, _ = x.shape
    if layer.position_only:
        return {kind: _position_values(layer, h, w, kind) for kind in kinds}
    content = positional = None
    if "content" in kinds or "positional" in kinds:
        content, positional = layer.score_terms(x)
        if "positional" in kinds and positional is None:
            raise InputError(f"{type(layer).__name__} has no positional scores")
    out = {"content": content, "positional": positional}
    if "scores" in kinds:
        out["scores"] = layer.input_scores(x)
    if "probs" in kinds:
        out["probs"] = layer.input_probs(x)
    return {kind: out[kind] for kind in kinds}


def _check_kinds(kinds: Sequence[str]) -> None:
    for kind in kinds:
        if kind not in VALUE_KINDS:
            raise InputError(f"unknown attention value kind {kind!r}; choose one of {', '.join(VALUE_KINDS)}")


def _position_values(layer: GridAttention, height: int, width: int, kind: str) -> torch.Tensor:
    """``(1, N_h, H*W, H*W)`` values of a position-only layer; its whole score is positional."""
    if kind == "probs":
        return layer.grid_probs(height, width)
    if kind not in ("scores", "positional"):
        raise InputError(f"{type(layer).__name__} has no {kind} scores (it is position-only); use probs or scores")
    return layer.grid_scores(height, width).unsqueeze(0)


@torch.no_grad()
def attention_maps(model: nn.Module, images: torch.Tensor, *, kind: str = "probs", average: bool = False,
                   queries: Sequence[int] | None = None, batch_size: int = 50) -> list[LayerMaps]:
    """Attention maps of every layer for real images, from hooked activations.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer` (eval mode during the call, then restored).
        images: normalised images ``(B, C, H_img, W_img)`` on any device (moved to the model's).
        kind: see :func:`layer_values`.
        average: average the maps over the images (paper Fig. 6: 100 test images) instead of one per
            image.
        queries: keep only these query tokens (row-major indices ``row*W + col``).
        batch_size: images per forward pass.

    Returns:
        One :class:`LayerMaps` per block, on the CPU in float32: values ``(B, N_h, Q, H*W)``, or
        batch 1 when averaged or position-only (``Q`` = number of kept queries or ``H*W``).

    Raises:
        InputError: no attention blocks, bad image shape, unknown ``kind``, empty ``images``.
    """
    return attention_maps_by_kind(model, images, (kind,), average=average, queries=queries,
                                  batch_size=batch_size)[kind]


@torch.no_grad()
def attention_maps_by_kind(model: nn.Module, images: torch.Tensor, kinds: Sequence[str], *, average: bool = False,
                           queries: Sequence[int] | None = None, batch_size: int = 50) -> dict[str, list[LayerMaps]]:
    """Several kinds of :func:`attention_maps` in one pass over the images (:func:`layer_values_by_kind`).

    Returns:
        ``{kind: [LayerMaps per block]}``, each list as :func:`attention_maps` returns it.

    Raises:
        InputError: as :func:`attention_maps`, or no ``kinds``.
    """
    layers, _ = measured_layers(model, images, "compute its maps from images")
    if not kinds:
        raise InputError(f"give at least one attention value kind: {', '.join(VALUE_KINDS)}")
    _check_kinds(kinds)
    # kept[(kind, layer)]: the maps of each batch, or their running sum (average), or the one
    # input-free map (position-only); all on the CPU in float32
    kept: dict[tuple[str, int], list[torch.Tensor]] = {}
    grids: dict[int, tuple[int, int]] = {}

    def callback(index: int, layer: GridAttention, x: torch.Tensor) -> None:
        grids[index] = (x.shape[1], x.shape[2])
        if layer.position_only and (kinds[0], index) in kept:
            return                                   # same maps for every batch
        for kind, values in layer_values_by_kind(layer, x, kinds).items():
            values = (values if queries is None else values[:, :, list(queries), :]).float()
            parts = kept.setdefault((kind, index), [])
            if average and not layer.position_only:
                total = values.sum(0, keepdim=True).cpu()
                parts[:] = [parts[0] + total if parts else total]
            else:
                parts.append(values.cpu())

    run_recorded(model, images, callback, batch_size)
    n = images.shape[0]

    def finished(kind: str, index: int, layer: GridAttention) -> LayerMaps:
        parts = kept[(kind, index)]
        values = parts[0] if layer.position_only else (parts[0] / n if average else torch.cat(parts))
        return LayerMaps(index, values, *grids[index], layer.position_only,
                         None if queries is None else list(queries))

    return {kind: [finished(kind, i, layer) for i, layer in enumerate(layers)] for kind in kinds}


@torch.no_grad()
def position_maps(model: nn.Module, grid_size: tuple[int, int] | None = None, *,
                  kind: str = "probs") -> list[LayerMaps]:
    """Maps of a position-only model without any image (they do not depend on the input).

    Args:
        model: an image transformer whose layers are all position-only (quadratic or learned).
        grid_size: token grid ``(H, W)``; default :func:`default_grid_size` (32x32 images).
        kind: ``"probs"`` or ``"scores"`` (``"positional"`` is the same as ``"scores"`` here).

    Returns:
        One :class:`LayerMaps` per block with values ``(1, N_h, H*W, H*W)`` (CPU, float32).

    Raises:
        InputError: no attention blocks, a layer that depends on the input (pass images to
            :func:`attention_maps` instead), or a kind other than these.
    """
    layers, _ = measured_layers(model, None, "compute its maps from images (attention_maps(model, images))")
    _check_kinds((kind,))
    h, w = grid_size or default_grid_size(model)
    return [LayerMaps(i, _position_values(layer, h, w, kind).detach().float().cpu(), h, w, True)
            for i, layer in enumerate(layers)]
