"""The converse measurement: the convolution closest to a positional attention layer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attncnn.layers import ContentAttention, LearnedRelativeAttention, QuadraticAttention
from attncnn.theory import attention_from_conv1d, attention_from_conv2d, conv_from_attention, kernel_shifts


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_round_trip_returns_the_kernel(test_images, k, dilation):
    weight = torch.randn(7, 3, k, k, dtype=torch.float64)
    bias = torch.randn(7, dtype=torch.float64)
    module = attention_from_conv2d(weight, bias=bias, dilation=dilation)
    x = test_images[:2, :, :16, :16].permute(0, 2, 3, 1)
    conv = conv_from_attention(module, inputs=x)
    assert conv.weight.shape == weight.shape
    assert (conv.weight - weight).abs().max().item() <= 1e-10 * weight.abs().max().item()
    assert (conv.bias - bias).abs().max().item() <= 1e-10
    report = conv.report
    assert report.max_center_distance == 0.0
    assert all(h.distance == 0.0 and h.target_mass == 1.0 for h in report.heads)
    assert [h.tap for h in report.heads] == [divmod(i, k) for i in range(k * k)]
    assert report.relative_error <= 1e-10
    # The extracted conv computes the same thing.
    with torch.no_grad():
        ref = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, padding=(k // 2) * dilation, dilation=dilation)
        assert torch.allclose(conv(x).permute(0, 3, 1, 2), ref, rtol=0, atol=1e-12)


def test_shuffled_and_perturbed_heads_are_reassigned(test_images):
    weight = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    module = attention_from_conv2d(weight, stride=2, alpha=3.0)
    layer = module.attention
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    noise = torch.rand(9, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.6 - 0.3
    with torch.no_grad():
        layer.centers.copy_(layer.centers[perm] + noise)
        blocks = layer.value.weight.reshape(5, 9, 3)[:, perm].reshape(5, 27).clone()
        layer.value.weight.copy_(blocks)
    x = test_images[:2, :, :16, :16].permute(0, 2, 3, 1)
    conv = conv_from_attention(module, inputs=x)
    assert torch.equal(conv.weight, weight)                                  # every head back on its tap
    shifts = kernel_shifts(3)
    for h, head in enumerate(conv.report.heads):
        assert head.shift == tuple(shifts[perm[h]].tolist())
        assert head.distance == pytest.approx(float(noise[h].norm()), abs=1e-12)
    assert conv.report.max_center_distance == pytest.approx(float(noise.norm(dim=1).max()), abs=1e-12)
    # Finite alpha and off-grid centres: not one-hot, and the report measures how far from it.
    assert 1e-3 < conv.report.relative_error < 1.0
    assert all(0.5 < h.target_mass < 1.0 for h in conv.report.heads)
    assert all(h.alpha == pytest.approx(3.0) for h in conv.report.heads)


def test_learned_encoding_layer(test_images):
    """A learned-table layer whose heads peak on the 3x3 shifts is recognised as that convolution."""
    ms, big = 8, 60.0
    layer = LearnedRelativeAttention(3, 9, max_size=ms, table_dim=2 * ms - 1, out_dim=4).double()
    with torch.no_grad():
        layer.row_embeddings.weight.copy_(torch.eye(2 * ms - 1))
        layer.col_embeddings.weight.copy_(torch.eye(2 * ms - 1))
        layer.head_keys_row.weight.zero_()
        layer.head_keys_col.weight.zero_()
        for h in range(9):
            u, v = divmod(h, 3)
            layer.head_keys_row.weight[h, u - 1 + ms - 1] = big
            layer.head_keys_col.weight[h, v - 1 + ms - 1] = big
    x = test_images[:2, :, :8, :8].permute(0, 2, 3, 1)
    conv = conv_from_attention(layer, inputs=x)
    assert conv.report.max_center_distance < 1e-20
    assert all(h.alpha is None and h.target_mass == pytest.approx(1.0, abs=1e-20) for h in conv.report.heads)
    expected = layer.value.weight.detach().reshape(4, 9, 3).permute(0, 2, 1).reshape(4, 3, 3, 3)
    assert torch.equal(conv.weight, expected)
    assert conv.report.errors["relative"]["interior"] <= 1e-10
    # A bare layer renormalises over existing pixels at the border: not zero padding.
    assert conv.report.errors["relative"]["border"] > 1e-3


def test_full_covariance_alpha_is_the_weakest_direction():
    layer = QuadraticAttention(2, 9, full_covariance=True).double()
    with torch.no_grad():
        layer.centers.copy_(kernel_shifts(3))
        layer.spreads.copy_(torch.diag(torch.tensor([2.0, 4.0], dtype=torch.float64)).expand(9, 2, 2))
    conv = conv_from_attention(layer)
    assert all(h.alpha == pytest.approx(2.0) and h.distance == 0.0 for h in conv.report.heads)   # (2^2)/2


def test_nearest_assignment_sums_heads_on_one_shift():
    layer = QuadraticAttention(2, 10, out_dim=3).double()
    with torch.no_grad():
        layer.centers.copy_(torch.cat([kernel_shifts(3), torch.tensor([[0.2, -0.1]], dtype=torch.float64)]))
    with pytest.raises(ValueError, match="kernel_size"):
        conv_from_attention(layer)
    conv = conv_from_attention(layer, kernel_size=3, assignment="nearest")
    w = layer.value.weight.detach().reshape(3, 10, 2)
    assert torch.allclose(conv.weight[:, :, 1, 1], w[:, 4] + w[:, 9])
    optimal = conv_from_attention(layer, kernel_size=3)                        # 10 heads, 9 shifts
    assert sum(h.shift is None for h in optimal.report.heads) == 1
    with pytest.raises(ValueError, match="assignment"):
        conv_from_attention(layer, kernel_size=3, assignment="greedy")


def test_value_projection_is_folded(test_images):
    module = attention_from_conv2d(torch.randn(6, 3, 3, 3, dtype=torch.float64), head_dim=4)   # projection 3 -> 4
    assert module.attention.value_in is not None and module.exact_channels == tuple(range(6))
    with torch.no_grad():
        module.attention.value_in.bias.normal_()       # a bias on the values is a constant: folded into b
    x = test_images[:1, :, :12, :12].permute(0, 2, 3, 1)
    conv = conv_from_attention(module.attention, inputs=x)
    assert conv.report.errors["relative"]["interior"] <= 1e-10


def test_one_dimensional_round_trip():
    weight = torch.randn(4, 2, 5, dtype=torch.float64)
    module = attention_from_conv1d(weight, dilation=2)
    x = torch.randn(2, 17, 2, dtype=torch.float64)
    conv = conv_from_attention(module, inputs=x)
    assert torch.equal(conv.weight, weight)
    assert conv.report.max_center_distance == 0.0 and conv.report.relative_error <= 1e-10


def test_content_attention_is_rejected():
    with pytest.raises(ValueError, match="position-only"):
        conv_from_attention(ContentAttention(4, 9))


def test_report_is_json_serialisable(test_images):
    import json

    module = attention_from_conv2d(torch.randn(2, 3, 3, 3, dtype=torch.float64))
    report = conv_from_attention(module, inputs=test_images[:1, :, :8, :8].permute(0, 2, 3, 1)).report
    data = json.loads(json.dumps(report.to_dict()))
    assert len(data["heads"]) == 9 and not math.isnan(data["max_center_distance"])
