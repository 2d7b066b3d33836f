"""The committed sample-efficiency grids (results/efficiency, results/efficiency-scarce): the report's
cells are the finished run folders' final accuracies, a shipped cell evaluates to its reported
accuracy, and the folder stays small. Cells not trained yet, or committed unfinished (`--ship`), are
listed in the report as missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.cli import main
from attncnn.reproduce import GRID, job_state, plan_grid
from attncnn.reproduce.grid import SCARCE_GRID, row_of

ROOT = Path(__file__).resolve().parents[2] / "results"
pytestmark = pytest.mark.slow
SHIPPED = pytest.mark.parametrize("grid", [GRID, SCARCE_GRID], ids=lambda grid: grid.name)


def _report(grid) -> dict:
    path = ROOT / grid.name / "report.json"
    if not path.is_file():
        pytest.skip(f"no committed results/{grid.name}")
    return json.loads(path.read_text())


@SHIPPED
def test_report_cells_are_the_finished_run_folders(grid):
    report, jobs = _report(grid), plan_grid(grid, ROOT / grid.name)
    for row in report["rows"]:
        for cell, entry in row["cells"].items():
            job = next(j for j in jobs if (row_of(j), j.cell) == (row["preset"], cell))
            finals = [json.loads((job.folder.parent / f"seed{s}" / "metrics.jsonl").read_text().splitlines()[-1])
                      ["test_accuracy"] for s in entry["seeds"]]
            assert finals == entry["accuracies"], (row["preset"], cell)
    assert sorted(report["missing"]) == sorted(j.label for j in jobs if job_state(j) != "finished")


@SHIPPED
def test_a_shipped_cell_reproduces_its_reported_accuracy(grid, cifar10_path, capsys):
    entry = next(row for row in _report(grid)["rows"] if row["preset"] == "resnet18-mini")["cells"]["10 %"]
    if not entry["seeds"]:
        pytest.skip("the resnet18-mini 10 % cell is not committed yet")
    folder = ROOT / grid.name / "resnet18-mini" / "10pct" / f"seed{entry['seeds'][0]}"
    assert main(["evaluate", str(folder), "--data", str(cifar10_path), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)["test_accuracy"]
    assert measured == pytest.approx(entry["accuracies"][0], abs=1e-3)     # bf16 rounding on another CPU


@SHIPPED
def test_grid_results_stay_small(grid):
    _report(grid)
    size = sum(p.stat().st_size for p in (ROOT / grid.name).rglob("*") if p.is_file())
    assert size < 40e6, f"results/{grid.name} holds {size / 1e6:.1f} MB; trim it (--report-only --trim)"
