"""Content attention's and GPSA's impl="explicit-half": under bf16 autocast the softmax writes bf16
probabilities; outputs and gradients stay those of impl="explicit" (float32 softmax) to bf16 rounding.
On the ``device`` of tests/conftest.py, under that device's autocast."""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import build_attention


def _run(layer, x, half: bool | str, autocast: bool):
    layer.impl = half if isinstance(half, str) else "explicit-half" if half else "explicit"
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = layer(x)
    out.float().square().sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return out.detach().float(), x.grad.clone(), grads


def _flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.double().flatten() for _, g in sorted(grads.items())])


@pytest.mark.parametrize("kind,head_dim", [("learned-content", None), ("content", None), ("gpsa", None), ("gpsa", 8)])
def test_bf16_softmax_matches_float32_softmax(kind, head_dim, device):
    torch.manual_seed(0)
    extra = {"max_size": 8} if kind == "learned-content" else {}
    layer = build_attention(kind, 32, 4, head_dim=head_dim, **extra).to(device)
    x = torch.randn(3, 8, 8, 32).to(device)
    out_half, gx_half, g_half = _run(layer, x, True, True)
    out_full, gx_full, g_full = _run(layer, x, False, True)
    out_64, gx_64, g_64 = _run(layer.double(), x.double(), False, False)
    # Forward: the probabilities are rounded to bf16 before the value product either way.
    assert torch.allclose(out_half, out_full, rtol=0, atol=1e-2 * out_full.abs().max().item())
    # Backward: against float64, the bf16 probabilities add at most bf16-rounding-sized error to
    # what bf16 autocast already costs (all gradients together: key.bias's true gradient is 0,
    # the softmax being invariant to a per-query constant, so alone it is pure rounding).
    for half, full, exact in [(_flat(g_half), _flat(g_full), _flat(g_64)), (gx_half, gx_full, gx_64)]:
        err_half = ((half - exact).norm() / exact.norm()).item()
        err_full = ((full.double() - exact).norm() / exact.norm()).item()
        assert err_half <= 1.2 * err_full + 1e-3, (err_half, err_full)
        assert err_half < 3e-2


@pytest.mark.parametrize("kind,impl", [("learned-content", "explicit-onehot"), ("learned-content", "bilinear")])
def test_bf16_joint_product_paths_err_like_the_explicit_path(kind, impl, device):
    """The q.r term inside the q.k product (learned-content's one-hot paths), and the scores through
    the bilinear form (the query map folded into W_key and the tables), under bf16 autocast:
    outputs and gradients as close to float64 as the explicit path's (float32 softmax)."""
    torch.manual_seed(0)
    extra = {"max_size": 8} if kind == "learned-content" else {}
    layer = build_attention(kind, 32, 4, **extra).to(device)
    x = torch.randn(3, 8, 8, 32).to(device)
    out_path, gx_path, g_path = _run(layer, x, impl, True)
    out_full, gx_full, g_full = _run(layer, x, False, True)
    out_64, gx_64, g_64 = _run(layer.double(), x.double(), False, False)
    pairs = [(out_path, out_full, out_64), (_flat(g_path), _flat(g_full), _flat(g_64)), (gx_path, gx_full, gx_64)]
    for mine, full, exact in pairs:
        err = ((mine.double() - exact).norm() / exact.norm()).item()
        err_full = ((full.double() - exact).norm() / exact.norm()).item()
        assert err <= 1.2 * err_full + 1e-3, (err, err_full)
        assert err < 3e-2


def test_half_softmax_writes_the_products_dtype_under_the_devices_autocast(device):
    """softmax_in of bf16 scores returns bf16 under autocast on every device (CUDA's autocast would
    otherwise run softmax in float32 and return float32), equal to the float32 softmax rounded once."""
    from attncnn.layers.autocast_rules import softmax_in
    torch.manual_seed(0)
    scores = (3 * torch.randn(4, 9, 64, 64)).to(device, torch.bfloat16).requires_grad_()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        probs = softmax_in(scores, torch.bfloat16)
    assert probs.dtype == torch.bfloat16
    expected = torch.softmax(scores.detach().float(), dim=-1)
    assert bool(((probs.detach().float() - expected).abs() <= 2.0 ** -8 * expected + 1e-6).all())
    probs.float().sum().backward()
    assert scores.grad.dtype == torch.bfloat16


def test_float32_and_returned_probabilities_unchanged(device):
    torch.manual_seed(0)
    layer = build_attention("learned-content", 16, 2, max_size=4).to(device)
    x = torch.randn(2, 4, 4, 16).to(device)
    out_a, gx_a, _ = _run(layer, x, True, False)
    out_b, gx_b, _ = _run(layer, x, False, False)
    assert torch.equal(out_a, out_b) and torch.equal(gx_a, gx_b)      # no autocast: float32 throughout
    layer.impl = "explicit-half"
    with torch.autocast(device.type, dtype=torch.bfloat16), torch.no_grad():
        _, probs = layer(x, return_attention=True)
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones((), device=device), atol=1e-6)


@pytest.mark.parametrize("onto", [False, True])
def test_scaled_content_equals_the_plain_formula_in_float64(onto, device):
    from attncnn.layers import QueryKeyAttention
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 7, 5, dtype=torch.float64), torch.randn(2, 3, 7, 5, dtype=torch.float64)
    term = torch.randn(2, 3, 7, 7, dtype=torch.float64).to(device) if onto else None
    q, k = q.to(device), k.to(device)
    expected = (q @ k.transpose(-2, -1)) / 5 ** 0.5 + (term if onto else 0)
    torch.testing.assert_close(QueryKeyAttention.scaled_content(q, k, term), expected, rtol=1e-14, atol=1e-14)


def test_bf16_scaled_content_is_rounded_once(device):
    """The scale acts on the product's float32 accumulator: each bf16 score is the exact scaled
    product rounded once (error <= bf16's unit roundoff 2^-8, plus float32 accumulation), where
    rounding the product and then scaling it in bf16 can err by about twice that."""
    from attncnn.layers import QueryKeyAttention
    torch.manual_seed(0)
    q = torch.randn(4, 9, 64, 8).to(device, torch.bfloat16)
    k = torch.randn(4, 9, 64, 8).to(device, torch.bfloat16)
    scores = QueryKeyAttention.scaled_content(q, k)
    assert scores.dtype == torch.bfloat16
    exact = (q.double() @ k.double().transpose(-2, -1)) / 8 ** 0.5
    accumulation = 8 * 2.0 ** -24 * (q.double().abs() @ k.double().abs().transpose(-2, -1)) / 8 ** 0.5
    assert bool(((scores.double() - exact).abs() <= 2.0 ** -8 * exact.abs() + accumulation).all())
