"""The committed reduced-scale study (results/mini): every shipped model evaluates to the accuracy
its report states, and the report's table matches the run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.cli import main
from attncnn.reproduce import get_suite, job_state, plan

RESULTS = Path(__file__).resolve().parents[2] / "results" / "mini"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (RESULTS / "report.json").is_file(), reason="no committed results/mini")]


def _report() -> dict:
    return json.loads((RESULTS / "report.json").read_text())


def test_report_rows_are_the_finished_run_folders():
    report = _report()
    for row in report["rows"]:
        folders = [RESULTS / row["preset"] / f"seed{s}" for s in row["seeds"]]
        assert all((f / "finished.json").is_file() for f in folders)
        accuracies = [json.loads((f / "metrics.jsonl").read_text().splitlines()[-1])["test_accuracy"] for f in folders]
        assert accuracies == row["accuracies"]
    unfinished = [j.label for j in plan(get_suite("mini"), RESULTS) if job_state(j) != "finished"]
    assert sorted(unfinished) == sorted(report["missing"])


def test_shipped_checkpoints_reproduce_the_reported_accuracy(cifar10_path, capsys):
    # The report's accuracy is the last epoch's, measured during training (bf16 on the training
    # machine); `attncnn evaluate <folder>` loads `best` when it differs from `last`, so compare `last`.
    for row in _report()["rows"]:
        for seed, accuracy in zip(row["seeds"], row["accuracies"]):
            last = RESULTS / row["preset"] / f"seed{seed}" / "checkpoints" / "last.safetensors"
            assert main(["evaluate", str(last), "--data", str(cifar10_path), "--json"]) == 0
            measured = json.loads(capsys.readouterr().out)["test_accuracy"]
            # bf16 kernels may round differently on another CPU: allow 10 of the 10,000 images
            assert measured == pytest.approx(accuracy, abs=1e-3), (row["preset"], seed)


def test_results_stay_small():
    size = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert size < 40e6, f"results/mini holds {size / 1e6:.1f} MB; trim it (attncnn reproduce mini --trim)"
