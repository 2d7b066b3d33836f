"""The Python API runs a trained model in float32 whatever precision its run trained at, so a
bf16-trained shipped model is as fast on a CPU without bfloat16 units as anywhere (bf16 inference
is the caller's choice, through ``torch.autocast``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attncnn
from attncnn.perf import precision as run_precision
from attncnn.runs.loading import OLD_MACHINE_FIELDS

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.skipif(not (RESULTS / "mini" / "quadratic-mini" / "seed0").is_dir(), reason="no committed results/mini")
@pytest.mark.parametrize("fast", [False, True], ids=["no-bf16-units", "bf16-units"])
def test_a_bf16_trained_model_runs_in_float32_on_any_cpu(fast, monkeypatch):
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: fast)
    model = attncnn.pretrained("quadratic-mini")
    assert model.metadata[OLD_MACHINE_FIELDS]["precision"] == "bf16"     # its config.json's, read one way
    assert "precision" not in model.metadata["config"]
    seen = []
    model.network.head.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    with torch.no_grad():
        logits = model(torch.rand(2, 3, 32, 32))
    assert logits.dtype == torch.float32 and seen == [torch.float32]         # no autocast inside
    assert {p.dtype for p in model.parameters()} == {torch.float32}
