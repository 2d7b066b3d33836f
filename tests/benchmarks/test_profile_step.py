"""benchmarks/profile_step.py: its FLOPs are the harness's count and it recognises the product kernels."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from profile_step import profile_preset  # noqa: E402

from attncnn import build_model  # noqa: E402
from attncnn.perf.bench.harness import count_training_flops  # noqa: E402


def test_profile_of_a_small_preset_is_complete_and_counts_the_run_flops():
    result = profile_preset("demo", batch_size=4, precision="fp32", steps=1)
    torch.manual_seed(0)
    model = build_model("demo")
    forward, train = count_training_flops(model, torch.randn(2, 3, 32, 32), torch.tensor([0, 1]), dense=False)
    assert result["train"]["flops_per_image"] == train / 2
    assert result["test"]["flops_per_image"] == forward / 2
    for mode in ("train", "test"):
        shares = result[mode]["shares"]
        # the product kernels' names are recognised (shares of tiny steps vary too much to bound more)
        assert shares.get("products", 0.0) > 0
        assert result[mode]["wall_seconds"] > 0
