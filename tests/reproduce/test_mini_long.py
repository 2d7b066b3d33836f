"""The 60-epoch suite ``mini-long`` without training: its plan, the settled-on-a-grid criterion from a
hand-written metrics.jsonl, machine segments, the report's sections, shipped runs pointed at data."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from attncnn.models import get_preset
from attncnn.reproduce import get_suite, job_state, plan
from attncnn.reproduce.reporting.epochs import (SETTLED_BELOW, accuracy_bands, evolution_epochs, quadratic_heads,
                                                seed_layer_curves, settled_rows, settled_table)
from attncnn.reproduce.reporting.results import RunResult
from attncnn.reproduce.reporting.table1 import (center_lines, center_rows, cost_lines, epoch_sections, run_costs,
                                                settled_lines)
from attncnn.reproduce.running.machines import machine_segments, segments_text, shared_epochs
from attncnn.reproduce.running.runner import TrainOptions, job_config, train_command

EPYC = {"cpu": "AMD EPYC", "threads": 2, "torch": "2.13.0+cpu", "device": "cpu"}
XEON = {"cpu": "Intel Xeon", "threads": 2, "torch": "2.13.0+cpu", "device": "cpu"}


def test_plan_order_seeds_and_epochs(tmp_path):
    suite = get_suite("mini-long")
    jobs = plan(suite, tmp_path)
    assert [(j.preset, j.seed) for j in jobs] == [
        ("quadratic-mini", 0), ("learned-mini", 0), ("resnet18-mini", 0), ("quadratic-generalized-mini", 0),
        ("quadratic-mini", 1), ("learned-mini", 1), ("resnet18-mini", 1),
        ("quadratic-mini", 2), ("learned-mini", 2), ("resnet18-mini", 2), ("learned-content-mini", 0)]
    assert tuple(suite.rows) == tuple(get_suite("mini").rows)
    assert all(recipe["epochs"] == 60 for recipe in suite.rows.values())
    for job in jobs:
        config = job_config(job, TrainOptions())
        recipe = get_preset(job.preset).train
        assert config.epochs == 60 and recipe["epochs"] == 6          # the suite's, not the preset's
        assert (config.lr, config.momentum, config.weight_decay, config.batch_size, config.warmup_ratio,
                config.schedule) == (0.1, 0.9, 1e-4, 100, 0.05, "cosine")
        assert config.eval_every == 1 and config.checkpoint_every_steps == recipe["checkpoint_every_steps"]
    assert "--epochs 60 --checkpoint-every 10" in train_command(jobs[0], TrainOptions())
    # --epochs of a smoke run wins over the suite's 60; in the mini suite, which sets none, it becomes
    # every job's, so that a folder trained to another length is named rather than taken as finished
    assert dict(plan(suite, tmp_path, epochs=1)[0].overrides)["epochs"] == 1
    assert job_config(plan(suite, tmp_path, epochs=1)[0], TrainOptions(epochs=1)).epochs == 1
    assert all(j.overrides == (("epochs", 1),) for j in plan(get_suite("mini"), tmp_path, epochs=1))
    assert all(j.overrides == () for j in plan(get_suite("mini"), tmp_path))
    assert [j.preset for j in plan(suite, tmp_path, only=("learned-content-mini", "resnet18-mini"))] == \
        ["resnet18-mini"] * 3 + ["learned-content-mini"]


def test_a_folder_of_the_6_epoch_suite_is_not_taken_for_a_60_epoch_run(tmp_path):
    job = plan(get_suite("mini-long"), tmp_path)[0]
    job.folder.mkdir(parents=True)
    (job.folder / "config.json").write_text(json.dumps({"preset": "quadratic-mini", "seed": 0, "epochs": 6,
                                                        "checkpoint_every": 1}))
    with pytest.raises(ValueError, match="epochs=6, but quadratic-mini seed 0 needs epochs=60"):
        job_state(job)


def _record(epoch, grid, **extra):
    return {"epoch": epoch, "test_accuracy": 0.5, **{f"attn/layer{n}/grid_distance": d for n, d in enumerate(grid, 1)},
            **extra}


# a hand-written metrics.jsonl: 60 epochs of a 3-layer model, the first layer settling at epoch 20
RECORDS = [_record(e, [1.5 if e < 20 else 0.49, 0.5, 2.0 if e < 60 else 0.1]) for e in range(1, 61)]


def test_settled_criterion_from_a_handwritten_metrics_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert SETTLED_BELOW == 0.5
    rows = settled_rows(records, (6, 20, 40, 60, 80))                # epoch 80 does not exist: left out
    assert rows == [
        {"epoch": 6, "grid_distance": [1.5, 0.5, 2.0], "settled": [False, False, False], "settled_layers": 0},
        {"epoch": 20, "grid_distance": [0.49, 0.5, 2.0], "settled": [True, False, False], "settled_layers": 1},
        {"epoch": 40, "grid_distance": [0.49, 0.5, 2.0], "settled": [True, False, False], "settled_layers": 1},
        {"epoch": 60, "grid_distance": [0.49, 0.5, 0.1], "settled": [True, False, True], "settled_layers": 2}]
    assert settled_rows([{"epoch": 6, "test_accuracy": 0.7}], (6,)) == []          # a ResNet logs none
    lines = settled_lines([{"preset": "quadratic-mini", "seed": 1, **rows[3]}])
    assert lines[2] == "| quadratic-mini | 1 | 60 | 0.49 ✓ | 0.50 | 0.10 ✓ | 2 of 3 |"


def _result(tmp_path, preset, seed, records, machine_json=None):
    folder = tmp_path / preset / f"seed{seed}"
    folder.mkdir(parents=True)
    if machine_json is not None:
        (folder / "machine.json").write_text(json.dumps(machine_json))
    return RunResult(SimpleNamespace(preset=preset, seed=seed, folder=folder), SimpleNamespace(metrics=records))


def test_machine_segments_are_read_and_shown(tmp_path):
    records = [{"epoch": 1, "machine": EPYC, "load_average": 2.1}, {"epoch": 2, "machine": EPYC, "load_average": 4.2},
               {"epoch": 3, "machine": XEON, "load_average": 1.9}, {"epoch": 4, "machine": XEON}]
    segments = machine_segments(records)
    assert segments == [{"epochs": [1, 2], "machine": EPYC, "precision": None},
                        {"epochs": [3, 4], "machine": XEON, "precision": None}]      # written before it was recorded
    assert segments_text(segments) == ("AMD EPYC, 2 threads, torch 2.13.0+cpu (epochs 1-2); "
                                       "Intel Xeon, 2 threads, torch 2.13.0+cpu (epochs 3-4)")
    assert shared_epochs(records) == [2]
    gpu = {"cpu": "Intel Xeon", "threads": 1, "torch": "2.11.0+cu130", "device": "cuda", "gpu": "NVIDIA H100"}
    assert segments_text(machine_segments([{"epoch": 5, "machine": gpu}])) == (
        "Intel Xeon, 1 thread, torch 2.11.0+cu130, NVIDIA H100 (epoch 5)")
    assert machine_segments([{"epoch": 1}]) == [{"epochs": [1, 1], "machine": None, "precision": None}]
    for r in records:
        r.update(seconds=100.0, eval_seconds=8.0, images_per_second=500.0, test_accuracy=0.5)
    result = _result(tmp_path, "resnet18-mini", 0, records)
    costs = run_costs({"resnet18-mini": [result]})
    assert costs[0]["hours"] == pytest.approx(4 * 108 / 3600) and costs[0]["shared_epochs"] == [2]
    line = cost_lines(costs)[2]
    assert line == ("| resnet18-mini | 0 | 4 | 0.12 | 500 | AMD EPYC, 2 threads, torch 2.13.0+cpu (epochs 1-2); "
                    "Intel Xeon, 2 threads, torch 2.13.0+cpu (epochs 3-4) | 2 |")


def test_a_change_of_precision_on_one_machine_starts_a_segment():
    # a bf16 run from before epochs recorded their precision, resumed in fp32 on a CPU without bf16 units
    records = [{"epoch": 1, "machine": EPYC}, {"epoch": 2, "machine": EPYC, "precision": "fp32"},
               {"epoch": 3, "machine": EPYC, "precision": "fp32"}]
    segments = machine_segments(records, precision="bf16")
    assert [(s["epochs"], s["precision"]) for s in segments] == [([1, 1], "bf16"), ([2, 3], "fp32")]
    assert segments_text(segments) == ("AMD EPYC, 2 threads, torch 2.13.0+cpu, bf16 (epoch 1); "
                                       "AMD EPYC, 2 threads, torch 2.13.0+cpu, fp32 (epochs 2-3)")


def test_a_resumed_run_that_goes_on_compiled_starts_a_segment():
    # epochs 1-2 from before records said whether they were compiled, 3 eager, 4-5 compiled
    records = [{"epoch": 1, "machine": XEON, "precision": "bf16"}, {"epoch": 2, "machine": XEON, "precision": "bf16"},
               {"epoch": 3, "machine": XEON, "precision": "bf16", "compiled": False},
               *({"epoch": e, "machine": XEON, "precision": "bf16", "compiled": True} for e in (4, 5))]
    segments = machine_segments(records)
    assert segments == [{"epochs": [1, 2], "machine": XEON, "precision": "bf16"},
                        {"epochs": [3, 3], "machine": XEON, "precision": "bf16", "compiled": False},
                        {"epochs": [4, 5], "machine": XEON, "precision": "bf16", "compiled": True}]
    assert segments_text(segments[1:]) == ("Intel Xeon, 2 threads, torch 2.13.0+cpu, bf16 (epoch 3); "
                                           "Intel Xeon, 2 threads, torch 2.13.0+cpu, bf16, compiled (epochs 4-5)")


def test_report_sections_of_the_long_suite(tmp_path):
    suite = get_suite("mini-long")
    out = tmp_path / "mini-long"
    runs = [_result(out, "quadratic-mini", s, [dict(r, test_accuracy=0.5 + 0.01 * s + r["epoch"] / 1000)
                                               for r in RECORDS]) for s in (0, 1)]
    results = {"quadratic-mini": runs}
    (tmp_path / "mini").mkdir()
    (tmp_path / "mini" / "report.json").write_text(json.dumps({"rows": [
        {"preset": "quadratic-mini", "accuracy_mean": 0.6732, "accuracy_std": 0.0036, "seeds": [0, 1, 2], "epochs": 6},
        {"preset": "learned-content-mini", "accuracy_mean": 0.6122, "accuracy_std": None, "seeds": [0], "epochs": 6}]}))
    rows = [{"preset": "quadratic-mini", "accuracy_mean": 0.565, "accuracy_std": 0.007, "seeds": [0, 1], "epochs": 60,
             "paper": {"accuracy": 0.938}},
            {"preset": "learned-content-mini", "accuracy_mean": None, "accuracy_std": None, "seeds": [], "epochs": None,
             "paper": {"accuracy": 0.871}, "unfinished": "epoch 18 of 60"}]
    md, entry = epoch_sections(suite, out, rows, results)
    text = "\n".join(md)
    assert "## Settled on a grid? (epochs 6, 20, 40, 60)" in text
    assert "| quadratic-mini | 1 | 20 | 0.49 ✓ | 0.50 | 2.00 | 1 of 3 |" in text
    assert "| quadratic-mini | 56.50 ± 0.70 (2 seeds, 60 epochs) | 67.32 ± 0.36 (3 seeds, 6 epochs) | 93.8 |" in text
    # a model with no finished run says how far its run got beside the other suite, not "not run yet"
    assert "| learned-content-mini | unfinished (epoch 18 of 60) | 61.22 (1 seed, 6 epochs) | 87.1 |" in text
    assert [r["epoch"] for r in entry["settled"]] == [6, 20, 40, 60] * 2 and entry["settled_below"] == 0.5
    assert len(settled_table(results, (60,))) == 2
    epochs, mean, low, high = accuracy_bands(runs)
    assert epochs == list(range(1, 61)) and mean[0] == pytest.approx(0.506) and (low[0], high[0]) == (0.501, 0.511)
    curves = seed_layer_curves(runs, "grid_distance")
    assert sorted(curves) == [1, 2, 3] and curves[1][1][1][19] == 0.49


def test_quadratic_heads_from_a_record():
    record = {"attn/layer2/head1/center_row": 1.0, "attn/layer2/head1/center_col": -1.0, "attn/layer2/head1/alpha": 0.5,
              "attn/layer2/head2/center_row": 0.0, "attn/layer2/head2/center_col": 0.0, "attn/layer2/head2/alpha": 2.0}
    centers, invs = quadratic_heads(record, 2)
    assert centers.tolist() == [[1.0, -1.0], [0.0, 0.0]]
    assert np.allclose(invs, [np.eye(2), 4 * np.eye(2)])                     # Sigma^-1 = 2 alpha I
    full = {"attn/layer1/head1/center_row": 0.5, "attn/layer1/head1/center_col": 0.0,
            "attn/layer1/head1/inverse_covariance_rr": 2.0, "attn/layer1/head1/inverse_covariance_rc": 0.3,
            "attn/layer1/head1/inverse_covariance_cc": 1.0}
    assert quadratic_heads(full, 1)[1].tolist() == [[[2.0, 0.3], [0.3, 1.0]]]
    assert quadratic_heads(record, 1) is None
    assert quadratic_heads({"attn/layer1/head1/center_row": 0.0, "attn/layer1/head1/center_col": 0.0}, 1) is None
    assert evolution_epochs(range(1, 61), (6, 20, 40, 60)) == [1, 6, 20, 40, 60]
    assert evolution_epochs([1], (6, 20)) == [1] and evolution_epochs([], (6,)) == []


def test_where_the_centres_went_from_a_handwritten_record(tmp_path):
    heads = [((0.02, -0.98), 5.0), ((1.1, 0.0), 2.0), ((2.5, 2.5), 0.1), ((0.0, 3.0), 1.0)]
    record = {"epoch": 60, "test_accuracy": 0.8}
    for n, ((row, col), alpha) in enumerate(heads, 1):
        record.update({f"attn/layer1/head{n}/center_row": row, f"attn/layer1/head{n}/center_col": col,
                       f"attn/layer1/head{n}/alpha": alpha})
    rows = center_rows({"quadratic-mini": [_result(tmp_path, "quadratic-mini", 2, [record])],
                        "resnet18-mini": [_result(tmp_path, "resnet18-mini", 0, [{"epoch": 60}])]})
    assert len(rows) == 1
    row = rows[0]
    assert (row["seed"], row["epoch"], row["layer"], row["heads"], row["sharp"]) == (2, 60, 1, 4, 2)
    assert row["shifts"] == [(0, -1), (1, 0)]                        # alpha 1.0 is not sharp: above 1 only
    assert row["off_shift"] == pytest.approx(0.1) and row["others_alpha"] == pytest.approx(1.0)
    assert center_lines(rows)[2] == "| quadratic-mini | 2 | 60 | 1 | 2 of 4 | (+0, -1) (+1, +0) | 0.10 | 1.00 |"


def test_the_grid_claim_names_the_seeds_it_averages_and_the_layer_claims_their_seed(tmp_path):
    from attncnn.reproduce.reporting.claims import RunNumbers, evaluate_claims
    from attncnn.reproduce.studies.table1 import TABLE1_CLAIMS

    def records(last):
        return [{"epoch": 1, "test_accuracy": 0.5, "attn/layer1/grid_distance": 1.5},
                {"epoch": 2, "test_accuracy": 0.6, "attn/layer1/grid_distance": last}]

    results = {"quadratic-mini": [_result(tmp_path, "quadratic-mini", seed, records(last))
                                  for seed, last in ((0, 0.9), (1, 1.2), (2, 1.5))]}
    rows = [{"preset": "quadratic-mini", "paper_preset": "quadratic", "accuracy_mean": 0.6}]
    layers = {"quadratic-mini": [{"distance": 2.0, "degenerate_heads": 0}]}
    claims = {c["claim"].split(" ")[0]: c for c in evaluate_claims(TABLE1_CLAIMS, RunNumbers(rows, layers, results))}
    assert claims["early-layer"]["metric"].startswith("quadratic-mini layer 1 (mean over seeds 0, 1, 2): mean head")
    assert claims["early-layer"]["values"] == [1.5, 1.2]                # the mean of 0.9, 1.2 and 1.5 at epoch 2
    assert claims["deeper"]["metric"].startswith("quadratic-mini (seed 0): mean attention distance per layer")
    del results["quadratic-mini"][1:]
    claims = {c["claim"].split(" ")[0]: c for c in evaluate_claims(TABLE1_CLAIMS, RunNumbers(rows, layers, results))}
    assert claims["early-layer"]["metric"].startswith("quadratic-mini layer 1 (seed 0): ")
