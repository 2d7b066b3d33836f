"""A study's jobs (which runs it trains, where each lives, the state of each) and training them one
after another.

A job is one run of a study: a row trained with a seed into ``<out>/<preset>/seed<seed>`` for a
Table 1 suite (:func:`plan`), or a grid's row on one training-set fraction into
``<out>/<row>/<pct>pct/seed<seed>`` (:func:`plan_grid`). Its ``overrides`` are its row's recipe
overrides under what the call sets (:func:`row_job`); its ``config.json`` records them, so a folder
trained with other values is refused. Each folder is an ordinary run folder, and each job an ordinary
:func:`attncnn.training.train` call into it: ``new``, ``resume`` for an interrupted one (a folder
without ``finished.json``), nothing for a finished one (:func:`job_state`). So a study can be stopped
at any moment (Ctrl-C, SIGTERM, a lost machine) and the same command continues it, unlike the
reference code's ``runs/*/run.sh`` scripts.
"""

from __future__ import annotations

import ast
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ...errors import InputError
from ...perf import make_plan, resolve_device, resume_plan
from ...runs import RunFolder, TrainConfig, point_at_data, resolve_config
from ...runs.config import MAX_EPOCHS
from ...training import RunOptions, TrainingInterrupted, train
from ..studies import Grid, Study, Suite

log = logging.getLogger("attncnn.reproduce")

__all__ = ["Job", "ModelOptions", "plan", "plan_grid", "plan_study", "study_jobs", "row_job", "grid_cells",
           "job_state", "select_rows", "cell_options", "cell_name", "folder_name", "row_of", "rows_and_cells",
           "TrainOptions", "job_config", "train_jobs", "train_command", "resume_command"]


class ModelOptions(dict):
    """A row's ``model`` override (``{"init": "random"}``): a plain dict to everything that reads it
    (it equals the ``model`` of a ``config.json`` and is written as one), but hashable, as every field
    of a :class:`Job` must be. Treat it as read-only: its hash is its items'."""

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.items())))


@dataclass(frozen=True)
class Job:
    """One run of a study: ``preset`` trained with ``seed`` into ``folder``.

    ``overrides`` are the recipe options the job sets, as ``(name, value)`` pairs (:func:`row_job`);
    ``cell`` names a grid cell for people (``"10 %"``) and ``row`` the grid's row (a preset, or a
    name whose recipe says which preset it trains); Table 1 jobs have neither.
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


def row_of(job: Job) -> str:
    """The grid row of ``job``: its ``row``, else its preset."""
    return job.row or job.preset


def rows_and_cells(jobs: Sequence[Job]) -> tuple[list[str], list[str]]:
    """A grid's rows and cells in the order ``jobs`` plans them (cells smallest first)."""
    return list(dict.fromkeys(row_of(job) for job in jobs)), list(dict.fromkeys(job.cell for job in jobs))


def row_job(study: Study, row: str, seed: int, folder: Path, given: dict | None = None, cell: str = "") -> Job:
    """The job of ``row`` with ``seed`` in ``folder``: ``given`` (what the call or the cell sets: a
    cell's size, ``--epochs``, ``--lr``), then the row's recipe overrides that ``given`` leaves; the
    recipe's ``preset`` is the preset it trains (default: the row)."""
    given = given or {}
    recipe = {**given, **{k: v for k, v in study.rows[row].items() if k not in given}}
    preset = recipe.pop("preset", row)
    overrides = tuple((k, ModelOptions(v) if k == "model" else v) for k, v in recipe.items())
    return Job(preset, seed, Path(folder), overrides, cell, row=row if isinstance(study, Grid) else "")


def select_rows(rows: tuple[str, ...], only: tuple[str, ...] | None, what: str) -> tuple[str, ...]:
    """``rows`` restricted to ``only`` (None: all), in their own order.

    Raises:
        InputError: a name in ``only`` that is not in ``rows`` (the message lists ``what``'s).
    """
    if only is None:
        return rows
    unknown = [p for p in only if p not in rows]
    if unknown:
        raise InputError(f"--only names {', '.join(unknown)}, not in {what}; its presets are {', '.join(rows)}")
    return tuple(p for p in rows if p in only)


