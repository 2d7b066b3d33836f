"""Mimetic initialisation of content attention (Trockman & Kolter, "Mimetic Initialization of
Self-Attention Layers", ICML 2023, Sec. 3).

Pre-trained vision transformers have ``W_q W_k^T`` close to a positive multiple of the identity
(a token attends to tokens like itself, and through the position embedding to its neighbours) and
``W_v W_o`` close to a negative multiple of it. Mimetic initialisation draws the products that way
and factors them:

* per head ``h``: ``W_q^h W_k^h^T ~= alpha_1 Z_1 + beta_1 I`` (``D x D``), factored by its SVD
  ``U S V^T`` truncated to the head's width ``D_h``: ``W_q^h = U_{:D_h} S^{1/2}``,
  ``W_k^h = V_{:D_h} S^{1/2}``;
* the whole layer: ``W_v W_o ~= alpha_2 Z_2 - beta_2 I`` (``D x D``), ``W_v = U S^{1/2}``,
  ``W_o = S^{1/2} V^T``;

``Z_i`` with independent ``N(0, 1/D)`` entries (a random matrix of spectral norm about 2), query,
key, value and output biases zero. Defaults: ``alpha_1 = beta_1 = 0.7`` and
``alpha_2 = beta_2 = 0.4``, the values the paper uses for its small ViTs on CIFAR-10.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..errors import InputError

if TYPE_CHECKING:
    from .content import QueryKeyAttention

__all__ = ["MIMETIC_QK", "MIMETIC_VO", "mimetic_init_", "mimetic_factors"]

#: ``(alpha_1, beta_1)``: ``W_q W_k^T ~= alpha_1 Z + beta_1 I``
MIMETIC_QK = (0.7, 0.7)
#: ``(alpha_2, beta_2)``: ``W_v W_o ~= alpha_2 Z - beta_2 I``
MIMETIC_VO = (0.4, 0.4)


def mimetic_factors(dim: int, rank: int, alpha: float, beta: float, *,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two ``(dim, rank)`` float64 factors ``L, R`` with ``L R^T`` the best rank-``rank``
    approximation of ``alpha Z + beta I`` (``Z``: ``dim x dim``, entries ``N(0, 1/dim)``).

    Raises:
        InputError: ``rank`` outside ``[1, dim]``, or ``alpha``/``beta`` not finite.
    """
    if not 1 <= rank <= dim:
        raise InputError(f"the factors' rank must be in [1, {dim}], got {rank}")
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise InputError(f"alpha and beta must be finite, got {alpha}, {beta}")
    z = torch.randn(dim, dim, dtype=torch.float64, generator=generator) / math.sqrt(dim)
    u, s, vh = torch.linalg.svd(alpha * z + beta * torch.eye(dim, dtype=torch.float64))
    root = s[:rank].sqrt()
    return u[:, :rank] * root, vh[:rank].T * root


@torch.no_grad()
def mimetic_init_(layer: QueryKeyAttention, *, qk: tuple[float, float] = MIMETIC_QK,
                  vo: tuple[float, float] = MIMETIC_VO, generator: torch.Generator | None = None) -> None:
    """Set ``layer``'s query, key, value and output weights as mimetic initialisation draws them
    (module docstring); every bias they have becomes 0.

    ``nn.Linear`` computes ``x W^T``, so head ``h``'s rows of ``query.weight`` are ``(W_q^h)^T``
    (``D_h x D``); ``value_in.weight = W_v^T`` and ``value.weight = W_o^T``.

    Args:
        layer: a content-family layer (queries and keys from the input) whose heads together are
            as wide as the model and whose output is too (``N_h * D_h == D == D_out``): the value
            product is a ``D x D`` matrix, as in a ViT.
        qk: ``(alpha_1, beta_1)``. vo: ``(alpha_2, beta_2)``.
        generator: the random draws' generator (default: torch's global one, seeded by the run).

    Raises:
        InputError: a layer without queries and keys, or whose value path is not ``D x D``.
    """
    if not (hasattr(layer, "query") and hasattr(layer, "key")):
        raise InputError(f"mimetic init sets queries and keys; {type(layer).__name__} has none (use a content "
                         "attention kind: content, learned-content or gpsa)")
    d, nh, dh = layer.dim, layer.num_heads, layer.head_dim
    if layer.value_in is None or nh * dh != d or layer.out_dim != d:
        raise InputError(f"mimetic init needs heads that together are as wide as the model (num_heads x head_dim "
                         f"= dim, here {nh} x {dh} vs {d}) and out_dim = dim (here {layer.out_dim}): W_v W_o is a "
                         "D x D matrix; set head_dim = dim / num_heads")
    dtype, device = layer.query.weight.dtype, layer.query.weight.device
    for h in range(nh):
        wq, wk = mimetic_factors(d, dh, *qk, generator=generator)                  # (D, D_h) each
        layer.query.weight[h * dh:(h + 1) * dh].copy_(wq.T.to(device=device, dtype=dtype))
        layer.key.weight[h * dh:(h + 1) * dh].copy_(wk.T.to(device=device, dtype=dtype))
    # W_v W_o = alpha_2 Z - beta_2 I: the factors of alpha_2 Z + (-beta_2) I
    wv, wo_t = mimetic_factors(d, d, vo[0], -vo[1], generator=generator)            # W_v, W_o^T
    layer.value_in.weight.copy_(wv.T.to(device=device, dtype=dtype))
    layer.value.weight.copy_(wo_t.to(device=device, dtype=dtype))
    for linear in (layer.query, layer.key, layer.value_in, layer.value):
        if linear.bias is not None:
            linear.bias.zero_()
