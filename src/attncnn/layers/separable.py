"""Exact separable attention: apply a row factor and a column factor instead of an (N x N) map.

When a head's score of query (i, j) and key (k, l) is a row term plus a column term,
``A = row[i, k] + col[j, l]`` (isotropic quadratic heads, paper eq. 9; learned position-only
heads, paper eq. 8 term 4 / PAPER.md 3.3), the softmax over all keys factors exactly:
``P[(i, j), (k, l)] = softmax_k(row[i, :])[k] * softmax_l(col[j, :])[l]``, so the head's average
``sum_{k,l} P[(i,j),(k,l)] v[(k,l)]`` is a product along rows with the (H x H) factor followed by a
product along columns with the (W x W) factor: ``2 N (H + W)`` multiply-adds per value channel
instead of ``2 N^2`` (N = H W; for 16 x 16 tokens, 8x fewer).
"""

from __future__ import annotations

import torch

__all__ = ["flush_below", "separable_mix"]


def flush_below(probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """``probs`` with every entry below ``threshold`` set to exactly 0 (keeps CPU products normal)."""
    return probs.masked_fill(probs < threshold, 0.0)


def separable_mix(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor,
                  dtype: torch.dtype) -> torch.Tensor:
    """Average value vectors with separable attention maps, for the whole batch at once.

    Args:
        rows: row factors ``(N_h, H, H)``, ``rows[h, i, k]`` = probability of key row k for query row i.
        cols: column factors ``(N_h, W, W)``, ``cols[h, j, l]`` likewise for columns.
        values: either the tokens ``(B, H, W, D)``, averaged by every head (``head_dim == dim``),
            or per-head values ``(B, H, W, N_h, D_h)``.
        dtype: dtype of the two matrix products (the factors and values are cast to it once).

    Returns:
        ``(B, H, W, N_h * D_h)``: head h's average in channels ``h*D_h:(h+1)*D_h``, i.e. the
        input of the layer's output map, as ``GridAttention._output`` builds it.

    Both products are large GEMMs over the batch; the factors are never expanded over it.
    The values are laid out ``(H, B, D, W)`` (one copy, fused with the dtype cast), so the row
    product contracts the leading axis and the column product the trailing one:
    row:    ``(N_h*H, H) @ (H, B*D*W)``       (one GEMM; a bmm over heads for per-head values)
    column: ``(N_h, H*B*D, W) @ (N_h, W, W)`` (a bmm over heads with a tall left operand).
    """
    nh, h, _ = rows.shape
    w = cols.shape[-1]
    rows, cols = rows.to(dtype), cols.to(dtype)
    if values.dim() == 4:
        b, d = values.shape[0], values.shape[-1]
        t = values.permute(1, 0, 3, 2).to(dtype=dtype, memory_format=torch.contiguous_format)  # (H, B, D, W)
        y = rows.reshape(nh * h, h) @ t.reshape(h, b * d * w)               # (N_h*H, B*D*W)
    else:
        b, d = values.shape[0], values.shape[-1]
        t = values.permute(3, 1, 0, 4, 2).to(dtype=dtype, memory_format=torch.contiguous_format)  # (N_h, H, B, D_h, W)
        y = torch.bmm(rows, t.reshape(nh, h, b * d * w))                    # (N_h, H, B*D_h*W)
    # z[h, (i, b, d), j] = sum_l y[h, (i, b, d), l] * cols[h, j, l]
    z = torch.bmm(y.reshape(nh, h * b * d, w), cols.transpose(1, 2))        # (N_h, H*B*D, W)
    z = z.view(nh, h, b, d, w)
    return z.permute(2, 1, 4, 0, 3).reshape(b, h, w, nh * d)                # (B, H, W, N_h*D_h)