def plan(suite: Suite, out: str | Path, *, seeds: tuple[int, ...] | None = None,
         only: tuple[str, ...] | None = None, epochs: int | None = None) -> list[Job]:
    """The suite's jobs: every preset's first seed in suite order, then the further seeds, then
    the suite's ``last`` presets (all their seeds), so that an interrupted suite has the whole
    table (one seed) before it has error bars.

    Args:
        out: the suite's folder; job folders are ``<out>/<preset>/seed<seed>``.
        seeds: seeds for every preset (None: the suite's defaults).
        only: restrict to these presets (None: all of the suite's).
        epochs: replaces every row's ``epochs`` (``--epochs`` of a smoke run), or becomes it, so that
            a folder trained to another length is named, not taken as finished or resumed to this one.

    Raises:
        InputError: a name in ``only`` that is not one of the suite's presets.
    """
    rows = select_rows(tuple(suite.rows), only, f"suite {suite.name!r}")
    per_row = {row: suite.seeds_of(row, seeds) for row in rows}
    given = {} if epochs is None else {"epochs": epochs}
    jobs = [row_job(suite, row, per_row[row][i], Path(out) / row / f"seed{per_row[row][i]}", given)
            for i in range(max(len(s) for s in per_row.values())) for row in rows if i < len(per_row[row])]
    return sorted(jobs, key=lambda job: job.preset in suite.last)          # stable: the order otherwise kept


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
    return {"checkpoint_every": 0, "epochs": epochs, "eval_every": max(1, epochs // evaluations),
            "train_subset": subset}


def grid_cells(grid: Grid, *, passes: int | None = None, train_images: int | None = None,
               fractions: tuple[float, ...] | None = None) -> dict[float, dict]:
    """Each cell's options (:func:`cell_options`) by fraction, smallest first; None: the grid's.

    Raises:
        InputError: ``passes`` < 1, a fraction outside (0, 1], a cell that is not a whole number of epochs.
    """
    passes = grid.passes if passes is None else passes
    if passes < 1:
        raise InputError(f"--passes must be >= 1, got {passes}")
    fractions = grid.fractions if fractions is None else tuple(sorted(set(fractions)))
    if not fractions or not all(0 < f <= 1 for f in fractions):
        raise InputError(f"--fractions must be fractions of the training set in (0, 1], like 0.1,1; got {fractions}")
    return {f: cell_options(f, train_images=train_images or grid.train_images, passes=passes,
                            evaluations=grid.evaluations) for f in fractions}


def plan_grid(grid: Grid, out: str | Path, *, seeds: tuple[int, ...] | None = None,
              only: tuple[str, ...] | None = None, train_images: int | None = None,
              passes: int | None = None, fractions: tuple[float, ...] | None = None,
              lr: float | None = None) -> list[Job]:
    """The grid's jobs: per seed, the smallest fraction's cells first (every row), then larger, so
    that a grid run in parts has the scarce-data comparison first, and the first seed's whole grid
    before any further seed.

    Args:
        out: the grid's folder; cells are ``<out>/<row>/<pct>pct/seed<N>``.
        seeds: seeds of every cell (None: the grid's, per fraction).
        only: restrict to these rows.
        train_images, passes, fractions: the cells' sizes (:func:`grid_cells`; None: the grid's).
        lr: replaces the ``lr`` of the rows whose recipe sets one (None: theirs).

    Raises:
        InputError: a row in ``only`` that is not in the grid; bad sizes (:func:`grid_cells`).
    """
    rows = select_rows(tuple(grid.rows), only, f"the {grid.name} grid")
    cells = grid_cells(grid, passes=passes, train_images=train_images, fractions=fractions)
    per_fraction = {f: grid.seeds_of(f, seeds) for f in cells}
    rated = {row: {"lr": lr} if lr is not None and "lr" in grid.rows[row] else {} for row in rows}
    return [row_job(grid, row, seed, Path(out) / row / folder_name(fraction) / f"seed{seed}",
                    {**cells[fraction], **rated[row]}, cell_name(fraction))
            for seed in dict.fromkeys(s for f in cells for s in per_fraction[f]) for fraction in cells
            if seed in per_fraction[fraction] for row in rows]


def plan_study(study: Study, out: str | Path, **options) -> list[Job]:
    """The jobs of any study: :func:`plan` of a suite, :func:`plan_grid` of a grid, with their
    keyword ``options``.

    Raises:
        InputError: as :func:`plan` or :func:`plan_grid`.
    """
    return plan_grid(study, out, **options) if isinstance(study, Grid) else plan(study, out, **options)


def study_jobs(study: Study, out: Path, **options) -> list[Job]:
    """The jobs to trim and report: the whole study, not only what this call trained, so that a
    study run in parts (``--only`` one model, ``--seeds`` one seed at a time) keeps the runs made
    earlier in its report: every row with this call's seeds, and every run folder that exists of the
    study's own seeds or of any other seed (``seed<N>`` beside a planned one; a smoke run with
    ``--seeds 0`` does not list the default seeds it never meant to train). Ordered as planned, each
    row's (and cell's) seeds ascending, so that its first run is its lowest seed whatever this
    call's ``--seeds`` (the figures draw a row's first run)."""
    jobs = plan_study(study, out, **options)
    candidates = plan_study(study, out, **{**options, "seeds": None})
    on_disk = {int(folder.name.removeprefix("seed")) for job in [*jobs, *candidates]
               for folder in job.folder.parent.glob("seed*")
               if folder.is_dir() and folder.name.removeprefix("seed").isdigit()}
    if on_disk:
        candidates += plan_study(study, out, **{**options, "seeds": tuple(sorted(on_disk))})
    folders = {job.folder for job in jobs}
    for job in candidates:
        if job.folder not in folders and job.folder.is_dir():
            jobs.append(job)
            folders.add(job.folder)
    places = list(dict.fromkeys((row_of(job), job.cell) for job in jobs))
    return sorted(jobs, key=lambda job: (places.index((row_of(job), job.cell)), job.seed))


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


@dataclass(frozen=True)
class TrainOptions:
    """Options passed to every job's training (None: the preset's value).

    ``epochs``, ``train_subset`` and ``batch_size`` exist for smoke runs of the harness; a suite trained with
    them is not the suite of the report's title, and the report says so (it prints each run's epochs).
    ``compile_mode`` and ``fused_optimizer`` are :class:`~attncnn.training.RunOptions`' (the GPU job,
    ``tools/gpu_job.py``, gives them; ``attncnn reproduce`` has no flags of them).

    Raises:
        InputError: ``epochs`` above :data:`MAX_EPOCHS` (named as ``--epochs``).
    """

    data: str = "cifar10"
    data_dir: str | None = None
    download: bool = False
    device: str = "auto"
    precision: str | None = None
    compile: bool | None = None
    compile_mode: str = "default"
    fused_optimizer: bool = False
    epochs: int | None = None
    train_subset: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs > MAX_EPOCHS:
            digits = len(str(self.epochs))
            raise InputError(f"--epochs must be at most {MAX_EPOCHS:,} (10**12), got "
                             f"{self.epochs if digits <= 20 else f'a number of {digits} digits'}; "
                             "give the number of epochs to train")

    def run_options(self) -> RunOptions:
        """The run-time options every job trains with (:class:`~attncnn.training.RunOptions`)."""
        return RunOptions(device=self.device, precision=self.precision, compile=self.compile,
                          compile_mode=self.compile_mode, fused_optimizer=self.fused_optimizer, data_dir=self.data_dir,
                          download=self.download)


def job_config(job: Job, options: TrainOptions) -> TrainConfig:
    """The job's training configuration: its preset's recipe, the options, then the job's own
    ``overrides`` (a grid cell's subset and epochs win over the command line's).

    Raises:
        InputError: an option the preset rejects (from :func:`~attncnn.runs.resolve_config`).
    """
    own = {name: dict(value) if name == "model" else value for name, value in job.overrides}   # a copy to train with
    given = {"seed": job.seed, "data": options.data, "epochs": options.epochs, "train_subset": options.train_subset,
             "batch_size": options.batch_size}                                                 # None: the preset's
    return resolve_config(job.preset, **{**given, **own})


def _machine_flags(options: TrainOptions) -> tuple[tuple[str, str | None], ...]:
    """``--device`` and ``--precision`` as ``(flag, value or None)``."""
    return ("--device", None if options.device == "auto" else options.device), ("--precision", options.precision)


def _compile_flags(options: TrainOptions) -> list[str]:
    """``--compile``/``--no-compile``, ``--compile-mode`` and ``--fused-optimizer`` where ``options`` set them."""
    return (([] if options.compile is None else ["--compile" if options.compile else "--no-compile"])
            + (["--compile-mode", options.compile_mode] if options.compile_mode != "default" else [])
            + (["--fused-optimizer"] if options.fused_optimizer else []))


def _words(pairs) -> list[str]:
    return [word for flag, value in pairs if value is not None for word in (flag, str(value))]


def resume_command(job: Job, options: TrainOptions) -> str:
    """The ``attncnn train --resume`` command equivalent to resuming an interrupted job."""
    return shlex.join(["attncnn", "train", "--resume", str(job.folder), *_words(_machine_flags(options)),
                       *_compile_flags(options)])


def train_command(job: Job, options: TrainOptions) -> str:
    """The ``attncnn train`` command line equivalent to one job (printed by ``--dry-run``)."""
    words = ["attncnn", "train", "--preset", job.preset, "--seed", str(job.seed), "--data", options.data,
             "--out", str(job.folder)]
    given = {"epochs": options.epochs, "train_subset": options.train_subset, "batch_size": options.batch_size,
             **dict(job.overrides)}
    for key, value in given.pop("model", {}).items():        # a grid row's model options
        words += ["--set", f"{key}={value!r}" if isinstance(value, str) and _literal(value) else f"{key}={value}"]
    words += _words((("--data-dir", options.data_dir), *_machine_flags(options),
                     *((f"--{name.replace('_', '-')}", value) for name, value in given.items())))
    return shlex.join(words + (["--download"] if options.download else []) + _compile_flags(options))


def _literal(text: str) -> bool:
    """Whether ``--set key=text`` would read ``text`` as a Python literal, not as the string itself."""
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False
    return True


def train_jobs(jobs: list[Job], options: TrainOptions, *, progress: bool = True,
               epoch_metrics: Callable | None = None, resume_hint: str = "") -> dict[Job, str]:
    """Train every job that is not finished, in order; returns each job's state before this call.

    An interrupted run shipped from another machine is first pointed at this machine's data set
    (:func:`attncnn.runs.point_at_data`), and resumes with this machine's plan
    (:func:`attncnn.perf.resume_plan`: precision as
    :func:`~attncnn.reproduce.running.estimate.job_precision` says, compiled as ``options.compile``
    or this machine's rule decides); ``machine.json`` records where each ran.

    Raises:
        TrainingInterrupted: SIGINT/SIGTERM during a job (its checkpoint is written); the message
            says that running the same command again continues the suite (``resume_hint``).
        InputError: a job folder that holds another run (see :func:`job_state`), bad options, a
            shipped run whose data set is not the one given.
        TrainingError, RunFolderError, DataError: from the job's training, naming the job.
    """
    states = {job: job_state(job) for job in jobs}        # every folder checked before anything trains
    resolve_device(options.device)                        # a typo in --device refused before anything trains
    compiled_before = False
    for n, job in enumerate(jobs, 1):
        if states[job] == "finished":
            log.info("[%d/%d] %s: finished already (%s)", n, len(jobs), job.label, job.folder)
            continue
        mode = "resume" if states[job] == "interrupted" else "new"
        log.info("[%d/%d] %s: %s in %s", n, len(jobs), job.label,
                 "resuming" if mode == "resume" else "training", job.folder)
        config = None if mode == "resume" else job_config(job, options)
        if mode == "resume":
            point_at_data(job.folder, options.data)
            plan = resume_plan(job.folder, options.run_options())
        else:
            plan = make_plan(config, options.run_options())
        if compiled_before:
            # each run compiles a new network whose forward is the same code as the last run's: dynamo
            # keeps their graphs side by side and, past its per-function cache limit, stops compiling
            # (the rest of the suite runs eager). train() leaves the caller's compiled code alone; a suite
            # that trains many runs in one process drops it between them.
            torch._dynamo.reset()
        try:
            train(config, job.folder, plan, mode=mode, progress=progress, epoch_metrics=epoch_metrics)
        except TrainingInterrupted as err:
            raise TrainingInterrupted(f"suite stopped during {job.label}; its checkpoint {err.checkpoint} is "
                                      f"written. Run {resume_hint or 'the same command'} again to continue",
                                      signum=err.signum, checkpoint=err.checkpoint) from err
        compiled_before = compiled_before or plan.compile is not False     # None: the rule may have compiled
    return states
