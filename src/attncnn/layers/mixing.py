"""The value-mixing products every attention family calls: probabilities times value vectors.

Three shapes of probabilities, three products (all exact; tests compare them with the plain
``probs @ values`` of the explicit path):

* :func:`mix_shared`: one map per head ``(N_h, N, N)`` for the whole batch (position-only
  attention, GPSA's positional part), never expanded over the batch.
* :func:`mix_per_image`: a map per image and head ``(B, N_h, N, N)`` (content attention, GPSA's
  gated map).
* :func:`separable_mix`: a row factor ``(N_h, H, H)`` and a column factor ``(N_h, W, W)``. When a
  head's score is a row term plus a column term (isotropic quadratic heads, paper eq. 9; learned
  position-only heads, eq. 8 term 4), the softmax factors exactly:
  ``P[(i, j), (k, l)] = softmax_k(row[i, :])[k] * softmax_l(col[j, :])[l]``, so a head's average
  is a product along rows then one along columns (``2 N (H + W)`` multiply-adds per channel
  instead of ``2 N^2``).

Values come either as the tokens themselves ``(B, H, W, D)`` (``head_dim == dim``) or as per-head
values from a value projection. :func:`flush_below` zeroes the tiny probabilities that would make
CPU products subnormal.
"""

from __future__ import annotations

import torch

__all__ = ["flush_below", "folded_mix", "mix_explicit", "mix_shared", "mix_per_image", "separable_mix"]


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


class _FoldedMix(torch.autograd.Function):
    """Autograd of :func:`folded_mix`: every product a plain 2-D matrix product over the whole
    batch, and no full-size tensor ever permuted (the point of the path)."""

    @staticmethod
    def forward(ctx, probs, tokens, weight, bias, dtype):
        with torch.autocast(tokens.device.type, enabled=False):      # the dtypes are chosen here
            return _FoldedMix._forward(ctx, probs, tokens, weight, bias, dtype)

    @staticmethod
    def _forward(ctx, probs, tokens, weight, bias, dtype):
        nh, n, _ = probs.shape
        b, d = tokens.shape[0], tokens.shape[-1]
        dout = weight.shape[0]
        # token-major tokens (N*B, D): the copy that puts tokens first also casts them (one pass)
        x = tokens.reshape(b, n, d).transpose(0, 1).to(dtype=dtype, memory_format=torch.contiguous_format)
        x = x.reshape(n * b, d)                 # a view after a cast; the copy when no cast was needed
        w = weight.to(dtype).view(dout, nh, d)                      # W_h = w[:, h]: (D_out, D)
        if torch.compiler.is_compiling():
            # one batched product writes v itself, where inductor turns out= products into one per
            # head and a copy (benchmarks/results/HISTORY.md, "The folded path, compiled")
            v = torch.bmm(x.unsqueeze(0).expand(nh, n * b, d), w.permute(1, 2, 0))
        else:
            v = x.new_empty(nh, n * b, dout)                            # V_h = x W_h^T, head-major
            for h in range(nh):
                torch.mm(x, w[:, h].t(), out=v[h])
        p = probs.to(dtype).transpose(0, 1).reshape(n, nh * n)      # [query, (head, key)]
        v2 = v.view(nh * n, b * dout)                               # [(head, key), (image, channel)]
        if bias is None:
            y = p @ v2
        else:                                                       # bias added inside the product
            y = torch.addmm(bias.to(dtype).repeat(b), p, v2)
        ctx.save_for_backward(p, x, w, v)
        ctx.shapes = (tokens.shape, tokens.dtype, weight.dtype, None if bias is None else bias.dtype)
        out = torch.empty(b, n, dout, dtype=dtype, device=y.device)
        out.copy_(y.view(n, b, dout).transpose(0, 1))               # (N, B, D_out) -> (B, N, D_out): small
        return out.view(*tokens.shape[:-1], dout)

    @staticmethod
    def backward(ctx, grad):
        p, x, w, v = ctx.saved_tensors
        token_shape, token_dtype, weight_dtype, bias_dtype = ctx.shapes
        dout, nh, d = w.shape
        n = p.shape[0]
        b = token_shape[0]
        g = grad.reshape(b, n, dout)
        gt = g.to(p.dtype).transpose(0, 1).contiguous().view(n, b * dout)      # (N, B*D_out): small
        g_probs = g_tokens = g_weight = g_bias = None
        if ctx.needs_input_grad[0]:
            g_p = gt @ v.view(nh * n, b * dout).t()                            # (N, N_h*N)
            g_probs = g_p.view(n, nh, n).transpose(0, 1)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            gv = (p.t() @ gt).view(nh, n * b, dout)                            # dL/dV_h
            if ctx.needs_input_grad[1]:
                gx = torch.mm(gv[0], w[:, 0])
                for h in range(1, nh):
                    gx.addmm_(gv[h], w[:, h])                                  # sum_h dL/dV_h W_h
                g_tokens = gx.view(n, b, d).transpose(0, 1).to(token_dtype).reshape(token_shape)
            if ctx.needs_input_grad[2]:
                # dL/dW_h = dL/dV_h^T x, transposed so the long contraction reads rows (faster eager)
                if torch.compiler.is_compiling():
                    # compiled, the transposed copy of x would cost more than it saves
                    g_w = torch.stack([gv[h].t() @ x for h in range(nh)])      # (N_h, D_out, D)
                    g_weight = g_w.permute(1, 0, 2).reshape(dout, nh * d).to(weight_dtype)
                else:
                    xt = x.t().contiguous()                                        # (D, N*B)
                    g_w = torch.stack([xt @ gv[h] for h in range(nh)])             # (N_h, D, D_out)
                    g_weight = g_w.permute(2, 0, 1).reshape(dout, nh * d).to(weight_dtype)
        if bias_dtype is not None and ctx.needs_input_grad[3]:
            g_bias = g.sum(dim=(0, 1), dtype=torch.promote_types(g.dtype, torch.float32)).to(bias_dtype)
        return g_probs, g_tokens, g_weight, g_bias, None


def folded_mix(probs: torch.Tensor, tokens: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor:
    """Batch-shared maps and the output map of full-width heads, output map first (Lemma 1's
    folded matrices): ``y = sum_h P_h (x W_h^T) + b`` with ``W_h = weight[:, h*D:(h+1)*D]``.

    The same sum as ``value(mix_shared(...))``, with operands laid out so that no per-head average
    ``(B, N, N_h*D)`` is formed or permuted.

    Args:
        probs: ``(N_h, N, N)`` maps in ``dtype`` (queries on dim -2), shared by the batch.
        tokens: the grid ``(B, H, W, D)`` with ``H*W = N``, any float dtype (cast to ``dtype`` once).
        weight: ``(D_out, N_h*D)`` the ``value`` map's weight; bias: ``(D_out,)`` or None.
        dtype: dtype of the products (autocast's, or the tokens' own).

    Returns:
        ``(B, H, W, D_out)`` in ``dtype``; only the order of the sums differs from
        ``value(mix_shared(...))``; under bf16 the input gradient sums the heads' products in bf16.
        The ``value`` module is not called (its hooks do not fire).
    """
    return _FoldedMix.apply(probs, tokens, weight, bias, dtype)
