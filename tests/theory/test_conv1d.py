"""The 1-D corollary (PAPER.md 1.6): K heads with the encoding (delta^2, delta) equal a 1-D convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attncnn.layers import QuadraticAttention
from attncnn.theory import attention_from_conv1d

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_attention_equals_conv1d(k, dilation, stride, padding, dtype):
    gen = torch.Generator().manual_seed(k * 100 + dilation * 10 + stride)
    x = torch.randn(3, 4, 29, generator=gen, dtype=torch.float64).to(dtype)     # (B, C_in, T)
    weight = torch.randn(6, 4, k, generator=gen, dtype=torch.float64).to(dtype)
    bias = torch.randn(6, generator=gen, dtype=torch.float64).to(dtype)
    module = attention_from_conv1d(weight, bias=bias, stride=stride, dilation=dilation, padding=padding)
    layer = module.attention
    assert type(layer) is QuadraticAttention and layer.num_heads == k
    assert torch.all(layer.centers.detach()[:, 0] == 0)                          # row shift 0: 1-D encoding
    with torch.no_grad():
        out = module(x.transpose(1, 2))
    pad = (k // 2) * dilation if padding == "same" else 0
    ref = F.conv1d(x, weight, bias, stride=stride, padding=pad, dilation=dilation).transpose(1, 2)
    assert out.shape == ref.shape
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= TOL[dtype]


def test_conv1d_module_and_errors():
    conv = nn.Conv1d(2, 3, 3, padding=1, stride=2).double()
    module = attention_from_conv1d(conv, padding=None)
    x = torch.randn(2, 2, 11, dtype=torch.float64)
    with torch.no_grad():
        out = module(x.transpose(1, 2))
        ref = conv(x).transpose(1, 2)
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-10
    with pytest.raises(ValueError, match=r"\(B, T, 2\)"):
        module(torch.randn(2, 11, 11, 2))
    with pytest.raises(ValueError, match="odd"):
        attention_from_conv1d(torch.randn(3, 2, 2))
    with pytest.raises(ValueError, match="kernel extent"):
        attention_from_conv1d(torch.randn(3, 2, 5), padding="valid")(torch.randn(1, 4, 2))
