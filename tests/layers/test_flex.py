"""Learned relative content attention through FlexAttention (``impl="flex"``) against the explicit path.

On the ``device`` of tests/conftest.py. Off CUDA, FlexAttention runs its unfused reference and has
no backward: there the forward is checked and the training step must refuse with a message naming
the fix; a CUDA session (``ATTNCNN_TEST_DEVICE=cuda``) checks the fused kernel's outputs and gradients.
"""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import build_attention, local_init_
from attncnn.layers.flex import FLEX_CUDA_MIN_HEAD_DIM
from attncnn.models import build_model
from attncnn.perf.timing import time_impls

# FlexAttention warns once that an uncompiled call runs its unfused reference: what the CPU checks use
pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

# heads of 16 and 20 channels: FlexAttention's CUDA kernel takes no narrower ones (FLEX_CUDA_MIN_HEAD_DIM)
D, NH = 16, 9


@pytest.fixture(autouse=True)
def _fresh_compiler(device):
    """On CUDA every test's shapes compile their own kernel: one process would otherwise pass the
    compiler's limit of 8 recompilations of the one compiled ``flex_attention`` and fall back to
    FlexAttention's unfused reference, which these tests do not mean to check there."""
    if device.type == "cuda":
        torch._dynamo.reset()


def _layer(device, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    layer = build_attention("learned-content", D, NH, max_size=6, **kwargs).to(dtype)
    local_init_(layer, alpha=0.7)
    with torch.no_grad():                     # content terms switched on as well as the local q.r term
        layer.query.weight.normal_(0, 0.5)
    return layer.to(device)


def _run(layer, x, weight, impl, **kw):
    layer.impl = impl
    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_()
    out = layer(xg, **kw)
    out = out[0] if isinstance(out, tuple) else out
    (out.float() * weight).sum().backward()
    return out.detach().float(), {"x": xg.grad, **{n: p.grad for n, p in layer.named_parameters()}}


@pytest.mark.parametrize("head_dim", [None, 20])
@pytest.mark.parametrize("grid", [(5, 6), (4, 4), (6, 3)])
def test_flex_forward_equals_the_explicit_path_in_float32(head_dim, grid, device):
    """Key j of a (H, W) grid sits in row j // W and column j % W: non-square grids catch a swap."""
    layer = _layer(device, head_dim=head_dim).eval()
    x = torch.randn(2, *grid, D).to(device)
    with torch.no_grad():
        expected, _ = layer(x, return_attention=True)
        layer.impl = "flex"
        out = layer(x)
    assert out.shape == expected.shape == (2, *grid, D)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.slow
def test_flex_in_a_compiled_model_equals_the_explicit_path(device):
    """Compiled with its model: on CUDA the kernel is traced into the model's graph; elsewhere the
    reference runs eagerly inside it (inductor's CPU kernel rejects these inputs)."""
    layer = _layer(device, impl="flex").eval()
    x = torch.randn(2, 6, 5, D).to(device)
    with torch.no_grad():
        expected, _ = layer(x, return_attention=True)
        out = torch.compile(layer)(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_flex_forward_under_bf16_autocast_errs_like_the_explicit_path(device):
    layer = _layer(device).eval()
    x = torch.randn(3, 6, 6, D).to(device)
    with torch.no_grad():
        exact = layer.double()(x.double(), return_attention=True)[0]
        layer.float()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            layer.impl = "explicit"
            explicit = layer(x).double()
            layer.impl = "flex"
            flex = layer(x)
    assert flex.dtype == torch.bfloat16
    err, err_explicit = [((y - exact).norm() / exact.norm()).item() for y in (flex.double(), explicit)]
    assert err <= 1.2 * err_explicit + 1e-3 and err < 2e-2, (err, err_explicit)


@pytest.mark.parametrize("head_dim", [None, 20])
def test_flex_trains_on_cuda_with_the_explicit_paths_gradients_and_refuses_elsewhere(head_dim, device):
    layer = _layer(device, head_dim=head_dim).train()
    x = torch.randn(2, 5, 6, D).to(device)
    weight = torch.randn(2, 5, 6, D).to(device)
    if device.type != "cuda":
        with pytest.raises(ValueError, match=f"impl='flex' cannot run this step: FlexAttention has no backward on "
                                             f"{device.type}; it trains on CUDA only"):
            _run(layer, x, weight, "flex")
        return
    expected, expected_grads = _run(layer, x, weight, "explicit", return_attention=True)
    out, grads = _run(layer, x, weight, "flex")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    for name, grad in expected_grads.items():
        bound = 1e-4 * grad.abs().max().item() + 1e-7    # float32 sums in another order
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=bound, msg=name)


def test_flex_has_no_dropout_on_the_maps():
    with pytest.raises(ValueError, match="impl='flex' trains without dropout on the attention maps .* "
                                         "set attn_dropout=0 or choose another impl"):
        build_model("learned-content-mini", impl="flex", attn_dropout=0.1)
    # evaluating with flex is fine: dropout is off in eval mode
    assert build_model("learned-content-mini", impl="explicit-onehot", eval_impl="flex",
                       attn_dropout=0.1).eval().attention_paths() == ["flex"] * 6
    layer = _layer("cpu", attn_drop=0.1, impl="flex").train()
    with pytest.raises(ValueError, match="no dropout on the attention maps \\(attn_drop=0.1\\)"):
        with torch.no_grad():
            layer(torch.randn(1, 4, 4, D))


def test_flex_is_a_path_choice_candidate_on_cuda_only():
    layer = _layer("cpu")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert layer.path_unavailable("flex", cpu, backward=True) == "FlexAttention has no backward on cpu; it trains on " \
                                                             "CUDA only (on cpu, evaluate under torch.no_grad())"
    assert "unfused reference" in layer.path_unavailable("flex", cpu, backward=False)
    assert layer.path_unavailable("flex", cuda, backward=True) is None
    assert layer.path_unavailable("flex", cuda, backward=False) is None
    assert all(layer.path_unavailable(i, cpu, backward=True) is None
               for i in layer.impls if i not in ("flex", "sdpa-onehot", "sdpa-bilinear"))
    # narrow heads: CUDA's kernel refuses them (so auto never times flex there); the CPU reference takes them
    narrow = _layer("cpu", head_dim=FLEX_CUDA_MIN_HEAD_DIM - 2)
    for backward in (True, False):
        assert narrow.path_unavailable("flex", cuda, backward=backward) == (
            "FlexAttention's CUDA kernel needs heads of at least 16 channels, got head_dim=14; choose the sdpa "
            "or an explicit path")
    assert "unfused reference" in narrow.path_unavailable("flex", cpu, backward=False)
    assert _layer("cpu", head_dim=FLEX_CUDA_MIN_HEAD_DIM).path_unavailable("flex", cuda, backward=True) is None
    # the default candidates of a timing leave it out off CUDA (and, on a CPU, the fused kernel on
    # joint queries and keys wider than the values: tests/layers/test_bilinear.py)
    timings = time_impls(layer, torch.randn(2, 4, 4, D), reps=1)
    assert set(timings) == {"explicit", "explicit-half", "sdpa", "bilinear", "explicit-onehot"}


def test_flex_refuses_narrow_heads_on_cuda_and_computes_them_elsewhere(device):
    """torch's FlexAttention kernel stops with an inductor error for heads under 16 channels: the
    layer says so first, naming the fix; the CPU reference has no such limit."""
    layer = _layer(device, head_dim=6).eval()
    x = torch.randn(2, 4, 5, D).to(device)
    with torch.no_grad():
        expected, _ = layer(x, return_attention=True)
        layer.impl = "flex"
        if device.type == "cuda":
            with pytest.raises(ValueError, match="impl='flex' cannot run this step: FlexAttention's CUDA kernel needs "
                                                 "heads of at least 16 channels, got head_dim=6"):
                layer(x)
            return
        out = layer(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
