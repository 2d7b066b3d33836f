"""The committed sample-efficiency grids (results/efficiency, results/efficiency-scarce): the report's
cells are the finished run folders' final accuracies, a shipped cell evaluates to its reported
accuracy, and the folder stays small. Cells not trained yet, or committed unfinished (`--ship`), are
listed in the report as missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.reproduce import job_state, plan_grid
from attncnn.reproduce.running.runner import row_of
from attncnn.reproduce.studies import EFFICIENCY, EFFICIENCY_SCARCE

ROOT = Path(__file__).resolve().parents[2] / "results"
pytestmark = pytest.mark.slow
SHIPPED = pytest.mark.parametrize("grid", [EFFICIENCY, EFFICIENCY_SCARCE], ids=lambda grid: grid.name)


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


@pytest.mark.parametrize("grid, row, cell, folder", [
    (EFFICIENCY, "resnet18-mini", "10 %", "10pct"),
    (EFFICIENCY_SCARCE, "resnet18-mini", "10 %", "10pct"),
    # trained on a GPU (its machine.json), evaluated here; where bf16 is slow, results/mini's
    # quadratic-mini stands for its code path (tests/reproduce/test_shipped_results.py)
    pytest.param(EFFICIENCY_SCARCE, "quadratic-mini", "100 %", "100pct", marks=pytest.mark.needs_fast_bf16),
], ids=lambda value: getattr(value, "name", value))
def test_a_shipped_cell_reproduces_its_reported_accuracy(grid, row, cell, folder, check_shipped_run):
    entry = next(r for r in _report(grid)["rows"] if r["preset"] == row)["cells"][cell]
    if not entry["seeds"]:
        pytest.skip(f"the {row} {cell} cell is not committed yet")
    check_shipped_run(ROOT / grid.name / row / folder / f"seed{entry['seeds'][0]}", entry["accuracies"][0])


@SHIPPED
def test_grid_results_stay_small(grid):
    _report(grid)
    folder = ROOT / grid.name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 60e6, f"results/{grid.name} holds {size / 1e6:.1f} MB; ship fewer cells or leaner folders"
    # A trimmed run folder is its weights (~1.2-1.4 MB for the mini models) and its metrics (up to 1.6 MB
    # with per-head attention statistics over 80 epochs); an untrimmed one keeps the optimiser state (as
    # large again as the weights, AdamW's twice), `best` and the events: 6.9-9.4 MB. Unfinished folders
    # keep what resuming needs.
    for run in (p.parent for p in folder.rglob("finished.json")):
        run_size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
        assert run_size < 3.5e6, f"{run} holds {run_size / 1e6:.1f} MB; trim it (--report-only --trim)"


def test_the_readme_table_is_the_scarce_grids_report():
    """The README's ConViT table quotes results/efficiency-scarce/report.json (mean ± std over seeds)."""
    report = _report(EFFICIENCY_SCARCE)
    readme = (ROOT.parent / "README.md").read_text()
    section = readme.split("## ConViT's claims where data is scarce")[1].split("\n## ")[0]
    header = next(line for line in section.splitlines() if line.startswith("| test acc."))
    rows = [name.strip(" `") for name in header.split("|")[2:-1]]
    by_row = {row["preset"]: row["cells"] for row in report["rows"]}
    for line in (line for line in section.splitlines() if line.startswith(("| 10 %", "| 100 %"))):
        cell, *values = [part.strip() for part in line.split("|")[1:-1]]
        for row, value in zip(rows, values, strict=True):
            entry = by_row[row][cell]
            expected = f"{100 * entry['accuracy_mean']:.2f}" + (
                "" if entry["accuracy_std"] is None else f" ± {100 * entry['accuracy_std']:.2f}")
            assert value == expected, (row, cell)
