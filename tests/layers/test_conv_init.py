"""Convolutional initialisation (init="conv"): every kind's positional maps are the Gaussian
``softmax(-alpha |delta - Delta_h|^2)`` around the h-th kernel shift, and with the kernel in the
value matrix the layer equals ``F.conv2d`` (random inputs here; real images in tests/theory).
Layers and inputs on the ``device`` of tests/conftest.py; random inputs are drawn on the CPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attncnn.theory
from attncnn.layers import (ContentAttention, GatedPositionalAttention, LearnedRelativeAttention,
                            LearnedRelativeContentAttention, build_attention, conv_initialize_, conv_kernel_size,
                            conv_value_init_, kernel_shifts, local_init_, relative_offsets)

KINDS = ["quadratic", "quadratic-generalized", "learned", "learned-content", "learned-content-9ffaa", "gpsa"]
ALPHA_EXACT = -math.log(torch.finfo(torch.float64).tiny)       # 708.4: one-hot in float64 (theory.default_alpha)


def _layer(kind: str, dim: int = 8, heads: int = 9, device="cpu", **kwargs):
    torch.manual_seed(0)
    extra = {"max_size": 12} if kind.startswith("learned") else {}
    return build_attention(kind, dim, heads, **extra, **kwargs).double().eval().to(device)


def _randn(*shape, device, generator=None):
    """float64, drawn on the CPU (the same numbers on every device), then moved."""
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device)


def _gaussian_probs(alpha: float, dilation: int, h: int, w: int, device="cpu") -> torch.Tensor:
    """``(9, N, N)`` softmax over keys of ``-alpha |delta - Delta_h|^2`` for the 3x3 shifts, row-major."""
    delta = relative_offsets(h, w, device, dtype=torch.float64)
    out = []
    for u in range(3):
        for v in range(3):
            center = torch.tensor([(u - 1) * dilation, (v - 1) * dilation], dtype=torch.float64, device=device)
            out.append(torch.softmax(-alpha * (delta - center).square().sum(-1), dim=-1))
    return torch.stack(out)


def _positional_probs(layer, x: torch.Tensor) -> torch.Tensor:
    """``(N_h, N, N)`` maps of the positional part: the whole map for all kinds but GPSA."""
    h, w = x.shape[1:3]
    if layer.position_only:
        return layer.grid_probs(h, w)[0]
    if isinstance(layer, GatedPositionalAttention):
        return layer.positional_probs(h, w)[0]
    return layer(x, return_attention=True)[1][0]


def test_head_order_is_row_major_taps_and_shared_with_theory():
    assert attncnn.theory.kernel_shifts is kernel_shifts
    assert kernel_shifts(3).tolist() == [[r, c] for r in (-1.0, 0.0, 1.0) for c in (-1.0, 0.0, 1.0)]
    assert kernel_shifts(3, dilation=2)[0].tolist() == [-2.0, -2.0]
    assert kernel_shifts(5).shape == (25, 2)
    with pytest.raises(ValueError, match="odd"):
        kernel_shifts(4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dilation", [1, 2])
def test_positional_maps_are_the_gaussians_around_the_kernel_shifts(kind, dilation, device):
    layer = _layer(kind, device=device)
    centers = local_init_(layer, alpha=1.0, dilation=dilation)
    assert torch.equal(centers, kernel_shifts(3, dilation))
    x = _randn(2, 7, 7, 8, device=device)
    probs = _positional_probs(layer, x)
    expected = _gaussian_probs(1.0, dilation, 7, 7, device)
    torch.testing.assert_close(probs, expected, rtol=1e-10, atol=1e-14)
    probs = probs.cpu()
    # argmax at the head's shift for every query whose shifted key is inside the grid
    m = dilation
    for h, (dr, dc) in enumerate(centers.long().tolist()):
        for r in range(m, 7 - m):
            for c in range(m, 7 - m):
                assert probs[h, r * 7 + c].argmax() == (r + dr) * 7 + (c + dc)


def test_learned_content_starts_input_independent_with_content_cancelled(device):
    layer = _layer("learned-content", device=device)
    local_init_(layer, alpha=1.0)
    x1, x2 = _randn(2, 6, 5, 8, device=device), 3 * _randn(1, 6, 5, 8, device=device)
    content, positional = layer.score_terms(x1)
    torch.testing.assert_close(content - content[..., :1], torch.zeros_like(content), rtol=0, atol=1e-12)
    delta = relative_offsets(6, 5, device, dtype=torch.float64)
    for h, center in enumerate(kernel_shifts(3).to(device)):
        exact = -(delta - center).square().sum(-1)                  # no per-query constant left
        torch.testing.assert_close(positional[:, h], exact.expand(2, -1, -1), rtol=1e-12, atol=1e-12)
    p1 = layer(x1, return_attention=True)[1]
    p2 = layer(x2, return_attention=True)[1]
    torch.testing.assert_close(p1, p2[0].expand_as(p1), rtol=1e-12, atol=1e-15)
    assert torch.equal(layer.query.weight, torch.zeros_like(layer.query.weight))


@pytest.mark.parametrize("kind", ["quadratic", "learned"])
def test_position_only_scores_are_exactly_minus_alpha_squared_distance(kind, device):
    layer = _layer(kind, device=device)
    local_init_(layer, alpha=2.5)
    scores = layer.grid_scores(4, 6)
    delta = relative_offsets(4, 6, device, dtype=torch.float64)
    expected = torch.stack([-2.5 * (delta - c).square().sum(-1) for c in kernel_shifts(3).to(device)])
    torch.testing.assert_close(scores, expected, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_every_parameter_still_learns_after_the_init(kind, device):
    layer = _layer(kind, device=device).train()
    local_init_(layer, alpha=1.0)
    layer(_randn(2, 5, 5, 8, device=device)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    if isinstance(layer, LearnedRelativeAttention):          # the zeroed table columns get gradients
        assert layer.row_embeddings.weight.grad[:, 3:].abs().sum() > 0


@pytest.mark.parametrize("kind", ["quadratic", "quadratic-generalized", "learned", "learned-content",
                                  "learned-content-9ffaa"])
@pytest.mark.parametrize("dilation", [1, 2])
def test_conv_initialised_layer_equals_conv2d(kind, dilation, device):
    """Large alpha (one-hot in float64): zero-pad the tokens, attend, crop == conv2d(padding=(K//2) d)."""
    layer = _layer(kind, dim=6, out_dim=5, device=device)
    gen = torch.Generator().manual_seed(dilation)
    kernel = _randn(5, 6, 3, 3, generator=gen, device=device)
    bias = _randn(5, generator=gen, device=device)
    conv_initialize_(layer, kernel, bias, alpha=ALPHA_EXACT, dilation=dilation)
    x = _randn(2, 6, 7, 6, generator=gen, device=device)                   # (B, C, H, W)
    ref = F.conv2d(x, kernel, bias, padding=dilation, dilation=dilation).permute(0, 2, 3, 1)
    tokens = F.pad(x.permute(0, 2, 3, 1), (0, 0, dilation, dilation, dilation, dilation))
    with torch.no_grad():
        out = layer(tokens)[:, dilation:-dilation, dilation:-dilation]
        interior = layer(x.permute(0, 2, 3, 1))[:, dilation:-dilation, dilation:-dilation]   # no padding
    scale = ref.abs().max()
    assert (out - ref).abs().max() <= 1e-12 * scale
    assert (interior - ref[:, dilation:-dilation, dilation:-dilation]).abs().max() <= 1e-12 * scale


def test_value_init_writes_each_heads_tap_into_its_value_columns(device):
    layer = _layer("quadratic", dim=4, out_dim=3, device=device)
    kernel = _randn(3, 4, 3, 3, device=device)
    conv_value_init_(layer, kernel)
    for h, (u, v) in enumerate((u, v) for u in range(3) for v in range(3)):
        assert torch.equal(layer.value.weight[:, 4 * h:4 * h + 4], kernel[:, :, u, v])
    assert torch.equal(layer.value.bias, torch.zeros(3, dtype=torch.float64, device=device))
    torch.manual_seed(0)
    conv_value_init_(layer)                                    # nn.Conv2d's default init: U(+-1/sqrt(D K^2))
    bound = 1 / math.sqrt(4 * 9)
    assert bound == 1 / math.sqrt(layer.value.in_features)     # the same bound as the value map's own init
    assert 0.9 * bound < layer.value.weight.abs().max() <= bound and layer.value.bias.abs().max() <= bound


def test_bad_inputs_name_the_problem_and_the_fix():
    with pytest.raises(ValueError, match="num_heads=4; set num_heads to 9"):
        conv_kernel_size(4)
    with pytest.raises(ValueError, match="conv_kernel_size=5 with num_heads=9"):
        conv_kernel_size(9, 5)
    assert conv_kernel_size(25) == 5 and conv_kernel_size(1) == 1
    with pytest.raises(ValueError, match="no positional term"):
        local_init_(ContentAttention(8, 9), alpha=1.0)
    with pytest.raises(ValueError, match="table_dim >= 3"):
        local_init_(LearnedRelativeAttention(8, 9, table_dim=2), alpha=1.0)
    with pytest.raises(ValueError, match="head_dim \\(or dim\\) >= 6"):
        local_init_(LearnedRelativeContentAttention(8, 9, head_dim=4), alpha=1.0)
    with pytest.raises(ValueError, match="positive and finite"):
        local_init_(_layer("quadratic"), alpha=0.0)
    with pytest.raises(ValueError, match="head_dim=None or value_init='random'"):
        conv_value_init_(_layer("quadratic", head_dim=4))
    with pytest.raises(ValueError, match=r"\(D_out, D, K, K\) = \(8, 8, 3, 3\)"):
        conv_value_init_(_layer("quadratic"), torch.zeros(8, 8, 5, 5, dtype=torch.float64))
