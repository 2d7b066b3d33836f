"""The two measurements that set the ``efficiency-scarce`` grid's attributes before it trains.

* Calibration of ``passes`` (seen images per cell, in full training sets): train the grid's
  ``calibrate_rows`` (``resnet18-mini``, ``deit-mini``) on the smallest cell, seed 0, for a given
  number of passes, into ``<out>/calibrate/passes<P>/<row>/<pct>pct/seed0``, and compare their
  train - test gap at the end of the cell with the grid's ``overfit`` criterion (>= 15 points: the
  cell overfits, so it is scarce data). Those folders are the grid's own seed-0 cells at that
  ``passes``: move them into ``<out>`` once the grid's ``passes`` is set, rather than training
  them again.
* Learning-rate sweep of the content models: train the grid's ``sweep_rows`` (``deit-mini``,
  ``convit-mini``) on the smallest cell, seed 0, at each rate into
  ``<out>/lr-sweep/<row>/lr<rate>/<pct>pct/seed0``; the best rate is the one with the highest mean
  final accuracy over those rows on held-out training images (:mod:`.held_out`: outside the cell's
  subset, so the test set that the grid reports does not choose it; among the rates every row has
  finished), and becomes the grid's ``lr``, shared by all its content rows.

Both are ordinary grid jobs (:class:`~attncnn.reproduce.running.jobs.GridJob`), trained by the same
resumable runner, so the same command continues an interrupted measurement. What they measured
is written by :mod:`attncnn.reproduce.reporting.measurements`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...errors import InputError
from ..studies import Grid
from .jobs import GridJob, cell_name, cell_options, folder_name, plan_grid

__all__ = ["parse_rates", "plan_calibration", "plan_lr_sweep", "swept_rates"]


def parse_rates(text: str) -> tuple[float, ...]:
    """``"2.5e-4,5e-4,1e-3"`` -> ``(0.00025, 0.0005, 0.001)``.

    Raises:
        InputError: an entry that is not a positive number, or a repeated rate.
    """
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"--lr-sweep must be comma-separated learning rates like 2.5e-4,5e-4,1e-3, got {text!r}") \
            from None
    if not rates or any(r <= 0 for r in rates) or len(set(rates)) != len(rates):
        raise InputError(f"--lr-sweep must list distinct learning rates > 0, like 2.5e-4,5e-4,1e-3; got {text!r}")
    return rates


def _rows(grid: Grid, rows: tuple[str, ...], what: str, option: str) -> tuple[str, ...]:
    if not rows:
        raise InputError(f"the {grid.name} grid has no {what}, so {option} does not apply to it; use it with "
                         "efficiency-scarce")
    return rows


def plan_calibration(grid: Grid, out: str | Path, *, passes: int | None = None, train_images: int | None = None,
                     lr: float | None = None, fraction: float | None = None) -> list[GridJob]:
    """The calibration's jobs: the grid's ``calibrate_rows`` on its smallest cell (or ``fraction``),
    seed 0, for ``passes`` (None: the grid's), in ``<out>/calibrate/passes<P>``.

    Raises:
        InputError: a grid without ``calibrate_rows`` or ``overfit``; bad ``passes`` (see
            :func:`~attncnn.reproduce.running.jobs.plan_grid`).
    """
    rows = _rows(grid, grid.calibrate_rows, "calibration rows", "--calibrate")
    if grid.overfit is None:
        raise InputError(f"the {grid.name} grid declares no overfit criterion to judge its calibration by")
    passes = grid.passes if passes is None else passes
    return plan_grid(grid, Path(out) / "calibrate" / f"passes{passes}", seeds=(0,), only=rows,
                     train_images=train_images, passes=passes, fractions=(fraction or grid.fractions[0],), lr=lr)


def plan_lr_sweep(grid: Grid, out: str | Path, rates: Sequence[float], *, passes: int | None = None,
                  train_images: int | None = None, fraction: float | None = None) -> list[GridJob]:
    """The sweep's jobs: per rate (in the given order), the grid's ``sweep_rows`` on its smallest
    cell (or ``fraction``), seed 0, into ``<out>/lr-sweep/<row>/lr<rate>/<pct>pct/seed0``; cells are
    named ``"10 % lr 0.0005"``.

    Raises:
        InputError: a grid without ``sweep_rows``; ``passes`` < 1; a cell that is not a whole
            number of epochs (see :func:`~attncnn.reproduce.running.jobs.cell_options`).
    """
    rows = _rows(grid, grid.sweep_rows, "learning-rate sweep rows", "--lr-sweep")
    passes = grid.passes if passes is None else passes
    if passes < 1:
        raise InputError(f"--passes must be >= 1, got {passes}")
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
