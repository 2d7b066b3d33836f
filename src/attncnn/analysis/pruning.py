"""Pruning degenerate quadratic heads (PAPER.md 3.8; runs quadratic-generalized -> -pruned).

A head is degenerate when its attention is nearly uniform or a thin stripe
(:func:`~attncnn.analysis.metrics.degenerate_heads`). Pruning removes it: its row of ``centers``
and ``spreads``, its block of ``head_dim`` input columns of the folded value/output matrix
``value`` (and, with a value projection, its block of ``value_in`` output rows); ``N_h`` drops.
Queries, keys and the block's output projection are untouched, as in the reference.

Each pruned layer is a new :class:`~attncnn.layers.QuadraticAttention` with fewer heads, so a
pruned model no longer matches ``ImageTransformerConfig.num_heads``: rebuilding it from a
checkpoint needs a per-layer head count in the configuration (not available yet).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..layers import QuadraticAttention
from ..models import count_parameters
from .maps import attention_layers
from .metrics import DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE, degenerate_heads

__all__ = ["PruneResult", "prune_layer", "prune_degenerate_heads"]


@dataclass
class PruneResult:
    """What :func:`prune_degenerate_heads` did.

    Attributes:
        pruned: per layer, the 0-based indices of the removed heads.
        heads_before, heads_after: per layer head counts.
        parameters_before, parameters_after: trainable parameter counts of the model.
    """

    pruned: list[list[int]]
    heads_before: list[int]
    heads_after: list[int]
    parameters_before: int
    parameters_after: int

    def to_dict(self) -> dict:
        return {"pruned": self.pruned, "pruned_per_layer": [len(p) for p in self.pruned],
                "heads_before": self.heads_before, "heads_after": self.heads_after,
                "parameters_before": self.parameters_before, "parameters_after": self.parameters_after}


@torch.no_grad()
def prune_layer(layer: QuadraticAttention, keep: torch.Tensor) -> QuadraticAttention:
    """A copy of ``layer`` with only the heads where ``keep`` is true.

    Args:
        layer: a quadratic attention layer.
        keep: bool ``(N_h,)``; at least one head must be kept.

    Returns:
        A new layer (same device, dtype, training mode) whose output equals the original's
        whenever the removed heads contribute nothing (e.g. their value columns are zero).

    Raises:
        TypeError: not a quadratic layer. ValueError: wrong mask shape or no head kept.
    """
    if not isinstance(layer, QuadraticAttention):
        raise TypeError(f"only quadratic layers can be pruned, got {type(layer).__name__}")
    keep = torch.as_tensor(keep, dtype=torch.bool).cpu()
    if keep.shape != (layer.num_heads,):
        raise ValueError(f"keep mask must have shape ({layer.num_heads},), got {tuple(keep.shape)}")
    kept = int(keep.sum())
    if kept == 0:
        raise ValueError("cannot prune every head of a layer: the layer would have no output")
    new = QuadraticAttention(layer.dim, kept, full_covariance=layer.full_covariance,
                             center_init_std=layer.center_init_std, spread_init_std=layer.spread_init_std,
                             head_dim=layer.head_dim, out_dim=layer.out_dim, attn_drop=layer.attn_drop.p)
    param = layer.centers
    new = new.to(device=param.device, dtype=param.dtype)
    idx = keep.nonzero().squeeze(1).to(param.device)
    new.centers.copy_(layer.centers[idx])
    new.spreads.copy_(layer.spreads[idx])
    dh = layer.head_dim
    columns = (idx[:, None] * dh + torch.arange(dh, device=param.device)).reshape(-1)   # head blocks
    new.value.weight.copy_(layer.value.weight[:, columns])
    new.value.bias.copy_(layer.value.bias)
    if layer.value_in is not None:
        new.value_in.weight.copy_(layer.value_in.weight[columns])
        new.value_in.bias.copy_(layer.value_in.bias[columns])
    new.train(layer.training)
    return new


def prune_degenerate_heads(model: nn.Module, *, condition_number: float = DEFAULT_CONDITION_NUMBER,
                           min_eigenvalue: float = DEFAULT_MIN_EIGENVALUE) -> PruneResult:
    """Remove every degenerate head of a quadratic image transformer, in place.

    A layer whose heads are all degenerate keeps its one least degenerate head (largest
    eigenvalue of Sigma^-1), since a layer needs at least one head.

    Raises:
        ValueError: the model has no attention blocks or non-quadratic ones.
    """
    layers = attention_layers(model)
    if not all(isinstance(layer, QuadraticAttention) for layer in layers):
        raise ValueError("pruning degenerate heads needs a quadratic-attention model (PAPER.md 3.8)")
    before = count_parameters(model)
    pruned, heads_before, heads_after = [], [], []
    for block, layer in zip(model.blocks, layers):
        bad = degenerate_heads(layer, condition_number=condition_number, min_eigenvalue=min_eigenvalue)
        if bool(bad.all()):
            eig = torch.linalg.eigvalsh(layer.inverse_covariance.detach().double().cpu()).abs().amax(-1)
            bad[int(eig.argmax())] = False
        heads_before.append(layer.num_heads)
        pruned.append(bad.nonzero().squeeze(1).tolist())
        if bool(bad.any()):
            block.attention = prune_layer(layer, ~bad)
        heads_after.append(block.attention.num_heads)
    return PruneResult(pruned, heads_before, heads_after, before, count_parameters(model))
