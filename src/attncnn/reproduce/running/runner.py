"""Training a study's jobs one after another, and estimating how long that takes (``--dry-run``).

Each job is an ordinary :func:`attncnn.training.train` call into its run folder: ``new`` for a job
never started, ``resume`` for an interrupted one (from its last, possibly mid-epoch, checkpoint),
nothing for a finished one. So the study can be stopped at any moment (Ctrl-C, SIGTERM, a lost
machine) and the same command continues it.
"""

from __future__ import annotations

import ast
import copy
import json
import logging
import shlex
from dataclasses import dataclass
from typing import Callable

import torch

from ...data import DataShape, peek_dataset
from ...errors import InputError
from ...models import build_model, preset_model_config
from ...perf import make_plan, resolve_device, resume_plan
from ...perf.bench.harness import time_steps
from ...perf.machine import busy_cpu, cpu_load
from ...perf.plan import for_images
from ...perf.rule import choose, device_kind
from ...perf.precision import machine_precision, resolve_precision
from ...runs import TrainConfig, point_at_data, resolve_config, resumable_recipe
from ...runs.config import MAX_EPOCHS
from ...runs.machine_file import MACHINE_FILE, run_precision
from ...training import RunOptions, TrainingInterrupted, count_test_passes, train
from .jobs import Job, job_state

log = logging.getLogger("attncnn.reproduce")

__all__ = ["MACHINE_FILE", "MAX_EPOCHS", "TrainOptions", "job_config", "job_precision", "train_jobs", "train_command",
           "resume_command", "Estimate", "estimate_job", "cpu_load", "busy_cpu"]



