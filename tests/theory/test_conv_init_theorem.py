"""The models' convolutional init (attncnn.layers.conv_initialize_) against Theorem 1's construction
(attncnn.theory.attention_from_conv2d) and F.conv2d on real CIFAR-10 images, with the theory's
border convention: zero-pad the token grid by (K // 2) * dilation, attend, crop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attncnn.layers import QuadraticAttention, build_attention, conv_initialize_
from attncnn.theory import attention_from_conv2d, default_alpha


def _kernel(seed: int, c_out: int = 8, c_in: int = 3):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(c_out, c_in, 3, 3, generator=gen, dtype=torch.float64),
            torch.randn(c_out, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["quadratic", "quadratic-generalized", "learned"])
@pytest.mark.parametrize("dilation", [1, 2])
def test_conv_initialised_layer_equals_conv2d_on_cifar(test_images, kind, dilation):
    x = test_images[:4, :, 8:24, 8:24]                                       # (4, 3, 16, 16) float64
    weight, bias = _kernel(dilation)
    extra = {"max_size": 16 + 2 * dilation} if kind == "learned" else {}
    torch.manual_seed(0)
    layer = build_attention(kind, 3, 9, out_dim=8, **extra).double()
    conv_initialize_(layer, weight, bias, alpha=default_alpha(torch.float64), dilation=dilation)
    p = dilation
    tokens = F.pad(x.permute(0, 2, 3, 1), (0, 0, p, p, p, p))
    with torch.no_grad():
        out = layer(tokens)[:, p:-p, p:-p]
    ref = F.conv2d(x, weight, bias, padding=p, dilation=dilation).permute(0, 2, 3, 1)
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-10


@pytest.mark.parametrize("dilation", [1, 2])
def test_same_layer_as_theorem_1s_construction(test_images, dilation):
    weight, bias = _kernel(10 + dilation)
    alpha = 50.0                                                           # finite: Lemma 2's approximation
    theory = attention_from_conv2d(weight, bias=bias, dilation=dilation, alpha=alpha)
    layer = QuadraticAttention(3, 9, out_dim=8).double()
    conv_initialize_(layer, weight, bias, alpha=alpha, dilation=dilation)
    built = theory.attention
    for name in ("centers", "spreads"):
        assert torch.equal(getattr(layer, name), getattr(built, name)), name
    assert torch.equal(layer.value.weight, built.value.weight) and torch.equal(layer.value.bias, built.value.bias)
    x = test_images[:2].permute(0, 2, 3, 1)
    p = dilation
    with torch.no_grad():
        mine = layer(F.pad(x, (0, 0, p, p, p, p)))[:, p:-p, p:-p]
        assert torch.equal(mine, theory(x))
