"""The two measurements that set the ``efficiency-scarce`` grid's attributes before it trains, each
on its smallest cell, seed 0 (:func:`plan_calibration`, :func:`plan_lr_sweep`).

* Calibration of ``passes`` (seen images per cell, in full training sets): the grid's
  ``calibrate_rows``' train - test gap at the end of the cell against the grid's ``overfit``
  criterion (>= 15 points: the cell overfits, so it is scarce data). Those folders are the grid's own
  seed-0 cells at that ``passes``: move them into ``<out>`` once ``passes`` is set, rather than
  training them again.
* Learning-rate sweep of the content models (``sweep_rows``): the best rate is the one with the
  highest mean final accuracy over those rows on held-out training images (among the rates every row
  has finished), and becomes the ``lr`` of the grid's content rows.

Both are ordinary grid jobs of a cell, trained by the same resumable runner, so the same command
continues an interrupted measurement; :func:`calibration_lines` and :func:`write_sweep_report`
(``<out>/lr-sweep/report.md`` and ``report.json``) say what they measured.

Why held-out accuracy: the grid reports its content cells' test accuracy, so choosing their rate by
that same test accuracy would let the test set pick a hyper-parameter of what it measures. The
sweep's 10 % cell trains on 5,000 of CIFAR-10's 50,000 training images; the 45,000 it never sees
hold a clean validation set (:func:`attncnn.data.held_out_indices`: class-balanced, seeded by the
run's seed). The result is cached in the run folder as ``held_out.json``, so the report is rewritten
without the data set once every run has one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..._io import atomic_write_json, atomic_write_text
from ...data import Dataset, DeviceLoader, ImageSplit, held_out_indices
from ...errors import InputError
from ...perf import resolve_device
from ...perf.precision import machine_precision
from ...runs import RunFolder, load_model, trained_precision
from ...runs.checkpoint import read_metadata
from ...training import evaluate
from ..reporting.claims import judge
from ..reporting.results import read_records, train_test_gap
from ..studies import Criterion, Grid
from .runner import Job, cell_name, folder_name, grid_cells, plan_grid, row_job, row_of

__all__ = ["plan_calibration", "plan_lr_sweep", "swept_rates", "HELD_OUT_IMAGES", "HELD_OUT_FILE",
           "held_out_results", "calibration_lines", "sweep_results", "write_sweep_report"]


def _rows(grid: Grid, rows: tuple[str, ...], what: str, option: str) -> tuple[str, ...]:
    if not rows:
        raise InputError(f"the {grid.name} grid has no {what}, so {option} does not apply to it; use it with "
                         "efficiency-scarce")
    return rows


def plan_calibration(grid: Grid, out: str | Path, *, passes: int | None = None, train_images: int | None = None,
                     lr: float | None = None, fraction: float | None = None) -> list[Job]:
    """The calibration's jobs: the grid's ``calibrate_rows`` on its smallest cell (or ``fraction``),
    seed 0, for ``passes`` (None: the grid's), in ``<out>/calibrate/passes<P>``.

    Raises:
        InputError: a grid without ``calibrate_rows`` or ``overfit``; bad ``passes`` (see
            :func:`~attncnn.reproduce.running.runner.plan_grid`).
    """
    rows = _rows(grid, grid.calibrate_rows, "calibration rows", "--calibrate")
    if grid.overfit is None:
        raise InputError(f"the {grid.name} grid declares no overfit criterion to judge its calibration by")
    passes = grid.passes if passes is None else passes
    return plan_grid(grid, Path(out) / "calibrate" / f"passes{passes}", seeds=(0,), only=rows,
                     train_images=train_images, passes=passes, fractions=(fraction or grid.fractions[0],), lr=lr)


def plan_lr_sweep(grid: Grid, out: str | Path, rates: Sequence[float], *, passes: int | None = None,
                  train_images: int | None = None, fraction: float | None = None) -> list[Job]:
    """The sweep's jobs: per rate (in the given order), the grid's ``sweep_rows`` on its smallest
    cell (or ``fraction``), seed 0, into ``<out>/lr-sweep/<row>/lr<rate>/<pct>pct/seed0``; cells are
    named ``"10 % lr 0.0005"``.

    Raises:
        InputError: a grid without ``sweep_rows``; ``passes`` < 1; a cell that is not a whole
            number of epochs (see :func:`~attncnn.reproduce.running.runner.grid_cells`).
    """
    rows = _rows(grid, grid.sweep_rows, "learning-rate sweep rows", "--lr-sweep")
    fraction = fraction or grid.fractions[0]
    cell = grid_cells(grid, passes=passes, train_images=train_images, fractions=(fraction,))[fraction]
    folder = Path(out) / "lr-sweep"
    return [row_job(grid, row, 0, folder / row / f"lr{rate:g}" / folder_name(fraction) / "seed0",
                    {**cell, "lr": rate}, f"{cell_name(fraction)} lr {rate:g}")
            for rate in rates for row in rows]


def swept_rates(jobs: Sequence[Job], rates: Sequence[float]) -> tuple[float, ...]:
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


#: validation images per run: as many as the test set, so both accuracies have the same binomial
#: noise (about +-0.5 points at 55 %)
HELD_OUT_IMAGES = 10_000
#: the cache in the run folder (kept when the folder is trimmed for committing)
HELD_OUT_FILE = "held_out.json"


def _key(folder: Path, images: int) -> dict | None:
    """What the cached result must match: the ``last`` checkpoint's epoch, the held-out size and the
    training subset it complements; None while the run has not finished."""
    if not (folder / "finished.json").is_file():
        return None                                    # also a cell not started: no folder at all
    last = RunFolder(folder, mode="read").checkpoint_path("last")
    if not last.is_file():
        return None
    meta = read_metadata(last)
    config = json.loads((folder / "config.json").read_text())
    if not config.get("train_subset"):
        raise InputError(f"run {folder} trained on the whole training set: no image is held out to validate on; "
                         "validate runs of a subset cell (--train-subset)")
    return {"epoch": int(meta["epoch"]), "images": images, "train_subset": int(config["train_subset"]),
            "seed": int(config["seed"]), "dataset_name": meta.get("dataset_name")}


def _measure(folder: Path, key: dict, dataset: Dataset | None, device: str) -> dict:
    """Evaluate the run's ``last`` checkpoint on its held-out images and cache the result (errors:
    :func:`held_out_results`)."""
    if dataset is None:
        raise InputError(f"run {folder} has no held-out accuracy yet; give --data (the data set it trained on) to "
                         "measure it")
    if key["dataset_name"] and dataset.digest not in key["dataset_name"]:
        raise InputError(f"run {folder} trained on {key['dataset_name']}, not on {dataset.shareable_name}: its "
                         "held-out images would be other images; give --data the run's data set")
    device = resolve_device(device)
    idx = held_out_indices(dataset.train.labels, key["train_subset"], key["seed"], key["images"])
    split = ImageSplit(dataset.train.images[idx], dataset.train.labels[idx])
    last = RunFolder(folder, mode="read").checkpoint_path("last")
    model, meta = load_model(last, device)
    # the run's own precision, but fp32 for a bf16 run where bf16 is slow (same accuracy, many times faster there)
    precision = machine_precision(trained_precision(last, meta), device, what=f"run {folder}")
    result = evaluate(model, DeviceLoader(split, batch_size=500, device=device, train=False), precision=precision)
    found = {**key, "accuracy": result.accuracy, "loss": result.loss, "examples": result.examples,
             "precision": precision}
    atomic_write_json(folder / HELD_OUT_FILE, found)
    return found


def held_out_results(folders, load_dataset: Callable[[], Dataset | None], *, images: int = HELD_OUT_IMAGES,
                     device: str = "cpu") -> dict:
    """Loss and accuracy of each finished subset run's ``last`` checkpoint in ``folders`` on ``images``
    training images outside its subset, at the run's precision (fp32 for a bf16 run on a device without
    fast bf16); cached in ``<folder>/held_out.json``. ``load_dataset()`` returns the data set and is
    called once, only if some finished run has no cached result.

    Returns:
        ``{folder: result}``, each result ``{"accuracy", "loss", "examples", "epoch", "images",
        "train_subset", "seed", "dataset_name", "precision"}``, or None for a run that has not finished.

    Raises:
        InputError: no data set (``load_dataset()`` returns None) and nothing cached (give the command
            ``--data``); a data set other than the run's (its pixel digest differs); a run on the whole
            training set.
    """
    dataset = None
    found = {}
    for folder in map(Path, folders):
        key = _key(folder, images)                      # read once: it opens the checkpoint's header
        cache = folder / HELD_OUT_FILE
        cached = json.loads(cache.read_text()) if key and cache.is_file() else None
        if key is None or (cached and all(cached.get(k) == v for k, v in key.items())):
            found[folder] = cached
            continue
        if dataset is None:
            dataset = load_dataset()
        found[folder] = _measure(folder, key, dataset, device)
    return found


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
    subset, :func:`held_out_results`; None: not finished or not measured) and
    their mean (None unless every row has one), beside the final test accuracy for information;
    ``best``: the rate of the highest held-out mean (None: no rate complete). The test set never
    chooses the rate: the grid reports it afterwards.

    Args:
        held_out: ``{job folder: held-out result}``
            (:func:`held_out_results`).
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


def _rate_table(found: dict, key: str) -> list[str]:
    """Markdown table of :func:`sweep_results`' ``key`` accuracies (``"held_out"`` or ``"test"``) per rate and row."""
    rows = found["rows"]
    return ["| lr | " + " | ".join(rows) + " | mean |", "|---" * (len(rows) + 2) + "|"] + [
        f"| {entry['lr']:g} | " + " | ".join(_percent(entry[key].get(row)) for row in rows)
        + f" | {_percent(entry[f'{key}_mean'])} |" for entry in found["rates"]]


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
    lines = [f"# Learning-rate sweep of the {grid.name} grid's content models", "",
             f"AdamW on the {jobs[0].cell.split(' lr')[0]} cell, seed 0 ({cell['epochs']} epochs of "
             f"{cell['train_subset']:,} images). Written by `{command}`.", "",
             f"Held-out accuracy (%) at the last epoch, which chooses the rate: {HELD_OUT_IMAGES:,} training images "
             f"outside the cell's {cell['train_subset']:,} (class-balanced, never trained on), so that the test set, "
             "which the grid reports, does not choose it:", "", *_rate_table(found, "held_out"), "",
             "Test accuracy (%) at the last epoch, for information:", "", *_rate_table(found, "test")]
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
