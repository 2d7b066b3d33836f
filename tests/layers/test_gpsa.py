"""ConViT's gated positional self-attention (GPSA) against plain per-pair computations.

The per-pair formula of the gated probabilities is checked for every kind in test_attention.py
(``_naive_gpsa_probs``); here: the positional maps, the gate, the two paths, gradients, the frozen
gate and the weight-decay exemption. On the ``device`` of tests/conftest.py; random inputs are drawn
on the CPU, the per-pair references computed there.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from attncnn.layers import GatedPositionalAttention, build_attention, gpsa_features, local_init_
from attncnn.models import build_model

H, W, D, NH = 3, 4, 8, 3


def _layer(device="cpu", **kwargs) -> GatedPositionalAttention:
    torch.manual_seed(0)
    layer = GatedPositionalAttention(D, NH, **kwargs).double().eval()
    with torch.no_grad():
        layer.gate_logits.copy_(torch.tensor([-1.0, 0.5, 2.0]))
    return layer.to(device)


def _randn(*shape, device):
    """float64, drawn on the CPU (the same numbers on every device), then moved."""
    return torch.randn(*shape, dtype=torch.float64).to(device)


def test_relative_encoding_is_convits_d1_d2_squared_norm():
    r = gpsa_features(H, W, dtype=torch.float64)
    for q in range(H * W):
        for k in range(H * W):
            d1, d2 = k // W - q // W, k % W - q % W
            assert r[q, k].tolist() == [d1, d2, d1 * d1 + d2 * d2]


def test_positional_maps_are_batch_shared_softmaxes_of_v_pos_dot_r(device):
    layer = _layer(device)
    probs = layer.positional_probs(H, W)
    assert probs.shape == (1, NH, H * W, H * W) and probs.device == layer.v_pos.device
    probs = probs.cpu()                                  # against the per-pair formula on the CPU
    for h in range(NH):
        v = layer.v_pos[h].detach().cpu()
        for q in range(H * W):
            scores = [float(v @ gpsa_features(H, W, dtype=torch.float64)[q, k]) for k in range(H * W)]
            m = max(scores)
            expected = [math.exp(s - m) for s in scores]
            z = sum(expected)
            torch.testing.assert_close(probs[0, h, q], torch.tensor(expected, dtype=torch.float64) / z,
                                       rtol=1e-12, atol=1e-15)


def test_gates_start_at_sigmoid_1_and_select_the_two_maps(device):
    layer = GatedPositionalAttention(D, NH).double().to(device)
    assert torch.equal(layer.gates(), torch.full((NH,), 1 / (1 + math.exp(-1.0)), dtype=torch.float64, device=device))
    x = _randn(2, H, W, D, device=device)
    content = torch.softmax(layer.score_terms(x)[0], dim=-1)
    with torch.no_grad():
        layer.gate_logits.copy_(torch.tensor([60.0, -60.0, 0.0]))       # g = 1, 0, 1/2
    probs = layer.input_probs(x)
    positional = layer.positional_probs(H, W)
    torch.testing.assert_close(probs[:, 0], positional[:, 0].expand(2, -1, -1), rtol=0, atol=1e-15)
    torch.testing.assert_close(probs[:, 1], content[:, 1], rtol=0, atol=1e-15)
    torch.testing.assert_close(probs[:, 2], (content[:, 2] + positional[:, 2]) / 2, rtol=0, atol=1e-15)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, NH, H * W, dtype=torch.float64, device=device), rtol=0,
                               atol=1e-14)


@pytest.mark.parametrize("head_dim", [None, 4])
def test_fast_path_equals_explicit_path_and_returns_gated_maps(head_dim, device):
    layer = _layer(device, head_dim=head_dim).train()   # attn_drop 0: the fast path is taken in training too
    x = _randn(3, H, W, D, device=device)
    explicit, probs = layer(x, return_attention=True)
    assert probs.shape == (3, NH, H * W, H * W)
    torch.testing.assert_close(layer(x), explicit, rtol=1e-12, atol=1e-13)
    layer.impl = "explicit"
    torch.testing.assert_close(layer(x), explicit, rtol=0, atol=0)


def test_dropout_in_training_takes_the_explicit_path_with_one_mask_per_image(device):
    layer = _layer(device, attn_drop=0.5).train()
    x = _randn(1, H, W, D, device=device).expand(2, H, W, D)              # the same image twice
    torch.manual_seed(1)
    out = layer(x)
    torch.manual_seed(1)
    expected, _ = layer(x, return_attention=True)
    assert torch.equal(out, expected)
    assert not torch.allclose(out[0], out[1])          # different masks for the two copies


@pytest.mark.parametrize("fast_path", ["sdpa", "explicit"])
@pytest.mark.parametrize("head_dim", [None, 2])
def test_gradcheck_inputs_and_every_parameter(fast_path, head_dim, device):
    torch.manual_seed(0)
    layer = GatedPositionalAttention(4, 2, head_dim=head_dim).double().to(device)
    layer.impl = fast_path
    names = [n for n, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in layer.named_parameters())
    x = _randn(2, 2, 3, 4, device=device).requires_grad_()

    def f(x, *values):
        return functional_call(layer, dict(zip(names, values)), (x,))

    assert "gate_logits" in names and "v_pos" in names
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_frozen_gate_gets_no_gradient_and_is_not_counted(device):
    torch.manual_seed(0)
    free, frozen = GatedPositionalAttention(D, NH), GatedPositionalAttention(D, NH, freeze_gate=True)
    free, frozen = free.to(device), frozen.to(device)
    assert frozen.freeze_gate and not free.freeze_gate
    x = torch.randn(2, H, W, D).to(device)
    for layer in (free, frozen):
        layer(x).square().sum().backward()
    assert free.gate_logits.grad is not None and free.gate_logits.grad.abs().sum() > 0
    assert frozen.gate_logits.grad is None and frozen.v_pos.grad.abs().sum() > 0
    assert torch.equal(frozen.gate_logits, torch.ones(NH, device=device))
    trainable = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)   # noqa: E731
    assert trainable(free) - trainable(frozen) == NH
    model = build_model("gpsa-mini", freeze_gate=True, num_layers=1)
    assert not model.blocks[0].attention.gate_logits.requires_grad


def test_v_pos_and_gates_take_no_weight_decay():
    from attncnn.runs import TrainConfig
    from attncnn.training.components import make_optimizer

    model = build_model("gpsa-mini", num_layers=2)
    assert {"blocks.1.attention.v_pos", "blocks.1.attention.gate_logits"} <= model.no_weight_decay()
    optimizer = make_optimizer(model, TrainConfig(preset="gpsa-mini"))
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    for block in model.blocks:
        assert id(block.attention.v_pos) in no_decay and id(block.attention.gate_logits) in no_decay
        assert id(block.attention.query.weight) not in no_decay


def test_adamw_keeps_the_groups_and_decays_only_the_decayed_group(device):
    from attncnn.runs import TrainConfig
    from attncnn.training.components import make_optimizer

    model = build_model("gpsa-mini", num_layers=1).to(device)
    optimizer = make_optimizer(model, TrainConfig(preset="gpsa-mini", optimizer="adamw", lr=5e-4, weight_decay=0.05))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.05, 0.0]
    # a zero gradient leaves Adam's update zero: what remains is the decoupled decay, w *= 1 - lr * wd
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    skip = model.no_weight_decay()
    for name, p in model.named_parameters():
        factor = 1.0 if name in skip else 1 - 5e-4 * 0.05
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)


def test_local_init_gives_gaussian_positional_scores(device):
    layer = build_attention("gpsa", D, 9).double().to(device)
    local_init_(layer, alpha=1.5, dilation=2)
    scores = layer.positional_scores(5, 6)                           # (9, N, N)
    r = gpsa_features(5, 6, device, dtype=torch.float64)
    delta = r[..., :2]
    for h, (u, v) in enumerate((u, v) for u in range(3) for v in range(3)):
        center = torch.tensor([(u - 1) * 2.0, (v - 1) * 2.0], dtype=torch.float64, device=device)
        expected = -1.5 * (delta - center).square().sum(-1) + 1.5 * center.square().sum()
        torch.testing.assert_close(scores[h], expected, rtol=1e-13, atol=1e-12)
