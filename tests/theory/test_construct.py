"""Theorem 1 (PAPER.md 1.2-1.5): the constructed attention layer equals the convolution on real images."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attncnn.layers import QuadraticAttention
from attncnn.runs import load_model
from attncnn.theory import attention_from_conv2d, default_alpha, kernel_shifts

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def conv_reference(x, weight, bias, stride, dilation, padding):
    """``conv2d`` on channels-first ``x``, returned channels-last."""
    k = weight.shape[-1]
    pad = (k // 2) * dilation if padding == "same" else 0
    return F.conv2d(x, weight, bias, stride=stride, padding=pad, dilation=dilation).permute(0, 2, 3, 1)


def relative_error(out, ref):
    assert out.shape == ref.shape
    return ((out - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_attention_equals_conv2d_on_cifar(test_images, k, dilation, stride, padding, dtype):
    # 4 real test images, a 16x16 window each (the attention matrices grow as (H W)^2).
    x = test_images[:4, :, 8:24, 8:24].to(dtype)
    gen = torch.Generator().manual_seed(k * 100 + dilation * 10 + stride)
    weight = torch.randn(8, 3, k, k, generator=gen, dtype=torch.float64).to(dtype)
    bias = torch.randn(8, generator=gen, dtype=torch.float64).to(dtype)
    module = attention_from_conv2d(weight, bias=bias, stride=stride, dilation=dilation, padding=padding)
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
    ref = conv_reference(x, weight, bias, stride, dilation, padding)
    assert out.dtype == dtype
    assert relative_error(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_full_images_and_one_hot_attention(test_images, dtype):
    """The project's QuadraticAttention with K^2 heads; every head exactly one-hot on its shift."""
    conv = nn.Conv2d(3, 16, 3, padding=1).to(dtype)
    module = attention_from_conv2d(conv, padding=None)
    layer = module.attention
    assert type(layer) is QuadraticAttention and layer.num_heads == 9
    assert torch.equal(layer.centers.detach().double(), kernel_shifts(3))
    x = test_images.to(dtype)
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
        probs = layer.grid_probs(34, 34)[0]                       # the padded grid
    assert relative_error(out, conv(x).detach().permute(0, 2, 3, 1)) <= TOL[dtype]
    # Interior queries (the only ones cropped back in): target probability exactly 1, others 0.
    rows = torch.arange(1, 33)
    queries = (rows[:, None] * 34 + rows[None, :]).reshape(-1)
    for h, (dr, dc) in enumerate(kernel_shifts(3).long().tolist()):
        p = probs[h, queries]
        targets = queries + dr * 34 + dc
        assert torch.all(p[torch.arange(len(queries)), targets] == 1.0)
        assert torch.all(p.sum(-1) == 1.0)


def test_default_alpha_rule():
    assert default_alpha(torch.float32) == pytest.approx(87.336, abs=1e-3)
    assert default_alpha(torch.float64) == pytest.approx(708.396, abs=1e-3)
    # half-precision layers run scores and softmax in float32: its alpha makes them exactly one-hot too
    for dtype in (torch.float16, torch.bfloat16):
        assert default_alpha(dtype) == default_alpha(torch.float32)
        probs = attention_from_conv2d(torch.randn(2, 3, 3, 3).to(dtype)).attention.grid_probs(9, 9)[0]
        interior = torch.tensor([r * 9 + c for r in range(1, 8) for c in range(1, 8)])   # every target exists
        assert torch.all(probs[:, interior].amax(-1) == 1.0) and torch.all(probs[:, interior].sum(-1) == 1.0)
    with pytest.raises(ValueError, match="floating"):
        default_alpha(torch.int64)


def test_finite_alpha_is_honoured():
    module = attention_from_conv2d(torch.randn(2, 3, 3, 3, dtype=torch.float64), alpha=2.5)
    assert torch.allclose(module.alpha.detach(), torch.full((9,), 2.5, dtype=torch.float64))


def test_conv_module_geometry_and_padding_from_module(test_images):
    x = test_images[:2, :, :16, :16]
    for pad, expected in ((1, "same"), (0, "valid")):
        conv = nn.Conv2d(3, 5, 3, stride=2, padding=pad).double()
        module = attention_from_conv2d(conv)                   # by default the module's own padding
        assert (module.padding, module.stride, module.dilation) == (expected, 2, 1)
        assert attention_from_conv2d(conv, padding=expected).padding == expected
        with torch.no_grad():
            out = module(x.permute(0, 2, 3, 1))
        assert relative_error(out, conv(x).detach().permute(0, 2, 3, 1)) <= 1e-10
    conv = nn.Conv2d(3, 5, 5, dilation=2, padding=4, bias=False).double()
    module = attention_from_conv2d(conv)
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
    assert relative_error(out, conv(x).detach().permute(0, 2, 3, 1)) <= 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_trained_resnet_first_layer(resnet_checkpoint, test_images, dtype):
    model, _ = load_model(resnet_checkpoint)
    conv = model.conv1.to(dtype)
    assert conv.bias is None and conv.kernel_size == (3, 3)
    module = attention_from_conv2d(conv, padding=None)
    x = test_images.to(dtype)
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
        ref = conv(x).permute(0, 2, 3, 1)
    assert relative_error(out, ref) <= TOL[dtype]


