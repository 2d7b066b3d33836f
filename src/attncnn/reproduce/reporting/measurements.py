"""What the ``efficiency-scarce`` grid's two measurements found
(:mod:`attncnn.reproduce.running.measurements`): the calibration's train - test gaps beside the
grid's ``overfit`` criterion, and the learning-rate sweep's report (``<out>/lr-sweep/report.md``
and ``report.json``). Everything is read from the runs' ``metrics.jsonl`` and the held-out
results; nothing is trained here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from ..._io import atomic_write_text
from ..running.held_out import HELD_OUT_IMAGES
from ..running.jobs import Job, row_of
from ..studies import Criterion, Grid
from .claims import judge
from .results import read_records, train_test_gap

__all__ = ["calibration_lines", "sweep_results", "write_sweep_report"]


def calibration_lines(jobs: Sequence[Job], criterion: Criterion) -> list[str]:
    """One line per calibration job: its train - test gap at the end of the cell beside the grid's
    ``overfit`` criterion (``gap >= 0.15``: 15 points), then whether every finished row meets it."""
    found, lines, met = read_records(jobs), [], []
    for job in jobs:
        runs = found.get((row_of(job), job.cell))
        gap = train_test_gap(runs[0]) if runs else None
        if gap is None:
            lines.append(f"{job.label}: not finished yet ({job.folder})")
            met.append(None)
            continue
        last = runs[0][-1]
        met.append(judge(criterion, gap))
        lines.append(f"{job.label}: train {100 * last['train_accuracy']:.2f} %, test {100 * last['test_accuracy']:.2f} "
                     f"%, gap {100 * gap:+.2f} points (criterion {criterion.op} {100 * criterion.threshold:.0f}: "
                     f"{'met' if met[-1] else 'not met'})")
    cell = dict(jobs[0].overrides)
    seen = cell["train_subset"] * cell["epochs"]
    if None in met:
        lines.append(f"criterion not judged yet: a run has not finished ({seen:,} seen images per cell)")
    else:
        lines.append(f"{seen:,} seen images per cell: the {jobs[0].cell} cell "
                     f"{'overfits by the criterion' if all(met) else 'does NOT overfit enough: try more --passes'}")
    return lines


def sweep_results(grid: Grid, jobs: Sequence[Job], rates: Sequence[float],
                  held_out: Mapping[Path, dict | None] | None = None) -> dict:
    """Per rate, each sweep row's final held-out accuracy (training images outside the cell's
    subset, :mod:`~attncnn.reproduce.running.held_out`; None: not finished or not measured) and
    their mean (None unless every row has one), beside the final test accuracy for information;
    ``best``: the rate of the highest held-out mean (None: no rate complete). The test set never
    chooses the rate: the grid reports it afterwards.

    Args:
        held_out: ``{job folder: held-out result}``
            (:func:`~attncnn.reproduce.running.held_out.held_out_results`).
    """
    found, held_out = read_records(jobs), held_out or {}
    table = []
    for rate in rates:
        test, valid = {}, {}
        for job in (j for j in jobs if dict(j.overrides)["lr"] == rate):
            runs = found.get((row_of(job), job.cell))
            tested = [r for r in runs[0] if "test_accuracy" in r] if runs else []
            test[row_of(job)] = tested[-1]["test_accuracy"] if tested else None
            result = held_out.get(Path(job.folder))
            valid[row_of(job)] = result["accuracy"] if result else None
        table.append({"lr": rate, "held_out": valid, "held_out_mean": _mean(valid.values()), "test": test,
                      "test_mean": _mean(test.values())})
    complete = [entry for entry in table if entry["held_out_mean"] is not None]
    best = max(complete, key=lambda entry: entry["held_out_mean"])["lr"] if complete else None
    return {"grid": grid.name, "rows": list(grid.sweep_rows), "rates": table, "best": best}


def _mean(values) -> float | None:
    values = list(values)
    return None if None in values or not values else sum(values) / len(values)


def _percent(value: float | None) -> str:
    return "not finished yet" if value is None else f"{100 * value:.2f}"


def write_sweep_report(grid: Grid, out: str | Path, jobs: Sequence[Job], rates: Sequence[float], *,
                       command: str, held_out: Mapping[Path, dict | None] | None = None) -> list[str]:
    """Write ``<out>/lr-sweep/report.md`` and ``report.json`` (:func:`sweep_results`); returns the
    Markdown lines (the command prints them).

    Raises:
        OSError: ``out`` not writable.
    """
    found = sweep_results(grid, jobs, rates, held_out)
    rows = found["rows"]
    cell = dict(jobs[0].overrides)
    header = "| lr | " + " | ".join(rows) + " | mean |"
    rule = "|---" * (len(rows) + 2) + "|"
    lines = [f"# Learning-rate sweep of the {grid.name} grid's content models", "",
             f"AdamW on the {jobs[0].cell.split(' lr')[0]} cell, seed 0 ({cell['epochs']} epochs of "
             f"{cell['train_subset']:,} images). Written by `{command}`.", "",
             f"Held-out accuracy (%) at the last epoch, which chooses the rate: {HELD_OUT_IMAGES:,} training images "
             f"outside the cell's {cell['train_subset']:,} (class-balanced, never trained on), so that the test set, "
             "which the grid reports, does not choose it:", "", header, rule]
    lines += [f"| {entry['lr']:g} | " + " | ".join(_percent(entry["held_out"].get(row)) for row in rows)
              + f" | {_percent(entry['held_out_mean'])} |" for entry in found["rates"]]
    lines += ["", "Test accuracy (%) at the last epoch, for information:", "", header, rule]
    lines += [f"| {entry['lr']:g} | " + " | ".join(_percent(entry["test"].get(row)) for row in rows)
              + f" | {_percent(entry['test_mean'])} |" for entry in found["rates"]]
    best = found["best"]
    missing = sum(entry["held_out_mean"] is None for entry in found["rates"])
    if best is None:
        verdict = "not measured yet"
    elif missing:       # a rate still training could be the best one
        verdict = (f"{best:g} so far, among the rates every row has finished; {missing} of {len(found['rates'])} "
                   "not finished yet, so leave the grid's `lr` until they are")
    else:
        verdict = f"{best:g} (set the grid's `lr` to it)"
    lines += ["", f"Best rate for {' and '.join(rows)} together (highest held-out mean): {verdict}"]
    folder = Path(out) / "lr-sweep"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "report.json", json.dumps({**found, "command": command}, indent=1) + "\n")
    atomic_write_text(folder / "report.md", "\n".join(lines) + "\n")
    return lines
