"""Scores of content attention through the query-key bilinear form, without forming the queries.

Paper eq. 8 writes the content score as a bilinear form of the two tokens, ``x_i W_qry W_key^T
x_j^T``. Every term of a content layer's score is a query dotted with some vector ``c`` (a key
``W_key x_j + b_key``, or a relative-position vector ``r_delta``), so each term is
``x_i . (W_qry^T c) + b_qry . c``: :func:`fold_query_map` folds the query map into the ``K``
vectors a head's queries meet, and one matrix product of the tokens gives every head's products
at once. With heads as wide as the model this saves the key map's cost; with narrow heads it
costs more.

It is exact: the same scores, term for term (the per-query constant ``q_i . b_key`` included). In
bf16 the rounding moves (the folded map is built in float32 and rounded once; tests bound both
paths' errors against float64).
"""

from __future__ import annotations

import torch
from torch import nn

from .autocast_rules import autocast_off, score_dtype

__all__ = ["fold_query_map"]


def fold_query_map(query: nn.Linear, vectors: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The map of tokens to every head's products with ``vectors``, the queries folded in.

    ``(x W + b)[n, h*K + k] = scale * q_h(x_n) . vectors[h, :, k]`` with ``q_h(x) = W_qry,h x + b_qry,h``
    (``query``'s rows ``h*D_h:(h+1)*D_h``).

    Args:
        query: the layer's query map ``D -> N_h*D_h``.
        vectors: ``(N_h, D_h, K)``, the vectors each head's queries are dotted with.
        scale: applied to every product (the layer's ``1 / sqrt(D_h)``).

    Returns:
        ``(W, b)``: ``W (D, N_h*K)`` and ``b (N_h*K,)`` (None when ``query`` has no bias), in float32
        at least, computed with autocast off (the matrix product that applies them rounds them once).
    """
    nh, dh, k = vectors.shape
    with autocast_off(vectors.device):
        dtype = score_dtype(query.weight.dtype)
        weight = query.weight.to(dtype).view(nh, dh, -1) * scale                         # (N_h, D_h, D)
        vectors = vectors.to(dtype)
        folded = torch.bmm(weight.transpose(1, 2), vectors)                               # (N_h, D, K)
        folded = folded.permute(1, 0, 2).reshape(weight.shape[-1], nh * k)
        if query.bias is None:
            return folded, None
        bias = torch.bmm(query.bias.to(dtype).view(nh, 1, dh) * scale, vectors)           # (N_h, 1, K)
        return folded, bias.reshape(nh * k)
