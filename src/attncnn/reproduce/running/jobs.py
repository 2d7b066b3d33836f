"""A study's jobs: which runs it trains, where each lives, and the state of each.

A job is one run of a study: ``(preset, seed)`` trained into ``<out>/<preset>/seed<seed>`` for a
Table 1 suite (:func:`plan`), or a grid's row on one training-set fraction into
``<out>/<row>/<pct>pct/seed<seed>`` (:func:`plan_grid`); :func:`plan_study` plans either. Each
folder is an ordinary run folder, so that every ``attncnn`` command (evaluate, inspect, plot,
viewer, train --resume) works on it.

Like the reference code's ``runs/*/run.sh`` scripts, but resumable: a job whose
folder holds ``finished.json`` is skipped, one with a folder but no ``finished.json`` is resumed from
its last checkpoint (:func:`job_state`).

A grid's cell has the same seen images as every other cell of its row (:func:`cell_options`), and
its subset comes from the seed, so every model of a seed sees the same images. A grid's row is a
preset or a named variant of one; both, and a grid's shared learning rate, reach each cell's
``Job.overrides`` (``model``, ``lr``), so its ``config.json`` records them and a folder trained with
other values is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...runs import RunFolder, TrainConfig
from ..studies import Grid, Study, Suite

__all__ = ["Job", "plan", "plan_grid", "plan_study", "job_state", "parse_seeds", "select_presets",
           "cell_options", "cell_name", "folder_name", "row_of"]


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """``"0,1,2"`` -> ``(0, 1, 2)``; None stays None (the suite's defaults).

    Raises:
        InputError: an entry that is not a non-negative integer, or a repeated seed.
    """
    if text is None:
        return None
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InputError(f"--seeds must be comma-separated integers like 0,1,2, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds must list distinct integers >= 0, like 0,1,2; got {text!r}")
    return seeds


def select_presets(presets: tuple[str, ...], only: tuple[str, ...] | None, what: str) -> tuple[str, ...]:
    """``presets`` restricted to ``only`` (None: all), in their own order.

    Raises:
        InputError: a name in ``only`` that is not in ``presets`` (the message lists ``what``'s presets).
    """
    if only is None:
        return presets
    unknown = [p for p in only if p not in presets]
    if unknown:
        raise InputError(f"--only names {', '.join(unknown)}, not in {what}; its presets are {', '.join(presets)}")
    return tuple(p for p in presets if p in only)


@dataclass(frozen=True)
class Job:
    """One run of a study: ``preset`` trained with ``seed`` into ``folder``.

    ``overrides`` are training options the job itself sets, as ``(name, value)`` pairs (the
    sample-efficiency grid's ``train_subset``, ``epochs``, ``eval_every``; a suite's own
    ``overrides``), ``cell`` names a grid cell for people (``"10 %"``) and ``row`` the grid's row
    (a preset or a :class:`~attncnn.reproduce.studies.Variant`'s name); Table 1 jobs have neither.
    """

    preset: str
    seed: int
    folder: Path
    overrides: tuple[tuple[str, object], ...] = ()
    cell: str = ""
    row: str = ""

    @property
    def label(self) -> str:
        return f"{self.row or self.preset}{' ' + self.cell if self.cell else ''} seed {self.seed}"


def plan(suite: Suite, out: str | Path, *, seeds: tuple[int, ...] | None = None,
         only: tuple[str, ...] | None = None, epochs: int | None = None) -> list[Job]:
    """The suite's jobs: every preset's first seed in suite order, then the further seeds, then
    the suite's ``last`` presets (all their seeds).

    Training every model once before any second seed means an interrupted suite has the whole
    table (one seed) before it has error bars.

    Args:
        out: the suite's folder; job folders are ``<out>/<preset>/seed<seed>``.
        seeds: seeds for every preset (None: the suite's defaults).
        only: restrict to these presets (None: all of the suite's).
        epochs: replaces the suite's own ``epochs`` overrides, its presets' included (``--epochs``
            of a smoke run); in a suite without one it becomes every job's, so that a folder
            trained to another length is named, not taken as finished or resumed to this one.

    Raises:
        InputError: a name in ``only`` that is not one of the suite's presets.
    """
    presets = select_presets(suite.presets, only, f"suite {suite.name!r}")
    per_preset = {p: suite.seeds_of(p, seeds) for p in presets}
    rounds = max(len(s) for s in per_preset.values())
    overrides = {p: dict(suite.overrides_of(p)) for p in presets}
    for options in overrides.values():
        if epochs is not None:
            options["epochs"] = epochs
    jobs = [Job(p, per_preset[p][i], Path(out) / p / f"seed{per_preset[p][i]}", tuple(overrides[p].items()))
            for i in range(rounds) for p in presets if i < len(per_preset[p])]
    return sorted(jobs, key=lambda job: job.preset in suite.last)          # stable: the order otherwise kept


def job_state(job: Job) -> str:
    """``"finished"``, ``"interrupted"`` (a run folder without ``finished.json``) or ``"new"``.

    Raises:
        InputError: the folder holds a run of another preset or seed, or with other values of the
            job's ``overrides`` (the message names both).
    """
    folder = RunFolder(job.folder, mode="read") if (job.folder / "config.json").is_file() else None
    if folder is None:
        if job.folder.exists() and any(p.name != ".lock" for p in job.folder.iterdir()):
            raise InputError(f"{job.folder} exists but holds no config.json, so it is not a run of {job.label}; "
                             "move it away or choose another --out")
        return "new"
    stored = folder.read_config()
    preset, seed = stored.get("preset", TrainConfig.preset), stored.get("seed", TrainConfig.seed)
    if (preset, seed) != (job.preset, job.seed):
        raise InputError(f"{job.folder} holds a run of {preset} seed {seed}, not {job.label}; "
                         "move it away or choose another --out")
    for name, value in job.overrides:
        found = stored.get(name)
        if name == "model" and isinstance(found, dict):     # the options it sets; a run adds the path it measured
            found = {key: found.get(key) for key in value}
        if found != value:
            raise InputError(f"{job.folder} holds a run with {name}={stored.get(name)!r}, but {job.label} needs "
                             f"{name}={value!r} (another --epochs, --train-images or --passes?); move it away or "
                             "choose another --out")
    return "finished" if folder.finished else "interrupted"




def row_of(job: Job) -> str:
    """The grid row of ``job``: its ``row``, else its preset."""
    return job.row or job.preset


def cell_name(fraction: float) -> str:
    """``0.1`` -> ``"10 %"`` (labels) ; folders use :func:`folder_name`."""
    return f"{100 * fraction:g} %"


def folder_name(fraction: float) -> str:
    """``0.1`` -> ``"10pct"``, the cell's folder."""
    return f"{100 * fraction:g}pct"


def cell_options(fraction: float, *, train_images: int, passes: int, evaluations: int) -> dict:
    """Training options of one cell: ``train_subset``, ``epochs``, ``eval_every``, ``checkpoint_every``.

    Raises:
        InputError: the subset is empty, or the seen images (``passes * train_images``) are not a
            whole number of epochs of the subset (the message names a size that works).
    """
    subset = round(fraction * train_images)
    seen = passes * train_images
    if subset < 1 or subset > train_images:
        raise InputError(f"{cell_name(fraction)} of {train_images} training images is {subset} images; "
                         "choose fractions in (0, 1] and a larger --train-images")
    if seen % subset:
        raise InputError(f"{seen} seen images ({passes} passes of {train_images}) are not a whole number of epochs "
                         f"of {subset} images ({cell_name(fraction)} of {train_images}); choose --train-images and "
                         "--passes so that they are (the defaults, 50,000 and 2, give 20, 8 and 2 epochs)")
    epochs = seen // subset
    # no periodic checkpoints: a cell resumes from `last` (refreshed every epoch and every
    # checkpoint_every_steps) and ships `last` alone
    return {"train_subset": subset, "epochs": epochs, "eval_every": max(1, epochs // evaluations),
            "checkpoint_every": 0}


def plan_grid(grid: Grid, out: str | Path, *, seeds: tuple[int, ...] | None = None,
              only: tuple[str, ...] | None = None, train_images: int | None = None,
              passes: int | None = None, fractions: tuple[float, ...] | None = None,
              lr: float | None = None) -> list[Job]:
    """The grid's jobs: per seed, the smallest fraction's cells first (every row), then larger.

    A grid run in parts thus has the scarce-data comparison, the one the claim is about, first,
    and the first seed's whole grid before any further seed (``Grid.more_seeds``). Each job's
    ``overrides`` are its cell's options (:func:`cell_options`) and its row's
    (:meth:`~attncnn.reproduce.studies.Grid.row_overrides`: a variant's ``model``, the shared ``lr``).

    Args:
        out: the grid's folder; cells are ``<out>/<row>/<pct>pct/seed<N>``.
        seeds: seeds of every cell (None: the grid's, :meth:`~attncnn.reproduce.studies.Grid.seeds_of`).
        only: restrict to these rows.
        train_images: the full training set's size (None: the grid's, CIFAR-10's 50,000).
        passes: seen images per cell in full training sets (None: the grid's).
        fractions: the cells (None: the grid's), sorted smallest first.
        lr: the shared learning rate of ``Grid.lr_rows`` (None: the grid's).

    Raises:
        InputError: a row in ``only`` that is not in the grid, a cell that is not a whole number
            of epochs (see :func:`cell_options`), ``passes`` < 1, a fraction outside (0, 1].
    """
    rows = select_presets(grid.presets, only, f"the {grid.name} grid")
    passes = grid.passes if passes is None else passes
    if passes < 1:
        raise InputError(f"--passes must be >= 1, got {passes}")
    fractions = grid.fractions if fractions is None else tuple(sorted(set(fractions)))
    if not fractions or not all(0 < f <= 1 for f in fractions):
        raise InputError(f"--fractions must be fractions of the training set in (0, 1], like 0.1,1; got {fractions}")
    train_images = train_images or grid.train_images
    cells = {f: cell_options(f, train_images=train_images, passes=passes, evaluations=grid.evaluations)
             for f in fractions}
    per_fraction = {f: grid.seeds_of(f, seeds) for f in fractions}
    all_seeds = dict.fromkeys(s for f in fractions for s in per_fraction[f])
    return [Job(grid.preset_of(row), seed, Path(out) / row / folder_name(fraction) / f"seed{seed}",
                    tuple(sorted({**cells[fraction], **grid.row_overrides(row, lr)}.items())), cell_name(fraction),
                    row=row)
            for seed in all_seeds for fraction in fractions if seed in per_fraction[fraction]
            for row in rows]


def plan_study(study: Study, out: str | Path, **options) -> list[Job]:
    """The jobs of any study: :func:`plan` of a suite, :func:`plan_grid` of a grid, with their
    keyword ``options`` (``seeds``, ``only``; a suite's ``epochs``; a grid's ``train_images``,
    ``passes``, ``fractions``, ``lr``).

    Raises:
        InputError: as :func:`plan` or :func:`plan_grid`.
    """
    return plan_grid(study, out, **options) if isinstance(study, Grid) else plan(study, out, **options)
