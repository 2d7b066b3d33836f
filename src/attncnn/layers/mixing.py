"""The value-mixing products every attention family calls: probabilities times value vectors.

Three shapes of probabilities, three products (all exact; tests compare them with the plain
``probs @ values`` of the explicit path):

* :func:`mix_shared`: one map per head ``(N_h, N, N)`` for the whole batch (position-only
  attention, GPSA's positional part). Applied as one large matrix product over the batch, never
  expanded over it (DESIGN.md: position-only attention does not depend on the input).
* :func:`mix_per_image`: a map per image and head ``(B, N_h, N, N)`` (content attention, GPSA's
  gated map).
* :func:`separable_mix`: a row factor ``(N_h, H, H)`` and a column factor ``(N_h, W, W)`` whose
  product is the map. When a head's score of query (i, j) and key (k, l) is a row term plus a
  column term, ``A = row[i, k] + col[j, l]`` (isotropic quadratic heads, paper eq. 9; learned
  position-only heads, paper eq. 8 term 4 / PAPER.md 3.3), the softmax over all keys factors
  exactly: ``P[(i, j), (k, l)] = softmax_k(row[i, :])[k] * softmax_l(col[j, :])[l]``, so a head's
  average is a product along rows followed by one along columns: ``2 N (H + W)`` multiply-adds
  per value channel instead of ``2 N^2`` (N = H W; 8x fewer for 16 x 16 tokens).

Values come either as the tokens themselves ``(B, H, W, D)`` (heads as wide as the model,
``head_dim == dim``: every head averages the same tokens, which are then never copied per head)
or as per-head values from a value projection. :func:`flush_below` zeroes the tiny probabilities
that would make CPU products subnormal (see the position-only layers' ``grid_probs``).
"""

from __future__ import annotations

import torch

__all__ = ["flush_below", "mix_explicit", "mix_shared", "mix_per_image", "separable_mix"]


def flush_below(probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """``probs`` with every entry below ``threshold`` set to exactly 0 (keeps CPU products normal)."""
    return probs.masked_fill(probs < threshold, 0.0)


def mix_explicit(probs: torch.Tensor, tokens: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
    """The plain product ``probs @ values`` of the explicit path (the reference the others equal).

    Args:
        probs: ``(B or 1, N_h, N, N)`` in the product dtype.
        tokens: the grid ``(B, H, W, D)``, broadcast to every head (a view) when ``values`` is None.
        values: per-head values ``(B, N_h, N, D_h)``, or None.

    Returns:
        ``(B, N_h, N, D_h)``.
    """
    if values is None:
        b, h, w, d = tokens.shape
        values = tokens.reshape(b, 1, h * w, d).expand(b, probs.shape[1], h * w, d)
    return probs @ values


def mix_shared(probs: torch.Tensor, tokens: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
    """Batch-shared maps applied to the whole batch as one matrix product.

    Args:
        probs: ``(N_h, N, N)`` in the product dtype (queries on dim -2, keys on dim -1).
        tokens: the grid ``(B, H, W, D)``; averaged by every head when ``values`` is None.
        values: per-head values ``(B, N_h, N, D_h)`` (any dtype), or None.

    Returns:
        ``(B, N_h, N, D_h)`` head averages (``D_h = D`` without ``values``), in ``probs.dtype``.
    """
    nh, n, _ = probs.shape
    b = tokens.shape[0]
    if values is None:
        d = tokens.shape[-1]
        # Stack the heads' maps into one (N_h*N, N) matrix and multiply the (N, B*D) token
        # matrix once. The copy that puts tokens first also casts them (one pass, not two).
        t = tokens.reshape(b, n, d).transpose(0, 1).to(dtype=probs.dtype, memory_format=torch.contiguous_format)
        mixed = (probs.reshape(nh * n, n) @ t.reshape(n, b * d)).reshape(nh, n, b, d)      # (N_h, N, B, D)
    else:
        dh = values.shape[-1]
        v = values.to(probs.dtype).permute(1, 2, 0, 3).reshape(nh, n, b * dh)             # (N_h, N, B*D_h)
        mixed = torch.bmm(probs, v).reshape(nh, n, b, dh)                                  # (N_h, N, B, D_h)
    return mixed.permute(2, 0, 1, 3)                                                       # (B, N_h, N, D_h)


def mix_per_image(probs: torch.Tensor, tokens: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
    """Per-image maps applied to each image's values.

    Args:
        probs: ``(B, N_h, N, N)`` in the product dtype.
        tokens: the grid ``(B, H, W, D)``; averaged by every head when ``values`` is None.
        values: per-head values ``(B, N_h, N, D_h)`` (any dtype), or None.

    Returns:
        ``(B, N_h, N, D_h)`` head averages, in ``probs.dtype``.
    """
    b, nh, n, _ = probs.shape
    if values is None:
        # every head averages the same tokens: one (N_h*N, N) @ (N, D) product per image
        d = tokens.shape[-1]
        mixed = torch.bmm(probs.reshape(b, nh * n, n), tokens.reshape(b, n, d).to(probs.dtype))
        return mixed.view(b, nh, n, d)
    return probs @ values.to(probs.dtype)


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
        input of the layer's output map (the layout ``GridAttention.output`` builds).

    Both products are large GEMMs over the batch; the factors are never expanded over it.
    The values are laid out ``(H, B, D, W)`` (one copy, fused with the dtype cast), so the row
    product contracts the leading axis and the column product the trailing one:
    row:    ``(N_h*H, H) @ (H, B*D*W)``       (one GEMM; a bmm over heads for per-head values)
    column: ``(N_h, H*B*D, W) @ (N_h, W, W)`` (a bmm over heads with a tall left operand).
    """
    nh, h, _ = rows.shape
    w = cols.shape[-1]
    rows, cols = rows.to(dtype), cols.to(dtype)
    b, d = values.shape[0], values.shape[-1]
    if values.dim() == 4:
        t = values.permute(1, 0, 3, 2).to(dtype=dtype, memory_format=torch.contiguous_format)  # (H, B, D, W)
        y = rows.reshape(nh * h, h) @ t.reshape(h, b * d * w)               # (N_h*H, B*D*W)
    else:
        t = values.permute(3, 1, 0, 4, 2).to(dtype=dtype, memory_format=torch.contiguous_format)  # (N_h, H, B, D_h, W)
        y = torch.bmm(rows, t.reshape(nh, h, b * d * w))                    # (N_h, H, B*D_h*W)
    # z[h, (i, b, d), j] = sum_l y[h, (i, b, d), l] * cols[h, j, l]
    z = torch.bmm(y.reshape(nh, h * b * d, w), cols.transpose(1, 2))        # (N_h, H*B*D, W)
    z = z.view(nh, h, b, d, w)
    return z.permute(2, 1, 4, 0, 3).reshape(b, h, w, nh * d)                # (B, H, W, N_h*D_h)
