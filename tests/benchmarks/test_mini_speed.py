"""benchmarks/gpu/mini_speed.py and mini_rows.py: the job's order and budget, the table written
after every row, the exactness bound, and one real row on the CPU."""

import json
from argparse import Namespace

import pytest
import torch

import mini_rows
import mini_speed


def test_the_eager_rows_and_cuda_graphs_of_every_preset_come_first():
    rows = ["compile", "whole-step", "eager", "reduce-overhead"]
    assert mini_speed.plan(["q", "l"], rows, profile=True) == [
        ("q", "eager"), ("l", "eager"), ("q", "reduce-overhead"), ("l", "reduce-overhead"), ("q", "profile"),
        ("l", "profile"), ("q", "whole-step"), ("l", "whole-step"), ("q", "compile"), ("l", "compile")]
    assert mini_speed.plan(["q"], ["eager"], profile=False) == [("q", "eager")]


def _result(preset, row, images_per_s=1000.0, **kw):
    return {"preset": preset, "row": row, "paths": ["dense"] * 6, "images_per_s": images_per_s, "step_ms": 1.0,
            "first_step_s": 1.0, "warmup_s": 2.0, "peak_memory_bytes": 2**30, "graphs": 1, "graph_breaks": 0,
            "recompiled_in_timing": 0, "param_diff": 1e-4, "param_scale": 2.0, "param_bound": 4e-4,
            "loss_diff": 1e-3, "loss_bound": 9e-3, "exact": True, "note": "", "seconds": 10.0,
            "machine": {"torch": "2.13.0", "gpu": "Some GPU", "cuda": "12.8"}, **kw}


def test_rows_past_the_budget_are_not_started_and_the_table_is_written_after_each_row(tmp_path, monkeypatch):
    """Each row is given the seconds left (or its own limit); after every row both files are there
    with what ran so far; the ratios are to the eager row of the same preset."""
    now, calls, seen = [0.0], [], []

    def run_row(preset, row, args, limit, why):
        calls.append((preset, row, limit, why))
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        now[0] += {"eager": 20.0, "reduce-overhead": 100.0}[row]
        return _result(preset, row, 4000.0 if row == "eager" else 10000.0)

    monkeypatch.setattr(mini_speed, "run_row", run_row)
    monkeypatch.setattr(mini_speed.time, "monotonic", lambda: now[0])
    assert mini_speed.main(["--out", str(tmp_path), "--presets", "q,l", "--rows", "eager,reduce-overhead",
                            "--budget", "200"]) == 0
    # 0 + 30 <= 200, 20 + 30, 40 + 90 <= 200 (limit: the 160 s left, less than 3 x 90), 140 + 90 > 200
    assert calls == [("q", "eager", 90.0, "the row limit"), ("l", "eager", 90.0, "the row limit"),
                     ("q", "reduce-overhead", 160.0, "the 200 s budget")]
    assert seen == [[], ["mini-speed.json", "mini-speed.md"], ["mini-speed.json", "mini-speed.md"]]
    table = (tmp_path / "mini-speed.md").read_text()
    assert table.startswith("# Mini presets' training step: Some GPU, CUDA 12.8, torch 2.13.0")
    assert "| `q` | reduce-overhead | dense | 10,000 | 2.50x |" in table
    assert "| `l` | reduce-overhead | - | not run: the 200 s budget (140 s used) |" in table
    saved = json.loads((tmp_path / "mini-speed.json").read_text())
    assert [r["row"] for r in saved["results"]] == ["eager", "eager", "reduce-overhead"]


def test_a_row_is_judged_against_twice_the_eager_steps_own_bf16_error_or_one_bf16_unit():
    eager = ([torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)], [2.0, 1.5, 1.0])
    start = [eager[0][0] - torch.tensor([0.1, 0.0, 0.0], dtype=torch.float64)]       # the largest update: 0.1
    fp32 = ([torch.tensor([1.0, -2.0, 0.5 + 1e-3], dtype=torch.float64)], [2.0, 1.5, 1.01])
    inside = mini_rows.judged([eager[0][0] + 2e-3], [2.0, 1.5, 1.02], eager, fp32, start)
    assert (inside["param_bound"], inside["loss_bound"]) == (pytest.approx(2e-3), pytest.approx(0.02))
    assert inside["exact"] and inside["param_diff"] == pytest.approx(2e-3) and inside["param_scale"] == 2.0
    assert not mini_rows.judged([eager[0][0] + 2.1e-3], [2.0, 1.5, 1.0], eager, fp32, start)["exact"]
    assert not mini_rows.judged([eager[0][0]], [2.0, 1.5, 1.03], eager, fp32, start)["exact"]
    # an eager step that happens to match fp32 leaves one bf16 unit of the update, and of the loss
    floor = mini_rows.judged([eager[0][0] + 3e-4], [2.0, 1.5, 1.0 + 7e-3], eager, (eager[0], eager[1]), start)
    assert (floor["param_bound"], floor["loss_bound"], floor["exact"]) == (pytest.approx(0.1 / 256), 2.0 / 256, True)


def test_an_eager_row_on_the_cpu_matches_the_eager_step_exactly_and_is_timed():
    args = Namespace(preset="quadratic-mini", row="eager", device="cpu", batch_size=4, precision="fp32", warmup=2,
                     steps=2, layers=1)
    result = mini_rows.run_row(args)
    assert (result["param_diff"], result["loss_diff"], result["exact"]) == (0.0, 0.0, True)   # deterministic here
    assert result["param_bound"] > 0 and result["param_update"] > 0 and len(result["losses"]) == 3
    assert result["images_per_s"] > 0 and result["recompiled_in_timing"] == 0 and result["peak_memory_bytes"] is None