@dataclass(frozen=True)
class TrainOptions:
    """Options passed to every job's training (None: the preset's value).

    ``epochs``, ``train_subset`` and ``batch_size`` exist for smoke runs of the harness; a suite trained with
    them is not the suite of the report's title, and the report says so (it prints each run's epochs).
    ``compile_mode`` and ``fused_optimizer`` are :class:`~attncnn.training.RunOptions`' (the GPU job,
    ``benchmarks/gpu/job.py``, gives them; ``attncnn reproduce`` has no flags of them).

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

    def overrides(self, seed: int) -> dict:
        """The recipe options of a job of ``seed`` (None: the preset's)."""
        return {"seed": seed, "data": self.data, "epochs": self.epochs, "train_subset": self.train_subset,
                "batch_size": self.batch_size}

    def run_options(self) -> RunOptions:
        """The run-time options every job trains with (:class:`~attncnn.training.RunOptions`)."""
        return RunOptions(device=self.device, precision=self.precision, compile=self.compile,
                          compile_mode=self.compile_mode, fused_optimizer=self.fused_optimizer, data_dir=self.data_dir,
                          download=self.download)


def job_config(job: Job, options: TrainOptions) -> TrainConfig:
    """The job's training configuration: its preset's recipe, the options, then the job's own
    ``overrides`` (a grid cell's subset and epochs win over the command line's; a grid variant's
    ``model`` options).

    Raises:
        InputError: an option the preset rejects (from :func:`~attncnn.runs.resolve_config`).
    """
    own = {name: dict(value) if name == "model" else value for name, value in job.overrides}   # a copy to train with
    return resolve_config(job.preset, **{**options.overrides(job.seed), **own})


def job_precision(job: Job, options: TrainOptions, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"``: the precision the job trains at on ``device``, what
    :func:`train_jobs` will run. A new job: ``--precision`` or its preset's (``auto``: the device's
    choice). An interrupted one resumes at ``--precision`` if given, else at its stored precision,
    but fp32 for a bf16 run on a device without fast bf16
    (:func:`~attncnn.perf.precision.machine_precision`).

    Raises:
        InputError: an option the preset rejects; RunFolderError: an interrupted job without a
            readable ``config.json``.
    """
    if job_state(job) == "interrupted":
        own = run_precision(job.folder) or resumable_recipe(job.folder)[1].get("precision")
        return machine_precision(own, device, options.precision, what=job.label)
    return resolve_precision(options.precision or "auto", device)


def resume_command(job: Job, options: TrainOptions) -> str:
    """The ``attncnn train --resume`` command equivalent to resuming an interrupted job."""
    words = ["attncnn", "train", "--resume", str(job.folder)]
    for flag, value in (("--device", None if options.device == "auto" else options.device),
                        ("--precision", options.precision)):
        if value is not None:
            words += [flag, value]
    return shlex.join(words + _compile_flag(options.compile) + _kernel_flags(options))


def _compile_flag(value: bool | None) -> list[str]:
    return [] if value is None else ["--compile" if value else "--no-compile"]


def _kernel_flags(options: TrainOptions) -> list[str]:
    """``--compile-mode`` and ``--fused-optimizer`` where ``options`` differ from the defaults."""
    return ((["--compile-mode", options.compile_mode] if options.compile_mode != "default" else [])
            + (["--fused-optimizer"] if options.fused_optimizer else []))


def train_command(job: Job, options: TrainOptions) -> str:
    """The ``attncnn train`` command line equivalent to one job (printed by ``--dry-run``)."""
    words = ["attncnn", "train", "--preset", job.preset, "--seed", str(job.seed), "--data", options.data,
             "--out", str(job.folder)]
    given = {"epochs": options.epochs, "train_subset": options.train_subset, "batch_size": options.batch_size,
             **dict(job.overrides)}
    compiled = options.compile
    for key, value in given.pop("model", {}).items():        # a grid variant's model options
        words += ["--set", f"{key}={value!r}" if isinstance(value, str) and _literal(value) else f"{key}={value}"]
    for flag, value in (("--data-dir", options.data_dir), ("--device", None if options.device == "auto"
                                                           else options.device),
                        ("--precision", options.precision),
                        *((f"--{name.replace('_', '-')}", value) for name, value in given.items())):
        if value is not None:
            words += [flag, str(value)]
    if options.download:
        words.append("--download")
    return shlex.join(words + _compile_flag(compiled) + _kernel_flags(options))


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

    The training writes each job's ``machine.json``
    (:mod:`attncnn.runs.machine_file`: a segment per process run, which epochs ran where and how), so
    the report can say where its timings come from. An interrupted run shipped from another machine
    is first pointed at this machine's data set
    (:func:`attncnn.runs.point_at_data`), and resumes with this machine's
    plan (:func:`attncnn.perf.resume_plan`: device, attention paths chosen again here); an interrupted
    run resumes at ``options.precision`` when given, else at its own precision, but fp32 for a bf16
    run on a device without fast bf16 (each epoch record names the precision that ran, and
    ``machine.json``'s segments say it too), and compiled or eager as ``options.compile`` says, else
    as this machine's rule decides (each epoch record says which).
    Once a job of this call may have compiled (``--compile``, or the written rule where ``compile``
    is left to it), every later job starts with ``torch._dynamo.reset()`` (the
    process's compiled code dropped, the caller's included), so the suite never reaches dynamo's
    per-function cache limit.

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


@dataclass(frozen=True)
class Estimate:
    """Measured cost of one job on this device (seconds); ``compile`` says whether the training
    step is estimated compiled and from what."""

    step_seconds: float
    infer_seconds: float
    epoch_seconds: float
    total_seconds: float
    precision: str
    compile: str = "eager"


def estimate_job(job: Job, options: TrainOptions, *, measured: dict | None = None,
                 data: DataShape | None = None) -> Estimate:
    """Time a few training steps of the job's model at its batch size and at the precision it will
    train at here (:func:`job_precision`: an interrupted job's own, or fp32 where bf16 is slow), on
    images of the data set's size, and scale them to the whole run (the data set's training images
    or ``train_subset``; an evaluation of its test images every ``eval_every`` epochs and after the
    last).

    ``data``: the data set's sizes (default: :func:`~attncnn.data.peek_dataset` of the options'
    data, which decodes no images). ``measured`` caches the step timing per network, precision and
    image shape (seeds of a preset cost the same).

    Raises:
        DataError: the options' data set is not there or has not the expected layout.
        InputError: an option the preset rejects; a network that cannot take the data set's images
            (:func:`~attncnn.runs.loading.check_images`, with its fix).
    """
    data = data or peek_dataset(options.data, data_dir=options.data_dir)
    config = for_images(job_config(job, options), data)     # resumed or not, the network the run has
    device = resolve_device(options.device)
    precision = job_precision(job, options, device)
    measured = {} if measured is None else measured
    key = (job.preset, json.dumps(config.model, sort_keys=True), precision, data.image_shape, data.num_classes)
    if key not in measured:
        torch.manual_seed(0)
        model = build_model(job.preset, data.num_classes, **config.model).to(device)
        images = torch.randn(config.batch_size, *data.image_shape, device=device)
        labels = torch.randint(0, data.num_classes, (config.batch_size,), device=device)
        what = f"{job.preset} (batch {config.batch_size}, {precision})"
        # a paper-width step takes minutes on a small CPU: say what the dry run is doing before it starts
        log.info("timing one training step and one test batch of %s on %s for the estimate...", what, device)
        measured[key] = time_steps(copy.deepcopy(model), images, labels, precision=precision, warmup=1, reps=1,
                                   what=what)
    timing = measured[key]
    train_images = min(config.train_subset or data.train, data.train)
    evaluation = data.test / config.batch_size * timing["infer_seconds"]
    evaluations = count_test_passes(config.epochs, config.eval_every)
    step, warmup, note = _compiled_step(job, options, config, precision, device,
                                        timing["step_seconds"], config.epochs * -(-train_images // config.batch_size),
                                        data.image_shape[1:])
    epoch = train_images / config.batch_size * step
    return Estimate(step, timing["infer_seconds"], epoch + evaluation,
                    epoch * config.epochs + evaluation * evaluations + warmup, precision, note)


def _compiled_step(job: Job, options: TrainOptions, config: TrainConfig, precision: str, device: torch.device,
                   eager: float, steps: int, image_size: tuple[int, int]) -> tuple[float, float, str]:
    """``(seconds per step, warm-up seconds, what the estimate assumes)`` for a job whose eager step
    takes ``eager`` seconds: where the job compiles (``--compile``, or the written rule when unset,
    :func:`attncnn.perf.rule.choose`), the estimate stays the eager step (nothing here measures a
    compiled one), and says so."""
    will = options.compile
    if will is None:
        model = preset_model_config(config.preset, **config.model)[1]
        pooling = getattr(model, "pooling", 1)
        grid = (image_size[0] // pooling, image_size[1] // pooling)
        will = choose(device_kind(device), getattr(model, "attention", None), grid, precision, steps,
                      batch=config.batch_size).compile
    if not will:
        return eager, 0.0, "eager"
    return eager, 0.0, f"compiled{' by the rule' if options.compile is None else ''}, estimated at the eager step"
