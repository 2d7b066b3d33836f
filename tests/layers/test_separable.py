"""Exact separable attention (isotropic quadratic and learned position-only heads): the row and
column factors reproduce the dense map, and the separable path reproduces the dense path,
outputs and gradients, on square and non-square grids. On the ``device`` of tests/conftest.py
(inputs drawn on the CPU, then moved); which path a layer takes is device-independent, checked on the CPU."""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import LearnedRelativeAttention, QuadraticAttention, build_attention

D, NH, B = 8, 3, 2
GRIDS = [(5, 7), (8, 8), (16, 16)]


def _layer(kind: str, dtype=torch.float64, device="cpu", **kwargs):
    torch.manual_seed(0)
    extra = {"max_size": 16} if kind == "learned" else {}
    layer = build_attention(kind, D, NH, **extra, **kwargs).to(dtype).eval()
    if isinstance(layer, QuadraticAttention) and not layer.full_covariance:
        with torch.no_grad():          # one head near the grid's edge, one sharp, one broad
            layer.centers.copy_(torch.tensor([[0.0, 1.0], [-1.3, 0.4], [2.0, -2.5]], dtype=dtype))
            layer.spreads.copy_(torch.tensor([1.3, 3.0, 0.5], dtype=dtype))
    return layer.to(device)


def _both_paths(layer, x, weight):
    """Output and gradients (input and every parameter) of the separable and the dense path."""
    results = []
    for separable in (True, False):
        layer.impl = "separable" if separable else "dense"
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        out = layer(xg)
        (out * weight).sum().backward()
        grads = {"x": xg.grad, **{n: p.grad for n, p in layer.named_parameters()}}
        results.append((out.detach(), grads))
    return results


@pytest.mark.parametrize("kind", ["quadratic", "learned"])
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("head_dim", [None, 6])
def test_separable_path_equals_dense_path_in_float64(kind, grid, head_dim, device):
    layer = _layer(kind, device=device, head_dim=head_dim)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, *grid, D, dtype=torch.float64, generator=g).to(device)
    weight = torch.randn(B, *grid, layer.out_dim, dtype=torch.float64, generator=g).to(device)
    (sep, sep_grads), (dense, dense_grads) = _both_paths(layer, x, weight)
    assert (sep - dense).abs().max() <= 1e-12 * dense.abs().max()
    for name, expected in dense_grads.items():
        assert expected is not None and sep_grads[name] is not None, name
        assert (sep_grads[name] - expected).abs().max() <= 1e-10 * expected.abs().max(), name


@pytest.mark.parametrize("kind", ["quadratic", "learned"])
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-15), (torch.float32, 1e-6)])
def test_outer_product_of_the_factors_is_the_dense_map(kind, grid, dtype, tol, device):
    layer = _layer(kind, dtype=dtype, device=device)
    h, w = grid
    with torch.no_grad():
        row, col = layer.axis_probs(h, w)
        dense = layer.grid_probs(h, w)[0]
        s_row, s_col = layer.axis_scores(h, w)
    assert row.shape == (NH, h, h) and col.shape == (NH, w, w) and row.dtype == col.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(row.sum(-1), torch.ones(NH, h, dtype=dtype, device=device), rtol=0, atol=h * eps)
    torch.testing.assert_close(col.sum(-1), torch.ones(NH, w, dtype=dtype, device=device), rtol=0, atol=w * eps)
    outer = torch.einsum("hik,hjl->hijkl", row, col).reshape(NH, h * w, h * w)
    torch.testing.assert_close(outer, dense, rtol=0, atol=tol)
    summed = (s_row[:, :, None, :, None] + s_col[:, None, :, None, :]).reshape(NH, h * w, h * w)
    torch.testing.assert_close(summed, layer.grid_scores(h, w), rtol=1e-12 if dtype == torch.float64 else 1e-6,
                               atol=0)


