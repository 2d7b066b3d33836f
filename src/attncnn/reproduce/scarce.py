"""The two measurements that set the ``efficiency-scarce`` grid's attributes (issue 26) before it trains.

* Calibration of ``passes`` (seen images per cell, in full training sets): train the grid's
  ``calibrate_rows`` (``resnet18-mini``, ``deit-mini``) on the smallest cell, seed 0, for a given
  number of passes, into ``<out>/calibrate/passes<P>/<row>/<pct>pct/seed0``, and compare their
  train - test gap at the end of the cell with the issue's criterion (>= 15 points: the cell
  overfits, so it is scarce data). Those folders are the grid's own seed-0 cells at that
  ``passes``: move them into ``<out>`` once the grid's ``passes`` is set, rather than training
  them again.
* Learning-rate sweep of the content models: train the grid's ``sweep_rows`` (``deit-mini``,
  ``convit-mini``) on the smallest cell, seed 0, at each rate into
  ``<out>/lr-sweep/<row>/lr<rate>/<pct>pct/seed0``; the best rate is the one with the highest mean
  final accuracy over those rows on held-out training images (:mod:`.held_out`: outside the cell's
  subset, so the test set that the grid reports does not choose it; among the rates every row has
  finished), and becomes the grid's ``lr``, shared by all its content rows.

Both are ordinary grid jobs (:class:`~attncnn.reproduce.grid.GridJob`), trained by the same
resumable runner, so the same command continues an interrupted measurement.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from .._io import atomic_write_text
from .grid import Grid, GridJob, cell_name, cell_options, folder_name, plan_grid, row_of
from .held_out import HELD_OUT_IMAGES
from .scarce_report import SCARCE_GAP, read_records, train_test_gap
from .suites import Job

__all__ = ["parse_rates", "plan_calibration", "calibration_lines", "plan_lr_sweep", "swept_rates", "sweep_results",
           "write_sweep_report"]


def parse_rates(text: str) -> tuple[float, ...]:
    """``"2.5e-4,5e-4,1e-3"`` -> ``(0.00025, 0.0005, 0.001)``.

    Raises:
        ValueError: an entry that is not a positive number, or a repeated rate.
    """
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--lr-sweep must be comma-separated learning rates like 2.5e-4,5e-4,1e-3, got {text!r}") \
            from None
    if not rates or any(r <= 0 for r in rates) or len(set(rates)) != len(rates):
        raise ValueError(f"--lr-sweep must list distinct learning rates > 0, like 2.5e-4,5e-4,1e-3; got {text!r}")
    return rates


def _rows(grid: Grid, rows: tuple[str, ...], what: str, option: str) -> tuple[str, ...]:
    if not rows:
        raise ValueError(f"the {grid.name} grid has no {what}, so {option} does not apply to it; use it with "
                         "efficiency-scarce")
    return rows


def plan_calibration(grid: Grid, out: str | Path, *, passes: int | None = None, train_images: int | None = None,
                     lr: float | None = None, fraction: float | None = None) -> list[GridJob]:
    """The calibration's jobs: the grid's ``calibrate_rows`` on its smallest cell (or ``fraction``),
    seed 0, for ``passes`` (None: the grid's), in ``<out>/calibrate/passes<P>``.

    Raises:
        ValueError: a grid without ``calibrate_rows``; bad ``passes`` (see :func:`plan_grid`).
    """
    rows = _rows(grid, grid.calibrate_rows, "calibration rows", "--calibrate")
    passes = grid.passes if passes is None else passes
    return plan_grid(grid, Path(out) / "calibrate" / f"passes{passes}", seeds=(0,), only=rows,
                     train_images=train_images, passes=passes, fractions=(fraction or grid.fractions[0],), lr=lr)


def calibration_lines(jobs: Sequence[Job]) -> list[str]:
    """One line per calibration job: its train - test gap at the end of the cell beside the
    criterion (>= 15 points), then whether every finished row meets it."""
    found, lines, met = read_records(jobs), [], []
    for job in jobs:
        runs = found.get((row_of(job), job.cell))
        gap = train_test_gap(runs[0]) if runs else None
        if gap is None:
            lines.append(f"{job.label}: not finished yet ({job.folder})")
            met.append(None)
            continue
        last = runs[0][-1]
        met.append(gap >= SCARCE_GAP)
        lines.append(f"{job.label}: train {100 * last['train_accuracy']:.2f} %, test {100 * last['test_accuracy']:.2f} "
                     f"%, gap {100 * gap:+.2f} points (criterion >= {100 * SCARCE_GAP:.0f}: "
                     f"{'met' if met[-1] else 'not met'})")
    cell = dict(jobs[0].overrides)
    seen = cell["train_subset"] * cell["epochs"]
    if None in met:
        lines.append(f"criterion not judged yet: a run has not finished ({seen:,} seen images per cell)")
    else:
        lines.append(f"{seen:,} seen images per cell: the {jobs[0].cell} cell "
                     f"{'overfits by the criterion' if all(met) else 'does NOT overfit enough: try more --passes'}")
    return lines


def plan_lr_sweep(grid: Grid, out: str | Path, rates: Sequence[float], *, passes: int | None = None,
                  train_images: int | None = None, fraction: float | None = None) -> list[GridJob]:
    """The sweep's jobs: per rate (in the given order), the grid's ``sweep_rows`` on its smallest
    cell (or ``fraction``), seed 0, into ``<out>/lr-sweep/<row>/lr<rate>/<pct>pct/seed0``; cells are
    named ``"10 % lr 0.0005"``.

    Raises:
        ValueError: a grid without ``sweep_rows``; ``passes`` < 1; a cell that is not a whole
            number of epochs (see :func:`cell_options`).
    """
    rows = _rows(grid, grid.sweep_rows, "learning-rate sweep rows", "--lr-sweep")
    passes = grid.passes if passes is None else passes
    if passes < 1:
        raise ValueError(f"--passes must be >= 1, got {passes}")
    fraction = fraction or grid.fractions[0]
    cell = cell_options(fraction, train_images=train_images or grid.train_images, passes=passes,
                        evaluations=grid.evaluations)
    folder = Path(out) / "lr-sweep"
    return [GridJob(grid.preset_of(row), 0, folder / row / f"lr{rate:g}" / folder_name(fraction) / "seed0",
                    tuple(sorted({**cell, **grid.row_overrides(row), "lr": rate}.items())),
                    f"{cell_name(fraction)} lr {rate:g}", row=row)
            for rate in rates for row in rows]


def swept_rates(jobs: Sequence[GridJob], rates: Sequence[float]) -> tuple[float, ...]:
    """``rates`` and the rates of sweep runs already on disk beside ``jobs`` (:func:`plan_lr_sweep`'s
    for ``rates``): every ``lr<rate>`` folder of the same rows and cell holding a ``config.json``,
    ascending. A folder is named by its rate's ``g`` format, so one whose name is a given rate's is
    that rate (``rates`` keep their exact values, which the runs' ``config.json`` record).

    A sweep trained one rate per command (``--lr-sweep 2.5e-4 --only convit-mini``, e.g. side by side
    on a GPU) is reported as a whole: its report must not call a rate the best while another
    rate's runs, finished or not, sit beside it unreported.
    """
    found = {f"{rate:g}": rate for rate in rates}
    for cell_folder in {Path(job.folder).parent for job in jobs}:       # <out>/lr-sweep/<row>/lr<rate>/<pct>pct
        for candidate in cell_folder.parents[1].glob("lr*"):
            if candidate.name[2:] not in found and (candidate / cell_folder.name / "seed0" / "config.json").is_file():
                try:
                    found[candidate.name[2:]] = float(candidate.name[2:])
                except ValueError:                                       # not a rate's folder
                    continue
    return tuple(sorted(found.values()))


def sweep_results(grid: Grid, jobs: Sequence[Job], rates: Sequence[float],
                  held_out: Mapping[Path, dict | None] | None = None) -> dict:
    """Per rate, each sweep row's final held-out accuracy (:mod:`.held_out`: training images outside
    the cell's subset; None: not finished or not measured) and their mean (None unless every row
    has one), beside the final test accuracy for information; ``best``: the rate of the highest
    held-out mean (None: no rate complete). The test set never chooses the rate: the grid reports
    it afterwards.

    Args:
        held_out: ``{job folder: held-out result}`` (:func:`~.held_out.held_out_results`).
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
