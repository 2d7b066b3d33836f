"""The viewer carries each GPSA head's gate sigmoid(lambda_h) and shows it under the head's
map. The manifest here; the page in headless Chromium in test_viewer_browser.py."""

from __future__ import annotations

import math

import pytest
import torch

from attncnn.analysis.viewer.export import export_model
from attncnn.models import build_model

LAMBDAS = [-2.0, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


def gpsa_export(preset: str, **overrides):
    """A 2-layer model of ``preset`` exported for the page; GPSA layer 2 gets the gate logits LAMBDAS."""
    torch.manual_seed(0)
    model = build_model(preset, num_layers=2, dim=32, mlp_dim=32, **overrides).eval()
    if preset == "gpsa-mini":
        with torch.no_grad():
            model.blocks[1].attention.gate_logits.copy_(torch.tensor(LAMBDAS))
    raw = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    export = export_model(model, raw.float() / 255 - 0.5, raw, labels=["0", "1"])
    export.manifest.update(name=preset, preset=preset, attention=preset, epoch=0, dataset=None, accuracy=None,
                           parameters=sum(p.numel() for p in model.parameters()))
    return export


def _sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v))


def test_manifest_gates():
    gates = gpsa_export("gpsa-mini", head_dim=8).manifest["gates"]
    assert gates[0] == pytest.approx([_sigmoid(1.0)] * 9)                     # ConViT's init lambda = 1
    assert gates[1] == pytest.approx([_sigmoid(v) for v in LAMBDAS])
    assert gpsa_export("quadratic-mini").manifest["gates"] is None
