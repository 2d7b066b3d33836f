"""``attncnn inspect``'s text table shows each GPSA head's gate sigmoid(lambda_h)."""

from __future__ import annotations

import math
import re

import torch

from attncnn.analysis.inspection import inspect_text
from attncnn.analysis.metrics import model_metrics
from attncnn.models import build_model


def test_gpsa_gates_in_the_table():
    torch.manual_seed(0)
    model = build_model("gpsa-mini", num_layers=2, dim=32, head_dim=8, mlp_dim=32).eval()
    lambdas = torch.linspace(-2.0, 2.0, 9)
    with torch.no_grad():
        model.blocks[1].attention.gate_logits.copy_(lambdas)
    result = model_metrics(model, torch.randn(2, 3, 16, 16))
    text = inspect_text({"run": "gpsa", "epoch": 0, "kind": "image-transformer", **result})
    layer2 = text.split("layer 2 (gpsa)")[1]
    expected = [1 / (1 + math.exp(-v)) for v in lambdas.tolist()]
    assert f"mean gate {sum(expected) / 9:.3f}" in layer2.splitlines()[0]
    rows = [line for line in layer2.splitlines()[1:] if re.match(r"\s+\d+ ", line)]
    assert "gate" in layer2.splitlines()[1] and len(rows) == 9
    assert [float(r.split()[-1]) for r in rows] == [round(g, 3) for g in expected]
    # Layer 1 keeps lambda = 1 (ConViT's init): every gate sigmoid(1).
    assert text.split("layer 1 (gpsa)")[1].splitlines()[0].endswith(f"mean gate {1 / (1 + math.exp(-1)):.3f}")


def test_no_gate_column_without_gpsa():
    torch.manual_seed(0)
    model = build_model("quadratic-mini", num_layers=1, dim=16, mlp_dim=16).eval()
    result = model_metrics(model, grid_size=(8, 8))
    text = inspect_text({"run": "q", "epoch": 0, "kind": "image-transformer", **result})
    assert "gate" not in text and "layer 1 (quadratic)" in text
