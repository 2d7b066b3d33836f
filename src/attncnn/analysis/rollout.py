"""Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, section 3).

Per layer, the heads' probabilities are averaged, ``A_l = mean_h P_l`` ``(N, N)``, the residual is
accounted for as ``A'_l = 0.5 * (A_l + I)`` (rows renormalised), and the layers are multiplied from
the first up: ``R_1 = A'_1``, ``R_l = A'_l R_{l-1}``. Row ``q`` of ``R_l`` is the share of each
input token in token ``q`` after block ``l`` (queries on dim -2, input tokens on dim -1).
:func:`attention_rollout` takes per-layer probabilities in hand; :func:`model_rollout` computes
them from each layer's real input, one batch at a time.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..errors import InputError
from ..layers import GridAttention
from .maps import LayerMaps, default_grid_size, measured_layers, run_recorded

__all__ = ["attention_rollout", "model_rollout", "rollout_step"]


def rollout_step(probs: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
    """One layer of attention rollout.

    Args:
        probs: the layer's probabilities ``(B, N_h, N, N)`` (every query kept).
        previous: the rollout up to the layer below ``(B or 1, N, N)``, or None for the first layer.

    Returns:
        ``A' @ previous`` (or ``A'`` for the first layer) ``(B, N, N)``, float32 on the input's device,
        with ``A' = rownorm(0.5 * (mean_h probs + I))``.

    Raises:
        InputError: probabilities that are not ``(B, N_h, N, N)``.
    """
    if probs.dim() != 4 or probs.shape[-1] != probs.shape[-2]:
        raise InputError(f"rollout needs every query of the layer: probabilities (B, N_h, N, N), "
                         f"got {tuple(probs.shape)}")
    mixed = 0.5 * (probs.float().mean(1) + torch.eye(probs.shape[-1], device=probs.device))
    mixed = mixed / mixed.sum(-1, keepdim=True)           # exact sums for maps stored in low precision
    return mixed if previous is None else mixed @ previous.to(mixed.device, torch.float32)


def attention_rollout(probs: Sequence[torch.Tensor | LayerMaps]) -> list[torch.Tensor]:
    """Attention rollout after each layer, from per-layer probabilities (module docstring).

    Args:
        probs: first layer first, each ``(B or 1, N_h, N, N)`` (a tensor, or a
            :class:`~attncnn.analysis.LayerMaps` / :class:`attncnn.LayerAttention` of probabilities with
            every query); batch 1 (position-only layers) broadcasts against batch ``B``.

    Returns:
        ``R_1, ..., R_L``, each float32 ``(B or 1, N, N)`` on the first map's device.

    Raises:
        InputError: no layers, maps with only some queries kept, or layers with different token counts.
    """
    tensors = [p.probs if isinstance(p, LayerMaps) else p for p in probs]
    if not tensors:
        raise InputError("attention rollout needs the probabilities of at least one layer")
    if any(isinstance(p, LayerMaps) and p.queries is not None for p in probs):
        raise InputError("attention rollout needs every query of each layer; compute the maps without `queries`")
    if len({t.shape[-1] for t in tensors}) != 1:
        raise InputError(f"the layers have different token counts {sorted({t.shape[-1] for t in tensors})}")
    out, previous = [], None
    for t in tensors:
        previous = rollout_step(t.to(tensors[0].device), previous)
        out.append(previous)
    return out


@torch.no_grad()
def model_rollout(model: nn.Module, images: torch.Tensor | None = None, *, average: bool = False,
                  grid_size: tuple[int, int] | None = None, batch_size: int = 50) -> list[LayerMaps]:
    """Attention rollout of an image transformer from its layers' real inputs.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer` (eval mode during the call, then restored).
        images: normalised images ``(B, C, H_img, W_img)``; None for a model whose layers are all
            position-only (computed for ``grid_size``, default that of 32 x 32 images).
        average: average each layer's rollout over the images instead of one per image.
        grid_size: token grid without images.
        batch_size: images per forward pass.

    Returns:
        One :class:`~attncnn.analysis.LayerMaps` per block, ``probs`` float32 on the CPU
        ``(B, 1, N, N)`` (one "head": the rollout up to and including that block), or batch 1 when
        averaged or when every layer is position-only.

    Raises:
        InputError: no attention blocks, an input-dependent model without images, or empty images.
    """
    layers, position_only = measured_layers(model, images, "its rollout needs images")
    if images is None:
        h, w = grid_size or default_grid_size(model)
        rolled = attention_rollout([layer.grid_probs(h, w) for layer in layers])
        return [LayerMaps(i, r.unsqueeze(1).cpu(), h, w, True) for i, r in enumerate(rolled)]
    kept: dict[int, list[torch.Tensor]] = {}
    grids: dict[int, tuple[int, int]] = {}
    state: dict[str, torch.Tensor | None] = {"previous": None}

    def callback(index: int, layer: GridAttention, x: torch.Tensor) -> None:
        grids[index] = (x.shape[1], x.shape[2])
        if index == 0:
            state["previous"] = None                        # a new batch starts at the first block
        probs = layer.grid_probs(*grids[index]) if layer.position_only else layer.input_probs(x)
        current = rollout_step(probs, state["previous"])
        state["previous"] = current
        parts = kept.setdefault(index, [])
        if position_only:                                   # the same for every image: once
            parts[:] = parts or [current.cpu()]
            return
        current = current.expand(x.shape[0], -1, -1)        # a position-only first layer has batch 1
        if average:
            total = current.sum(0, keepdim=True).cpu()
            parts[:] = [parts[0] + total if parts else total]
        else:
            parts.append(current.cpu())

    run_recorded(model, images, callback, batch_size)
    n = int(images.shape[0])
    out = []
    for i in range(len(layers)):
        values = kept[i][0] if position_only else (kept[i][0] / n if average else torch.cat(kept[i]))
        out.append(LayerMaps(i, values.unsqueeze(1), *grids[i], position_only))
    return out
