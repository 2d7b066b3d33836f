"""Per-head GPSA gates in the per-epoch metrics (metrics.jsonl / TensorBoard) and in model_metrics."""

from __future__ import annotations

import torch

from attncnn.analysis import epoch_metrics, flatten_metrics, model_metrics
from attncnn.models import build_model

SMALL = {"num_layers": 2, "dim": 16, "mlp_dim": 16, "pooling": 4}


def _gpsa_model():
    torch.manual_seed(0)
    model = build_model("gpsa-mini", **SMALL)
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            block.attention.gate_logits.copy_(torch.linspace(-2.0, 2.0, 9) + i)
    return model


def test_epoch_metrics_of_a_gpsa_model_are_its_gates_without_a_forward_pass():
    model = _gpsa_model().train()
    calls = []
    for block in model.blocks:
        block.attention.register_forward_pre_hook(lambda *args: calls.append(1))
    state = torch.get_rng_state()
    flat = epoch_metrics(model)
    assert not calls and torch.equal(state, torch.get_rng_state()) and model.training
    expected = {}
    for i, block in enumerate(model.blocks):
        gates = torch.sigmoid(torch.linspace(-2.0, 2.0, 9).double() + i)
        expected[f"attn/layer{i + 1}/gate"] = float(gates.mean())
        expected.update({f"attn/layer{i + 1}/head{h + 1}/gate": float(g) for h, g in enumerate(gates)})
    assert flat.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(flat[key] - value) < 1e-7, key


def test_model_metrics_report_gates_beside_the_map_statistics():
    model = _gpsa_model().eval()
    result = model_metrics(model, torch.randn(2, 3, 32, 32))
    layer = result["layers"][1]
    assert layer["kind"] == "gpsa" and len(layer["heads"]) == 9
    gates = model.blocks[1].attention.gates().detach().double()
    assert [h["gate"] for h in layer["heads"]] == [float(g) for g in gates]
    assert layer["gate"] == sum(float(g) for g in gates) / 9
    flat = flatten_metrics(result)
    assert flat["attn/layer2/head9/gate"] == float(gates[8]) and "attn/layer2/head9/distance" in flat
    assert flat["attn/layer1/gate"] == result["layers"][0]["gate"]
