"""How long a study's jobs take on this machine (``--dry-run``): each job's step timed at the
precision it will train at, scaled to the whole run."""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ...data import DataShape, peek_dataset
from ...models import build_model, preset_model_config
from ...perf import resolve_device
from ...perf.bench.harness import time_steps
from ...perf.machine import busy_cpu, cpu_load
from ...perf.plan import for_images
from ...perf.precision import machine_precision, resolve_precision
from ...perf.rule import choose, device_kind
from ...runs import TrainConfig, resumable_recipe
from ...runs.machine_file import run_precision
from ...training import count_test_passes
from .runner import Job, TrainOptions, job_config, job_state, resume_command, train_command

log = logging.getLogger("attncnn.reproduce")

__all__ = ["Estimate", "estimate_job", "job_precision", "dry_run", "busy_cpu", "cpu_load"]


def job_precision(job: Job, options: TrainOptions, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"``: the precision the job trains at on ``device``
    (:func:`~attncnn.reproduce.running.runner.train_jobs`). A new job: ``--precision`` or its
    preset's (``auto``: the device's choice). An interrupted one resumes at ``--precision`` if given,
    else at its stored precision, but fp32 for a bf16 run on a device without fast bf16
    (:func:`~attncnn.perf.precision.machine_precision`).

    Raises:
        InputError: an option the preset rejects; RunFolderError: an interrupted job without a
            readable ``config.json``.
    """
    if job_state(job) == "interrupted":
        own = run_precision(job.folder) or resumable_recipe(job.folder)[1].get("precision")
        return machine_precision(own, device, options.precision, what=job.label)
    return resolve_precision(options.precision or "auto", device)


@dataclass(frozen=True)
class Estimate:
    """Measured cost of one job on this device (seconds); ``compile`` says whether the training
    step is estimated compiled and from what."""

    step_seconds: float
    epoch_seconds: float
    total_seconds: float
    precision: str
    compile: str = "eager"


def estimate_job(job: Job, options: TrainOptions, *, measured: dict | None = None,
                 data: DataShape | None = None) -> Estimate:
    """Time a training step of the job's model at its batch size and at the precision it will train
    at here (:func:`job_precision`), on images of the data set's size, and scale it to the whole run
    (its training images; a test pass every ``eval_every`` epochs and after the last).

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
    note = _compile_note(options, config, precision, device, config.epochs * -(-train_images // config.batch_size),
                         data.image_shape[1:])
    step = timing["step_seconds"]
    epoch = train_images / config.batch_size * step
    return Estimate(step, epoch + evaluation, epoch * config.epochs + evaluation * evaluations, precision, note)


def _compile_note(options: TrainOptions, config: TrainConfig, precision: str, device: torch.device, steps: int,
                  image_size: tuple[int, int]) -> str:
    """What the estimate assumes of compiling: where the job compiles (``--compile``, or the written
    rule when unset, :func:`attncnn.perf.rule.choose`), the estimate stays the eager step (nothing
    here measures a compiled one), and says so."""
    will = options.compile
    if will is None:
        model = preset_model_config(config.preset, **config.model)[1]
        pooling = getattr(model, "pooling", 1)
        grid = (image_size[0] // pooling, image_size[1] // pooling)
        will = choose(device_kind(device), getattr(model, "attention", None), grid, precision, steps,
                      batch=config.batch_size).compile
    if not will:
        return "eager"
    return f"compiled{' by the rule' if options.compile is None else ''}, estimated at the eager step"


def dry_run(jobs: list[Job], options: TrainOptions, out: Path, suite: str) -> None:
    """Print each job's ``attncnn train`` command (or, for an interrupted one, the command that
    resumes it) with its time estimated here (:func:`estimate_job`), then the total (``--dry-run``);
    writes nothing.

    Raises:
        DataError, InputError: as :func:`estimate_job`.
    """
    states = {job: job_state(job) for job in jobs}
    if all(state == "finished" for state in states.values()):
        fresh = Path("runs") / suite                 # a dry run writes nothing: any empty folder will do
        fresh = fresh if fresh.resolve() != out.resolve() else out.parent / f"{out.name}-fresh"
        print(f"# the {len(jobs)} run(s) of {suite} under {out} are all finished: nothing to train, nothing to "
              f"estimate. To estimate a fresh run on this machine, point --out at an empty folder:\n"
              f"attncnn reproduce {suite} --dry-run --out {fresh}")
        return
    data = peek_dataset(options.data, data_dir=options.data_dir)        # sizes only: decoding may take minutes
    print(f"# {data.describe()}")
    measured: dict = {}
    total = 0.0
    loads = [cpu_load()]
    for job in jobs:
        if states[job] == "finished":
            print(f"# {job.label}: finished in {job.folder}, skipped")
            continue
        if states[job] == "interrupted":
            print(f"# {job.label}: interrupted, resumed with: {resume_command(job, options)}")
        estimate = estimate_job(job, options, measured=measured, data=data)
        total += estimate.total_seconds
        print(f"{train_command(job, options)}\n    # {estimate.step_seconds:.2f} s/step, "
              f"~{estimate.epoch_seconds / 60:.1f} min/epoch, ~{estimate.total_seconds / 3600:.2f} h "
              f"({estimate.precision}; {estimate.compile})")
    print(f"# total ~{total / 3600:.1f} h on this device for what is left (from one timed step per model on "
          f"images of {data.image_shape[2]}x{data.image_shape[1]}; an interrupted run needs less)")
    warning = busy_cpu(loads + [cpu_load()]) if resolve_device(options.device).type == "cpu" else None
    if warning:
        print(f"# {warning}")
