"""The folded path of position-only layers (``impl="folded"``): output map first, then the maps.

Its float64 equality with the explicit path (outputs and every gradient) is in test_impl.py with
every other path; here: dropout, mixed precision, dtypes, and where the path is refused. On the
``device`` of tests/conftest.py (random inputs drawn on the CPU, then moved).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attncnn.layers import build_attention, local_init_
from attncnn.layers.mixing import folded_mix, mix_shared
from attncnn.models import build_model

D, NH, B, H, W = 16, 9, 3, 5, 6


def _layer(kind="quadratic", device="cpu", **kwargs):
    torch.manual_seed(0)
    extra = {"max_size": 6} if kind == "learned" else {}
    layer = build_attention(kind, D, NH, **extra, **kwargs)
    local_init_(layer, alpha=0.9)
    return layer.to(device)


def _input(dtype=torch.float32, device="cpu"):
    return torch.randn(B, H, W, D, generator=torch.Generator().manual_seed(1)).to(device, dtype)


def _run(layer, x, weight=None):
    """Output and the gradients of ``(out * weight).sum()`` w.r.t. the input and every parameter."""
    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_()
    out = layer(xg)
    weight = torch.ones_like(out) if weight is None else weight
    (out.float() * weight).sum().backward()
    return out.detach(), {"x": xg.grad, **{n: p.grad for n, p in layer.named_parameters()}}


@pytest.mark.parametrize("kind", ["quadratic", "quadratic-generalized", "learned"])
def test_dropout_takes_the_same_batch_shared_mask_as_the_dense_path(kind, device):
    x = _input(torch.float64, device)
    results = {}
    for impl in ("dense", "folded"):
        layer = _layer(kind, device, impl=impl, attn_drop=0.4).double().train()
        assert layer.path(H, W) == impl
        torch.manual_seed(7)                                 # the same dropout mask for both paths
        results[impl] = _run(layer, x, torch.randn(B, H, W, D, dtype=torch.float64).to(device))
    (dense, dense_grads), (folded, folded_grads) = results["dense"], results["folded"]
    torch.testing.assert_close(folded, dense, rtol=1e-10, atol=1e-12)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(folded_grads[name], grad, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("kind", ["quadratic", "learned"])
def test_bf16_outputs_and_gradients_are_as_close_to_float64_as_the_dense_paths(kind, device):
    """Under bf16 autocast both paths round x, W and the maps to bf16 and each product once; the
    folded path's input gradient adds the N_h heads' products in bf16 (N_h roundings instead of
    one). Bound: the folded error at most 3x the dense path's error plus 1 % of max|value|
    (measured, relative to max|value|: outputs 0.4 % for both paths; gradients 0.2-1.7 % folded,
    0.2-0.8 % dense)."""
    x = _input(device=device)
    weight = torch.randn(B, H, W, D, generator=torch.Generator().manual_seed(2)).to(device)
    exact = _run(_layer(kind, device, impl="dense").double().train(), x.double(), weight.double())
    errors = {}
    for impl in ("dense", "folded"):
        layer = _layer(kind, device, impl=impl).train()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out, grads = _run(layer, x, weight)
        assert out.dtype == torch.bfloat16
        assert all(g.dtype == torch.float32 for g in grads.values())     # parameters and input stay float32
        errors[impl] = {"out": ((out.double() - exact[0]).abs().max() / exact[0].abs().max()).item(),
                        **{n: ((g.double() - exact[1][n]).abs().max() / exact[1][n].abs().max()).item()
                           for n, g in grads.items()}}
    for name, dense_error in errors["dense"].items():
        assert errors["folded"][name] <= 3 * dense_error + 1e-2, (name, errors)


def test_folded_mix_equals_the_value_map_of_the_shared_mix_for_any_output_width(device):
    """The function alone, D_out != D and no bias: sum_h P_h x W_h^T against value(mix_shared)."""
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(NH, H * W, H * W, generator=g, dtype=torch.float64), dim=-1).to(device)
    tokens = torch.randn(B, H, W, D, generator=g, dtype=torch.float64).to(device)
    weight = torch.randn(5, NH * D, generator=g, dtype=torch.float64).to(device)
    mixed = mix_shared(probs, tokens)                                            # (B, N_h, N, D)
    expected = F.linear(mixed.transpose(1, 2).reshape(B, H * W, NH * D), weight).reshape(B, H, W, 5)
    torch.testing.assert_close(folded_mix(probs, tokens, weight, None, torch.float64), expected,
                               rtol=1e-12, atol=1e-12)
    small = (torch.rand(3, 4, 4, generator=g, dtype=torch.float64).to(device).requires_grad_(),     # N_h 3, 2x2 grid
             torch.randn(2, 2, 2, 3, generator=g, dtype=torch.float64).to(device).requires_grad_(),  # B 2, D 3
             torch.randn(4, 9, generator=g, dtype=torch.float64).to(device).requires_grad_(),        # D_out 4
             torch.randn(4, generator=g, dtype=torch.float64).to(device).requires_grad_())
    assert torch.autograd.gradcheck(lambda p, t, w, b: folded_mix(p, t, w, b, torch.float64), small)


def test_heads_narrower_than_the_model_cannot_fold():
    layer = _layer(head_dim=4)
    assert "folded" not in layer.impls and "dense" in layer.impls
    with pytest.raises(ValueError, match="no impl 'folded'"):
        layer.impl = "folded"
    with pytest.raises(ValueError, match=r"impl='folded' needs heads as wide as the model \(head_dim = dim = 64\), "
                                         r"got head_dim=16; use impl='dense'"):
        build_model("quadratic-mini", impl="folded", head_dim=16)
    assert build_model("learned-mini", impl="folded").train().attention_paths() == ["folded"] * 6


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["quadratic", "learned"])
def test_the_compiled_folded_path_equals_the_dense_path_in_float64(kind, device):
    """Under torch.compile the folded path takes its own products (one batched product for the
    head-major values, dL/dW_h from the untransposed tokens): the same sums, checked here (on the
    test device: inductor's CPU code on the CPU, Triton on CUDA)."""
    x, weight = _input(torch.float64, device), torch.randn(B, H, W, D, dtype=torch.float64).to(device)
    dense = _layer(kind, device, impl="dense").double()
    folded = _layer(kind, device, impl="folded").double()
    want, want_grads = _run(dense, x, weight)
    got, got_grads = _run(torch.compile(folded, dynamic=False, fullgraph=True), x, weight)
    torch._dynamo.reset()
    got_grads = {name.removeprefix("_orig_mod."): grad for name, grad in got_grads.items()}
    assert got_grads.keys() == want_grads.keys()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-9, atol=1e-11, msg=name)
