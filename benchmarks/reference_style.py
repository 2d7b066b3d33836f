"""Reference-style baselines: the original code's formulation of each attention layer, in our words.

These reproduce how epfml/attention-cnn computes attention (dense einsums over every pair of
tokens), so the benchmark can time our layers against it side by side with the same weights:

* quadratic: a precomputed relative-feature tensor ``R`` of shape ``(H, W, H, W, 5)`` holding
  (d1, d2, d1^2, d2^2, d1 d2) for every (query, key) pair, dotted with a per-head 5-vector to give
  scores ``(H, W, N_h, H, W)``;
* learned, position only: row/column scores gathered per pair and broadcast to ``(H, W, N_h, H, W)``;
* learned + content: content scores materialised per batch as ``(B, H, W, N_h, H, W)`` plus the q.r
  term, also per batch;
* aggregation: one dense 5-D einsum over ``(H, W, N_h, H, W)`` x ``(B, H, W, D)``.

Each wrapper reads the parameters of one of our layers, so outputs can be compared exactly.
Not part of the package: benchmarks only.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from attncnn.layers import LearnedRelativeContentAttention, QuadraticAttention
from attncnn.layers.relative import axis_offsets, relative_offsets

__all__ = ["ReferenceStyleAttention", "reference_style_model"]


def _relative_features(h: int, w: int, dtype, device) -> torch.Tensor:
    """``(H, W, H, W, 5)``: (d1, d2, d1^2, d2^2, d1*d2) for query (i, j) and key (k, l), d = key - query."""
    d = relative_offsets(h, w, device, dtype).reshape(h, w, h, w, 2)
    d1, d2 = d[..., 0], d[..., 1]
    return torch.stack([d1, d2, d1 * d1, d2 * d2, d1 * d2], dim=-1).contiguous()


class ReferenceStyleAttention(nn.Module):
    """Wraps one of our attention layers and computes its output the reference code's way."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        if layer.value_in is not None:
            raise ValueError("the reference formulation has head_dim == dim")
        self.layer = layer
        self._features: dict = {}

    def _softmax_5d(self, scores: torch.Tensor) -> torch.Tensor:
        """Softmax over the last two (key) dimensions of a (..., H, W) score tensor."""
        shape = scores.shape
        return torch.softmax(scores.reshape(*shape[:-2], -1), dim=-1).reshape(shape)

    def _position_scores(self, h: int, w: int) -> torch.Tensor:
        layer = self.layer
        if isinstance(layer, QuadraticAttention):
            key = (h, w, layer.centers.dtype, layer.centers.device)
            if key not in self._features:
                self._features[key] = _relative_features(h, w, layer.centers.dtype, layer.centers.device)
            inv = layer.inverse_covariance                                            # (N_h, 2, 2)
            mu = torch.einsum("hij,hj->hi", inv, layer.centers)
            v = torch.stack([mu[:, 0], mu[:, 1], -inv[:, 0, 0] / 2, -inv[:, 1, 1] / 2, -inv[:, 0, 1]], dim=-1)
            return torch.einsum("ijklf,hf->ijhkl", self._features[key], v)          # (H, W, N_h, H, W)
        m, device = layer.max_size, layer.row_embeddings.weight.device
        row = layer.head_keys_row(layer.row_embeddings(axis_offsets(h, device) + m - 1))   # (H, H, N_h) [i, k]
        col = layer.head_keys_col(layer.col_embeddings(axis_offsets(w, device) + m - 1))   # (W, W, N_h) [j, l]
        return row.permute(0, 2, 1)[:, None, :, :, None] + col.permute(0, 2, 1)[None, :, :, None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        b, h, w, d = x.shape
        if isinstance(layer, LearnedRelativeContentAttention):
            nh = layer.num_heads
            q = layer.query(x).reshape(b, h, w, nh, d)
            k = layer.key(x).reshape(b, h, w, nh, d)
            scores = torch.einsum("bijhd,bklhd->bijhkl", q, k)                     # (B, H, W, N_h, H, W)
            half, m = d // 2, layer.max_size
            e_row = layer.row_embeddings(axis_offsets(h, x.device) + m - 1)          # (H, H, D/2) [i, k]
            e_col = layer.col_embeddings(axis_offsets(w, x.device) + m - 1)          # (W, W, D/2) [j, l]
            pos_row = torch.einsum("bijhc,ikc->bijhk", q[..., :half], e_row)
            pos_col = torch.einsum("bijhc,jlc->bijhl", q[..., half:], e_col)
            scores = (scores + pos_row[..., :, None] + pos_col[..., None, :]) / math.sqrt(d)
            probs = layer.attn_drop(self._softmax_5d(scores))
            out = torch.einsum("bijhkl,bkld->bijhd", probs, x)                       # (B, H, W, N_h, D)
        else:
            probs = layer.attn_drop(self._softmax_5d(self._position_scores(h, w)))  # (H, W, N_h, H, W)
            out = torch.einsum("ijhkl,bkld->bijhd", probs, x)                        # (B, H, W, N_h, D)
        return layer.value(out.reshape(b, h, w, layer.num_heads * d))


def reference_style_model(model: nn.Module) -> nn.Module:
    """A deep copy of an :class:`~attncnn.models.ImageTransformer` whose attention layers compute
    the reference code's way (same weights)."""
    ref = copy.deepcopy(model)
    for block in ref.blocks:
        block.attention = ReferenceStyleAttention(block.attention)
    return ref
