"""Mimetic initialisation (Trockman & Kolter 2023): the factors against the matrices they factor,
the layer's weights, the scores it starts with, and the configurations it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from attncnn.errors import InputError
from attncnn.layers import MIMETIC_QK, MIMETIC_VO, build_attention, mimetic_factors, mimetic_init_
from attncnn.models import ImageTransformer, ImageTransformerConfig


def _target(dim, alpha, beta, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(dim, dim, dtype=torch.float64, generator=g) / math.sqrt(dim)
    return alpha * z + beta * torch.eye(dim, dtype=torch.float64)


def test_full_rank_factors_multiply_back_to_the_drawn_matrix():
    left, right = mimetic_factors(12, 12, 0.4, -0.4, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(left @ right.T, _target(12, 0.4, -0.4, 3), atol=1e-12, rtol=0)


def test_truncated_factors_are_the_best_low_rank_approximation():
    m = _target(16, 0.7, 0.7, 5)
    left, right = mimetic_factors(16, 4, 0.7, 0.7, generator=torch.Generator().manual_seed(5))
    s = torch.linalg.svdvals(m)
    # Eckart-Young: the error's spectral norm is the first singular value left out
    assert math.isclose(torch.linalg.matrix_norm(m - left @ right.T, ord=2).item(), s[4].item(), rel_tol=1e-9)


def _layer(kind="content", dim=24, heads=3):
    torch.manual_seed(0)
    return build_attention(kind, dim, heads, head_dim=dim // heads)


def test_the_layer_holds_the_factors_head_by_head_and_zero_biases():
    layer = _layer()
    g = torch.Generator().manual_seed(11)
    mimetic_init_(layer, generator=g)
    g = torch.Generator().manual_seed(11)
    d, dh = 24, 8
    for h in range(3):
        wq, wk = mimetic_factors(d, dh, *MIMETIC_QK, generator=g)
        rows = slice(h * dh, (h + 1) * dh)
        assert torch.allclose(layer.query.weight[rows].double(), wq.T, atol=1e-6)
        assert torch.allclose(layer.key.weight[rows].double(), wk.T, atol=1e-6)
    # x -> value(value_in(x)) is x (alpha_2 Z - beta_2 I), the same draw
    vo = layer.value_in.weight.double().T @ layer.value.weight.double().T
    assert torch.allclose(vo, _target_after(g_seed=11, heads=3, dim=d, head_dim=dh), atol=1e-5)
    for linear in (layer.query, layer.key, layer.value_in, layer.value):
        assert torch.count_nonzero(linear.bias) == 0


def _target_after(g_seed, heads, dim, head_dim):
    """The value product's matrix: the draw that follows the heads' query-key draws."""
    g = torch.Generator().manual_seed(g_seed)
    for _ in range(heads):
        torch.randn(dim, dim, dtype=torch.float64, generator=g)
    z = torch.randn(dim, dim, dtype=torch.float64, generator=g) / math.sqrt(dim)
    return MIMETIC_VO[0] * z - MIMETIC_VO[1] * torch.eye(dim, dtype=torch.float64)


def test_a_token_scores_itself_above_other_tokens_at_the_start():
    layer = _layer(dim=72, heads=9)
    mimetic_init_(layer, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 6, 6, 72, generator=torch.Generator().manual_seed(1))
    q, k = layer.queries_keys(x)
    scores = q @ k.transpose(-1, -2)                                        # (B, N_h, N, N)
    diag = scores.diagonal(dim1=-2, dim2=-1).mean()
    off = (scores.sum((-1, -2)) - scores.diagonal(dim1=-2, dim2=-1).sum(-1)).mean() / (36 * 35)
    # E[x^T (aZ + bI)_rank-k x] grows with b |x|^2 ; independent tokens score about 0
    assert diag > 10 * off.abs() and diag > 1.0


def test_a_deit_style_model_starts_mimetic_and_the_refusals_name_the_fix():
    cfg = ImageTransformerConfig(attention="content", num_layers=2, num_heads=9, dim=72, head_dim=8, mlp_dim=16,
                                 init="mimetic")
    model = ImageTransformer(cfg)
    vo = model.blocks[0].attention.value_in.weight.T @ model.blocks[0].attention.value.weight.T
    assert vo.diagonal().mean() < -0.3                      # about -beta_2 = -0.4
    with pytest.raises(InputError, match="content kind"):
        ImageTransformerConfig(attention="quadratic", num_layers=1, num_heads=9, dim=72, head_dim=8, init="mimetic")
    with pytest.raises(InputError, match="head_dim=8"):
        ImageTransformerConfig(attention="content", num_layers=1, num_heads=9, dim=72, init="mimetic")
    with pytest.raises(InputError, match="queries and keys"):
        mimetic_init_(build_attention("quadratic", 16, 4))
