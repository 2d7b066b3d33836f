"""benchmarks/dispatch_count.py: what it counts as a top-level and a computing call, and the
optimizer's fused kernel as one call per parameter group."""

import pytest
import torch

import dispatch_count


def test_top_level_calls_and_computing_leaves_of_a_known_function():
    # torch.ones calls empty and fill_ inside it; add_ is one call: two top-level calls, two that compute
    counts = dispatch_count.count_calls(lambda: torch.ones(3).add_(1))
    assert (counts["top_level"], counts["computing"]) == (2, 2) and counts["calls"] >= 4


@pytest.mark.parametrize("preset, groups", [("quadratic-mini", 2), ("learned-mini", 1)])
def test_the_fused_optimizer_is_one_call_per_parameter_group(preset, groups):
    # quadratic's centres and spreads take no weight decay: a second group; learned has one
    counts = dispatch_count.step_counts(preset, 4, layers=1)
    assert counts["param_groups"] == groups and counts["fused"] == groups
    assert counts["foreach"] > counts["fused"]
    fb = counts["forward_backward"]
    assert fb["calls"] >= fb["top_level"] > 0 and fb["calls"] > fb["computing"] > 0


def test_the_table_names_every_preset_and_the_loop(tmp_path, capsys):
    out = tmp_path / "counts.md"
    assert dispatch_count.main(["--presets", "learned-mini", "--batch-size", "4", "--layers", "1",
                                "--out", str(out)]) == 0
    text = out.read_text()
    assert "| `learned-mini` | 20 |" in text and "one training batch" in text and "the running sums" in text