def test_narrow_heads_reproduce_min_dh_cout_channels(test_images):
    x = test_images[:2, :, :16, :16].repeat(1, 3, 1, 1)                # 9 input channels, wider than the heads
    weight = torch.randn(12, 9, 3, 3, dtype=torch.float64)
    bias = torch.randn(12, dtype=torch.float64)
    ref = conv_reference(x, weight, bias, 1, 1, "same")
    with pytest.warns(UserWarning, match=r"only output channels \[0, 1, 2, 3, 4\]"):
        module = attention_from_conv2d(weight, bias=bias, head_dim=5)
    assert module.exact_channels == (0, 1, 2, 3, 4)
    assert module.attention.value_in is not None and module.attention.head_dim == 5
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
    assert relative_error(out[..., :5], ref[..., :5]) <= 1e-10
    assert torch.all(out[..., 5:] == 0)

    with pytest.warns(UserWarning, match=r"\[1, 7, 11\]"):
        module = attention_from_conv2d(weight, bias=bias, head_dim=4, channels=[1, 7, 11])
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
    assert relative_error(out[..., [1, 7, 11]], ref[..., [1, 7, 11]]) <= 1e-10

    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # D_h >= C_out: exact, no warning
        module = attention_from_conv2d(weight, bias=bias, head_dim=16)
    assert module.exact_channels == tuple(range(12))
    with torch.no_grad():
        out = module(x.permute(0, 2, 3, 1))
    assert relative_error(out, ref) <= 1e-10

    with pytest.raises(ValueError, match="at most 4"):
        attention_from_conv2d(weight, head_dim=4, channels=[0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="distinct"):
        attention_from_conv2d(weight, head_dim=4, channels=[0, 0])
    # head_dim == C_in means full-width heads (no value projection): every channel is exact.
    assert attention_from_conv2d(weight, head_dim=9).exact_channels == tuple(range(12))


def test_heads_at_least_as_wide_as_the_input_reproduce_every_channel(test_images):
    """W^(h) (C_in x C_out) has rank <= C_in, so it factors through D_h >= C_in dimensions."""
    x = test_images[:2, :, :16, :16]
    weight = torch.randn(8, 3, 3, 3, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    ref = conv_reference(x, weight, bias, 1, 1, "same")
    for head_dim in (3, 4, 7):
        with warnings.catch_warnings():
            warnings.simplefilter("error")                 # no channel left out: no warning
            module = attention_from_conv2d(weight, bias=bias, head_dim=head_dim)
        assert module.exact_channels == tuple(range(8)) and module.attention.head_dim == head_dim
        assert (module.attention.value_in is None) == (head_dim == 3)
        with torch.no_grad():
            out = module(x.permute(0, 2, 3, 1))
        assert relative_error(out, ref) <= 1e-10


@pytest.mark.parametrize("make, message", [
    (lambda: attention_from_conv2d(torch.randn(2, 3, 4, 4)), "odd"),
    (lambda: attention_from_conv2d(torch.randn(2, 3, 3, 5)), "square"),
    (lambda: attention_from_conv2d(nn.Conv2d(4, 4, 3, groups=2)), "groups"),
    (lambda: attention_from_conv2d(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")), "zero padding"),
    (lambda: attention_from_conv2d(nn.Conv2d(3, 4, 3, stride=(1, 2))), "stride"),
    (lambda: attention_from_conv2d(nn.Conv2d(3, 4, 3, padding=2)), "pads 2"),
    (lambda: attention_from_conv2d(nn.Conv2d(3, 4, 3, padding=0), padding="same"), "contradicts the Conv2d's own"),
    (lambda: attention_from_conv2d(nn.Conv2d(3, 4, 3), bias=torch.zeros(4)), "weight tensor"),
    (lambda: attention_from_conv2d(torch.randn(2, 3, 3, 3), padding="full"), "padding"),
    (lambda: attention_from_conv2d(torch.randn(2, 3, 3, 3), stride=0), "stride"),
    (lambda: attention_from_conv2d(torch.randn(2, 3, 3, 3), dilation=0), "dilation"),
    (lambda: attention_from_conv2d(torch.randn(2, 3, 3, 3), alpha=0.0), "alpha"),
    (lambda: attention_from_conv2d(torch.randn(2, 3, 3)), "shape"),
    (lambda: attention_from_conv2d("conv"), "weight tensor"),
])
def test_bad_convolutions_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_inputs_raise():
    module = attention_from_conv2d(torch.randn(2, 3, 5, 5), padding="valid")
    with pytest.raises(ValueError, match=r"\(B, H, W, 3\)"):
        module(torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="at least as large as the kernel extent 5"):
        module(torch.randn(1, 4, 8, 3))
    assert module(torch.randn(1, 5, 5, 3)).shape == (1, 1, 1, 2)          # an input as large as the kernel
