"""Lemma 2 (PAPER.md 1.3): finite alpha, off-target mass, and the output-error bound."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attncnn.theory import attention_from_conv1d, attention_from_conv2d, lemma2_bound, off_target_mass

ALPHAS = (0.5, 1.0, 2.0, 4.0, 8.0)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_off_target_mass_matches_the_layer(alpha):
    """m(alpha) is the exact mass off the target for a query far from the grid's edge."""
    module = attention_from_conv2d(torch.zeros(1, 1, 3, 3, dtype=torch.float64), alpha=alpha)
    n = 25
    probs = module.attention.grid_probs(n, n)[0]
    q = (n // 2) * n + n // 2
    for h, (dr, dc) in enumerate([(-1, -1), (0, 0), (1, 0)]):
        head = dr * 3 + dc + 4
        measured = 1.0 - probs[head, q, q + dr * n + dc].item()
        assert measured == pytest.approx(off_target_mass(alpha), rel=1e-12, abs=1e-15)
    # 1-D: K heads on a one-row grid.
    module = attention_from_conv1d(torch.zeros(1, 1, 3, dtype=torch.float64), alpha=alpha)
    probs = module.attention.grid_probs(1, n)[0]
    measured = 1.0 - probs[2, n // 2, n // 2 + 1].item()
    assert measured == pytest.approx(off_target_mass(alpha, spatial_dims=1), rel=1e-12, abs=1e-15)


def test_off_target_mass_asymptotics_and_errors():
    for alpha in (20.0, 40.0):
        assert off_target_mass(alpha) == pytest.approx(4 * math.exp(-alpha), rel=1e-6)
        assert off_target_mass(alpha, 1) == pytest.approx(2 * math.exp(-alpha), rel=1e-6)
    assert off_target_mass(1000.0) == 0.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="alpha"):
            off_target_mass(bad)
    with pytest.raises(ValueError, match="spatial_dims"):
        off_target_mass(1.0, spatial_dims=3)


@pytest.mark.parametrize("k, dilation, padding", [(3, 1, "same"), (5, 2, "valid")])
def test_measured_error_stays_under_the_bound_and_falls_exponentially(test_images, k, dilation, padding):
    x = test_images[:4, :, :20, :20]
    gen = torch.Generator().manual_seed(k)
    weight = torch.randn(8, 3, k, k, generator=gen, dtype=torch.float64) / k
    bias = torch.randn(8, generator=gen, dtype=torch.float64)
    pad = (k // 2) * dilation if padding == "same" else 0
    ref = F.conv2d(x, weight, bias, padding=pad, dilation=dilation).permute(0, 2, 3, 1)
    errors = []
    for alpha in ALPHAS:
        module = attention_from_conv2d(weight, bias=bias, alpha=alpha, dilation=dilation, padding=padding)
        x_last = x.permute(0, 2, 3, 1)
        with torch.no_grad():
            err = (module(x_last) - ref).abs().max().item()
        bound = lemma2_bound(module, x_last)
        assert bound.off_target_mass == pytest.approx([off_target_mass(alpha)] * (k * k), rel=1e-12)
        assert err <= bound.output_bound
        errors.append(err)
    # Strictly falling, and exponentially: log(error) is linear in alpha with slope about -1
    # (the nearest competing keys sit at squared distance 1, weight exp(-alpha)).
    assert all(b < a for a, b in zip(errors, errors[1:]))
    slopes = [(math.log(errors[i + 1]) - math.log(errors[i])) / (ALPHAS[i + 1] - ALPHAS[i]) for i in (2, 3)]
    assert all(-1.3 < s < -0.7 for s in slopes), slopes


def test_bound_rejects_wrong_width_and_moved_centres():
    module = attention_from_conv2d(torch.randn(2, 3, 3, 3), alpha=1.0)
    with pytest.raises(ValueError, match="3 input channels"):
        lemma2_bound(module, torch.randn(1, 4, 4, 2))
    with torch.no_grad():
        module.attention.centers[4] += 0.5          # a head off its shift: the bound would not hold
    with pytest.raises(ValueError, match="centered on their kernel shifts"):
        lemma2_bound(module, torch.randn(1, 4, 4, 3))


def test_the_bound_holds_on_the_channels_narrow_heads_reproduce(test_images):
    x = test_images[:2, :, :12, :12].repeat(1, 2, 1, 1)               # 6 input channels
    weight = torch.randn(8, 6, 3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = F.conv2d(x, weight, padding=1).permute(0, 2, 3, 1)
    with pytest.warns(UserWarning, match="only output channels"):
        module = attention_from_conv2d(weight, alpha=4.0, head_dim=3)   # narrower than C_in and C_out
    x_last = x.permute(0, 2, 3, 1)
    with torch.no_grad():
        error = (module(x_last) - ref)[..., list(module.exact_channels)].abs().max().item()
    assert module.exact_channels == (0, 1, 2) and 0 < error <= lemma2_bound(module, x_last).output_bound
