"""The committed sample-efficiency grid (results/efficiency): the report's cells are the finished
run folders' final accuracies, a shipped cell evaluates to its reported accuracy, and the folder
stays small. Cells still training are not committed, so the report lists them as missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.cli import main
from attncnn.reproduce import GRID, job_state, plan_grid

RESULTS = Path(__file__).resolve().parents[2] / "results" / "efficiency"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (RESULTS / "report.json").is_file(), reason="no committed results/efficiency")]


def _report() -> dict:
    return json.loads((RESULTS / "report.json").read_text())


def test_report_cells_are_the_finished_run_folders():
    report, jobs = _report(), plan_grid(GRID, RESULTS)
    for row in report["rows"]:
        for cell, entry in row["cells"].items():
            job = next(j for j in jobs if (j.preset, j.cell) == (row["preset"], cell))
            finals = [json.loads((job.folder.parent / f"seed{s}" / "metrics.jsonl").read_text().splitlines()[-1])
                      ["test_accuracy"] for s in entry["seeds"]]
            assert finals == entry["accuracies"], (row["preset"], cell)
    assert sorted(report["missing"]) == sorted(j.label for j in jobs if job_state(j) != "finished")


def test_a_shipped_cell_reproduces_its_reported_accuracy(cifar10_path, capsys):
    entry = next(row for row in _report()["rows"] if row["preset"] == "resnet18-mini")["cells"]["10 %"]
    if not entry["seeds"]:
        pytest.skip("the resnet18-mini 10 % cell is not committed yet")
    folder = RESULTS / "resnet18-mini" / "10pct" / f"seed{entry['seeds'][0]}"
    assert main(["evaluate", str(folder), "--data", str(cifar10_path), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)["test_accuracy"]
    assert measured == pytest.approx(entry["accuracies"][0], abs=1e-3)     # bf16 rounding on another CPU


def test_grid_results_stay_small():
    size = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert size < 40e6, f"results/efficiency holds {size / 1e6:.1f} MB; trim it (--report-only --trim)"