def test_factor_entries_below_eps_are_zero_and_outputs_move_by_at_most_h_plus_w_eps(device):
    """The separable path's flush (see axis_probs): no factor entry lies in (0, eps), and the
    output differs from the unflushed float64 computation by <= (H + W) eps max|value| (+ rounding)."""
    layer = _layer("quadratic", dtype=torch.float32, device=device)
    with torch.no_grad():
        layer.spreads.fill_(2.0)                                       # alpha = 2: far keys ~ e^-450
        row, col = layer.axis_probs(16, 16)
        eps = torch.finfo(torch.float32).eps
        for factor in (row, col):
            assert ((factor > 0) & (factor < eps)).sum() == 0 and (factor == 0).sum() > 100
        x = torch.randn(B, 16, 16, D).to(device)
        layer.impl = "separable"
        out = layer(x)
        exact = layer.double().output(torch.softmax(layer.grid_scores(16, 16), -1) @ x.double()[:, None]
                                       .reshape(B, 1, 256, D), B, 16, 16)
    bound = (16 + 16) * eps * x.abs().max() * layer.value.weight.abs().sum(-1).max() + 1e-5 * exact.abs().max()
    assert (out.double() - exact).abs().max() <= bound


class _Spy:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _path_taken(layer, x, **kwargs) -> str:
    """'separable' or 'dense', from which of axis_probs / grid_probs the forward called; checks
    that the layer's own ``path`` (what a run records) names the same one."""
    layer.axis_probs, layer.grid_probs = _Spy(layer.axis_probs), _Spy(layer.grid_probs)
    try:
        layer(x, **kwargs)
        taken = (layer.axis_probs.calls, layer.grid_probs.calls)
    finally:
        del layer.axis_probs, layer.grid_probs
    assert taken in ((1, 0), (0, 1))
    path = "separable" if taken == (1, 0) else "dense"
    if not kwargs.get("return_attention"):
        assert layer.path(x.shape[1], x.shape[2]) == path
    return path


@pytest.mark.parametrize("kind", ["quadratic", "learned"])
def test_which_path_the_forward_takes(kind):
    layer = _layer(kind, dtype=torch.float32, attn_drop=0.1)
    x16, x8 = torch.randn(B, 16, 16, D), torch.randn(B, 8, 8, D)
    assert layer.is_separable
    assert _path_taken(layer.eval(), x16) == "separable"                  # no dropout in eval
    assert _path_taken(layer.train(), x16) == "dense"                     # dropout on the (N, N) map
    assert _path_taken(layer.eval(), x16, return_attention=True) == "dense"
    assert _path_taken(layer, x8) == "dense"                              # 64 < 6 (8 + 8): measured slower
    layer.impl = "separable"
    assert _path_taken(layer, x8) == "separable"
    assert _path_taken(layer.train(), x8) == "dense"                      # forcing never drops dropout
    layer.impl = "dense"
    assert _path_taken(layer.eval(), x16) == "dense"
    no_drop = _layer(kind, dtype=torch.float32, attn_drop=0.0).train()
    assert _path_taken(no_drop, x16) == "separable"                       # training, attn_drop = 0


def test_full_covariance_heads_are_dense_only():
    layer = _layer("quadratic-generalized", dtype=torch.float32)
    assert layer.impls == ("auto", "dense", "folded")
    with pytest.raises(ValueError, match="quadratic-generalized attention has no impl 'separable'; choose one of "
                                         "auto, dense"):
        layer.impl = "separable"
    assert not layer.is_separable
    assert _path_taken(layer, torch.randn(B, 16, 16, D)) == "dense"
    with pytest.raises(ValueError, match="not separable"):
        layer.axis_probs(4, 4)
    with pytest.raises(ValueError, match="not separable"):
        layer.axis_scores(4, 4)


def test_learned_axis_probs_reject_grids_larger_than_the_tables():
    layer = LearnedRelativeAttention(D, 2, max_size=4)
    with pytest.raises(ValueError, match="max_size >= 6"):
        layer.axis_probs(3, 6)
