"""Property-based tests (hypothesis) of the attention layers on random grids, head counts and dtypes:
probabilities are a distribution, shapes are right, position-only attention is translation-
equivariant away from the borders, and extreme Gaussian centres or spreads give no NaN. On the
``device`` of tests/conftest.py (session-scoped, so hypothesis accepts it); inputs drawn on the CPU."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attncnn.layers import ATTENTION_KINDS, ATTENTION_LAYERS, QuadraticAttention, build_attention

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = st.sampled_from([torch.float32, torch.float64])
POSITIONAL = [k for k in ATTENTION_KINDS if ATTENTION_LAYERS[k].position_only]


def _tol(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-12


def _layer(kind: str, dim: int, heads: int, head_dim, dtype: torch.dtype, seed: int, device="cpu"):
    torch.manual_seed(seed)
    kwargs = {"head_dim": head_dim}
    if kind.startswith("learned"):
        kwargs["max_size"] = 8
    return build_attention(kind, dim, heads, **kwargs).to(device, dtype).eval()


@st.composite
def grids(draw, max_side: int = 8):
    """(H, W) with 1xN, Nx1 and non-square grids all likely."""
    h = draw(st.integers(1, max_side))
    w = draw(st.one_of(st.just(1), st.just(h), st.integers(1, max_side)))
    return (h, w) if draw(st.booleans()) else (w, h)


@SETTINGS
@given(kind=st.sampled_from(ATTENTION_KINDS), grid=grids(), heads=st.integers(1, 4), dim=st.sampled_from([2, 4, 6]),
       head_dim=st.sampled_from([None, 2, 4]), out_batch=st.integers(1, 3), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_probabilities_are_distributions_and_shapes_are_right(kind, grid, heads, dim, head_dim, out_batch, dtype,
                                                              seed, device):
    h, w = grid
    layer = _layer(kind, dim, heads, head_dim, dtype, seed, device)
    x = torch.randn(out_batch, h, w, dim, dtype=dtype, generator=torch.Generator().manual_seed(seed)).to(device)
    with torch.no_grad():
        out, probs = layer(x, return_attention=True)
        fast = layer(x)
    n = h * w
    batch = 1 if layer.position_only else out_batch
    assert out.shape == (out_batch, h, w, dim) and out.dtype == dtype
    assert probs.shape == (batch, heads, n, n) and probs.dtype == dtype
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(batch, heads, n, dtype=dtype, device=device), rtol=0,
                               atol=_tol(dtype) * n)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(fast, out, rtol=1e-4 if dtype == torch.float32 else 1e-10,
                               atol=1e-4 if dtype == torch.float32 else 1e-10)


@SETTINGS
@given(kind=st.sampled_from(ATTENTION_KINDS), grid=grids(), heads=st.integers(1, 3),
       shape=st.sampled_from(["rank2", "rank3", "rank5", "channels"]))
def test_wrong_rank_or_channels_name_the_expected_shape(kind, grid, heads, shape):
    h, w = grid
    layer = _layer(kind, 4, heads, None, torch.float32, 0)
    x = {"rank2": torch.randn(h, 4), "rank3": torch.randn(h, w, 4), "rank5": torch.randn(1, 1, h, w, 4),
         "channels": torch.randn(1, h, w, 5)}[shape]
    with pytest.raises(ValueError, match=r"\(B, H, W, 4\), got shape"):
        layer(x)


@SETTINGS
@given(kind=st.sampled_from(POSITIONAL), grid=grids(max_side=7), heads=st.integers(1, 3),
       shift=st.tuples(st.integers(-2, 2), st.integers(-2, 2)), seed=st.integers(0, 2**16))
def test_positional_scores_depend_only_on_the_relative_shift(kind, grid, heads, shift, seed, device):
    """score(q, k) == score(q + s, k + s) whenever all four positions lie in the grid."""
    h, w = grid
    layer = _layer(kind, 4, heads, None, torch.float64, seed, device)
    with torch.no_grad():
        scores = layer.grid_scores(h, w).reshape(heads, h, w, h, w)
    sy, sx = shift
    rows, cols = range(max(0, -sy), min(h, h - sy)), range(max(0, -sx), min(w, w - sx))
    assume(len(rows) and len(cols))
    r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    a = scores[:, r0:r1, c0:c1, r0:r1, c0:c1]
    b = scores[:, r0 + sy:r1 + sy, c0 + sx:c1 + sx, r0 + sy:r1 + sy, c0 + sx:c1 + sx]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _set_gaussians(layer: QuadraticAttention, centers: torch.Tensor, sharpness: list[float], angles: list[float],
                   full: bool) -> None:
    with torch.no_grad():
        layer.centers.copy_(centers)
        if full:
            for i, (a, theta) in enumerate(zip(sharpness, angles)):
                rot = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
                layer.spreads[i] = rot @ torch.diag(torch.tensor([math.sqrt(2 * a), math.sqrt(4 * a)]))
        else:
            layer.spreads.copy_(torch.tensor([math.sqrt(2 * a) for a in sharpness]))


@SETTINGS
@given(full=st.booleans(), size=st.tuples(st.integers(12, 16), st.integers(12, 16)), heads=st.integers(1, 4),
       data=st.data(), shift=st.tuples(st.integers(-2, 2), st.integers(-2, 2)), seed=st.integers(0, 2**16))
def test_quadratic_attention_is_translation_equivariant_away_from_the_borders(full, size, heads, data, shift, seed,
                                                                             device):
    """Shifting the input shifts the output, for queries whose Gaussian lies well inside the grid
    before and after the shift (alpha >= 4 and a margin of 3 tokens: outside mass < e^-36)."""
    h, w = size
    centers = torch.tensor(data.draw(st.lists(st.tuples(st.floats(-1.5, 1.5), st.floats(-1.5, 1.5)),
                                              min_size=heads, max_size=heads)), dtype=torch.float64)
    sharpness = data.draw(st.lists(st.floats(4.0, 50.0), min_size=heads, max_size=heads))
    angles = data.draw(st.lists(st.floats(0.0, math.pi), min_size=heads, max_size=heads))
    layer = QuadraticAttention(6, heads, full_covariance=full).double().eval()
    _set_gaussians(layer, centers, sharpness, angles, full)
    layer.to(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, h, w, 6, dtype=torch.float64, generator=g)
    sy, sx = shift
    shifted = torch.randn(2, h, w, 6, dtype=torch.float64, generator=g)   # arbitrary where nothing maps
    shifted[:, max(sy, 0):h + min(sy, 0), max(sx, 0):w + min(sx, 0)] = \
        x[:, max(-sy, 0):h + min(-sy, 0), max(-sx, 0):w + min(-sx, 0)]
    x, shifted = x.to(device), shifted.to(device)
    with torch.no_grad():
        out, out_shifted = layer(x), layer(shifted)
    reach = 3 + 2        # margin + |centre| rounded up
    rows = [i for i in range(h) if reach <= i and i + reach < h and reach <= i + sy and i + sy + reach < h]
    cols = [j for j in range(w) if reach <= j and j + reach < w and reach <= j + sx and j + sx + reach < w]
    assume(rows and cols)
    r, c = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
    torch.testing.assert_close(out_shifted[:, r + sy][:, :, c + sx], out[:, r][:, :, c], rtol=1e-9, atol=1e-9)


EXTREME_CENTRE = st.one_of(st.floats(-1e4, 1e4), st.sampled_from([0.0, 1e4, -1e4, 0.5, 1e-30]))
EXTREME_SPREAD = st.one_of(st.sampled_from([0.0, 1e-30, 1e-8, 1e-3, 1e2, 1e3, 3e3]), st.floats(0.0, 3e3))


@SETTINGS
@given(full=st.booleans(), grid=grids(max_side=9), heads=st.integers(1, 3), dtype=DTYPES, data=st.data())
def test_no_nan_for_extreme_centres_and_spreads(full, grid, heads, dtype, data, device):
    """alpha -> 0 (uniform attention), alpha very large (one-hot), centres far outside the grid."""
    h, w = grid
    layer = QuadraticAttention(4, heads, full_covariance=full).to(device, dtype).eval()
    centers = data.draw(st.lists(st.tuples(EXTREME_CENTRE, EXTREME_CENTRE), min_size=heads, max_size=heads))
    shape = (heads, 2, 2) if full else (heads,)
    spreads = data.draw(st.lists(EXTREME_SPREAD, min_size=math.prod(shape), max_size=math.prod(shape)))
    with torch.no_grad():
        layer.centers.copy_(torch.tensor(centers, dtype=dtype))
        layer.spreads.copy_(torch.tensor(spreads, dtype=dtype).reshape(shape))
    x = torch.randn(2, h, w, 4, dtype=dtype).to(device)
    with torch.no_grad():
        out, probs = layer(x, return_attention=True)
    n = h * w
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, heads, n, dtype=dtype, device=device), rtol=0,
                               atol=_tol(dtype) * n)
    assert torch.isfinite(out).all()
    # and the gradients that training would take stay finite too
    layer.train()
    loss = layer(x.requires_grad_()).square().mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_alpha_limits_give_uniform_and_one_hot_attention(full, dtype, device):
    """alpha = 0: every key equally likely; alpha huge and an integer centre: one-hot at q + centre."""
    h, w = 5, 7
    layer = QuadraticAttention(4, 1, full_covariance=full).to(device, dtype)
    with torch.no_grad():
        layer.centers.copy_(torch.tensor([[1.0, -2.0]], dtype=dtype))
        layer.spreads.zero_()
        uniform = layer.grid_probs(h, w)[0, 0]
        layer.spreads.copy_(torch.full_like(layer.spreads, 1e3) if not full else
                            1e3 * torch.eye(2, dtype=dtype, device=device)[None])
        sharp = layer.grid_probs(h, w)[0, 0]
    torch.testing.assert_close(uniform, torch.full_like(uniform, 1 / (h * w)))
    q = 1 * w + 3                                # query (1, 3) -> key (2, 1)
    assert sharp[q, 2 * w + 1] == 1.0 and sharp[q].sum() == 1.0
    assert torch.isfinite(sharp).all()
