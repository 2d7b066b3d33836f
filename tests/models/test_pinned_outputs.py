"""Refactors change no numbers: float64 logits and per-parameter gradient norms of every CPU-scale
preset on a fixed input, against ``pinned_outputs.json``.

The file was written by this module (``python tests/models/test_pinned_outputs.py OUT.json``) with
the code of commit c82d29a, before the attention layers were split into families (issue 23); the
layers' fp32 outputs and gradients were also checked bit-identical before and after on one machine.
float64 keeps the comparison independent of the CPU's matrix kernels up to ~1e-15 relative; the
tolerance is 1e-9 (of the largest value of each model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from attncnn.models import build_model

PINNED = Path(__file__).with_name("pinned_outputs.json")
PRESETS = ["demo", "quadratic-mini", "quadratic-generalized-mini", "learned-mini", "learned-content-mini",
           "gpsa-mini", "quadratic-conv-mini", "learned-conv-mini", "resnet18-mini"]


def outputs(name: str) -> dict:
    """Logits ``(2, 10)`` of two fixed random images and the gradient norm of every parameter of
    ``sum(logits^2)``, float64, eval mode, weights from seed 0."""
    torch.manual_seed(0)
    model = build_model(name).double().eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logits = model(x)
    logits.square().sum().backward()
    return {"logits": logits.detach().tolist(),
            "grad_norms": {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}}


@pytest.mark.cpu_only("a record of what the CPU computed before the refactor; the layers' and models' "
                      "equalities on the test device are checked in tests/layers and tests/models")
@pytest.mark.parametrize("name", PRESETS)
def test_outputs_and_gradients_are_the_pinned_ones(name):
    pinned = json.loads(PINNED.read_text())[name]
    now = outputs(name)
    logits, expected = torch.tensor(now["logits"]), torch.tensor(pinned["logits"])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-9 * float(expected.abs().max()))
    assert now["grad_norms"].keys() == pinned["grad_norms"].keys()
    scale = max(pinned["grad_norms"].values())
    for param, norm in pinned["grad_norms"].items():
        assert abs(now["grad_norms"][param] - norm) <= 1e-9 * scale, param


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps({name: outputs(name) for name in PRESETS}, indent=0))
