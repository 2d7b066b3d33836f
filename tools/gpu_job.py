"""Train a suite's runs on a lent GPU inside one short job, and bring them back whole.

The lending arrangement this project works under: a lent GPU machine receives at most 64 MiB of
the working tree (no ``results/``; the CIFAR-10 zip travels), runs one command for at most 10
minutes, keeps nothing afterwards and returns at most 8 files of at most 16 MiB each (64 MiB in
all); another arrangement changes the limits (``--part-mib``, ``--max-mib``, ``--max-files``), not
the package. This script is the one command of such a job and the one that unpacks what it returns:

``train`` (on the GPU machine) starts every named run at once, one process each (the GPU has room
for several, and the 16 CPU cores feed them), as ordinary suite jobs (``attncnn reproduce``'s
folders ``<suite>/<preset>/seed<N>``, one epoch record per epoch with its machine and the
attention metrics). A run is *primary* (it must finish in this job) or a *filler* (``:filler``:
a resumable run that takes what the primaries leave: it is stopped, with a resumable checkpoint,
as soon as a primary's projected end passes the deadline, and at the deadline in any case). A run
may be shorter than its suite's (``@EPOCHS``), or as long as the job fits (``@fit``: before any run
starts, the job times that run's training step and test pass on the device, compilation included,
and gives it the most epochs, up to its suite's, that end within ``--fit-seconds`` of the job's
start; :func:`fit_epochs`).
Unfinished runs carried along (``--from``, a copy of the relevant part of ``results/``) resume
from their last checkpoint; a carried run folder that is none of its suite's runs (a pruned model's
fine-tune beside them) goes on with its own configuration (:func:`_carried_job`). Each epoch record
says how many of the job's runs shared the GPU (``device_runs``: the report counts such epochs as
shared). At ``--budget`` seconds every run still
training is stopped
(SIGINT: it writes a resumable checkpoint), then the runs are packed:

* a finished run as ``tools/ship.py`` trims a grid's cell (:func:`trim.trim_run`, lean): config, metrics, machine,
  ``finished.json``, the final weights (``checkpoints/last.safetensors``, float32, weights only) and
  the record of each test image's prediction that its worker wrote on the GPU as the run finished
  (``predictions.json``, :func:`record_predictions`);
* an unfinished run as ``tools/ship.py`` leaves it (:func:`unfinished.ship_unfinished`): its newest
  checkpoint with the optimiser state;
* all in one gzip tar, split into parts of at most ``--part-mib`` (:data:`PART_BYTES`), with
  ``pack.json`` naming each part's sha256 and each run's state. When the parts would exceed
  ``--max-mib`` (:data:`MAX_BYTES`) or ``--max-files`` (:data:`MAX_FILES`, with ``pack.json`` and
  the job's log), the
  largest finished runs' weights are stored in bfloat16 instead (``pack.json`` says which), and
  where even that is too much, they stay behind (:func:`pack` says in which order).

``unpack`` (here) checks every part's digest, and extracts the runs into ``results/``: a run that
is not there yet, or an unfinished one that the pack carries further, replaces what is there; a
finished run there is never replaced (the message says so).

``--compile``, ``--compile-mode`` and ``--fused-optimizer`` are passed to every run's process (and
to an ``@fit`` timing) as the run-time options of the same names (:class:`attncnn.training.RunOptions`).

``pack-data`` (here) packs the CIFAR-10 zip for the trip (59 MiB -> 18 MiB; ``train`` rebuilds it).

Example (the device tool's command; ``.gpu/`` is ignored by git and carried; docs/development.md
has the whole procedure)::

    python tools/gpu_job.py pack-data ../shared/data/cifar10-jpeg.zip .gpu/cifar10-jpeg.zpack
    python3 tools/gpu_job.py train --data .gpu/cifar10-jpeg.zpack --from .gpu/results \\
        --budget 545 --pack-to "$OUT" --compile paper-long/learned/0 mini-long/learned-content-mini/0:filler
    python tools/gpu_job.py unpack /work/.device/<N> --into results
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: the lending arrangement's defaults: the device machine returns at most 8 files of at most 16 MiB,
#: 64 MiB in all; parts of 15 MiB, at most 60 MiB of them, leave room for pack.json and the job's log
PART_BYTES = 15 * 2**20
MAX_BYTES = 60 * 2**20
MAX_FILES = 8
#: the files a job returns beside its parts: pack.json and the job's log
OTHER_FILES = 2
PACK_FILE = "pack.json"
#: a data set packed by :func:`pack_data`
DATA_SUFFIX = ".zpack"
#: seconds a stopped run gets to write its checkpoint before it is killed
STOP_GRACE = 60.0
POLL = 2.0
#: in the work folder while a job trains: the runs still training (each worker records, per epoch,
#: how many shared the GPU: ``device_runs``, which :mod:`attncnn.reproduce.running.machines` reads)
TRAINING_FILE = "training.json"
#: ``@fit`` plans for this share of the seconds it has: what a probe of a few steps does not see (the
#: per-epoch attention metrics and checkpoints, a filler sharing the GPU before it gives way)
FIT_SHARE = 0.9
FIT = "fit"


@dataclass(frozen=True)
class RunSpec:
    """One run of the job: ``suite/preset/seed``, a filler or not, and the length of its schedule
    when it is not the suite's (``epochs``: a shortened run, its warm-up and cosine fitted to it)."""

    suite: str
    preset: str
    seed: int
    filler: bool = False
    epochs: int | str | None = None      #: a number, :data:`FIT` (sized by the job), or None (the suite's)

    @property
    def relative(self) -> Path:
        return Path(self.suite) / self.preset / f"seed{self.seed}"

    @classmethod
    def parse(cls, text: str) -> "RunSpec":
        """``paper-long/quadratic/0``, ``mini-long/learned-content-mini/0:filler``, or with a
        schedule of its own, ``paper-long/learned-content/0@40`` (40 epochs instead of the suite's)
        or ``paper-long/learned-content/0@fit`` (as many as the job fits, see :func:`fit_epochs`).

        Raises:
            ValueError: another form (the message shows the expected one), or ``@fit`` on a filler
                (a filler takes what the primaries leave and resumes later: nothing to size).
        """
        body, _, role = text.partition(":")
        body, at, epochs = body.partition("@")
        parts = body.split("/")
        if (len(parts) != 3 or not parts[2].isdigit() or role not in ("", "filler")
                or (at and not (epochs == FIT or (epochs.isdigit() and int(epochs) > 0)))):
            raise ValueError(f"a run is SUITE/PRESET/SEED[@EPOCHS|@fit][:filler], e.g. paper-long/quadratic/0 or "
                             f"paper-long/learned-content/0@40, got {text!r}")
        if epochs == FIT and role:
            raise ValueError(f"{text}: @fit sizes a run that must finish in the job; a filler resumes later "
                             "at its own length (drop :filler, or @fit)")
        return cls(parts[0], parts[1], int(parts[2]), role == "filler",
                   (FIT if epochs == FIT else int(epochs)) if at else None)

    @property
    def fit(self) -> bool:
        """True for ``@fit``: the job sizes this run before it starts."""
        return self.epochs == FIT

    @property
    def text(self) -> str:
        """The form :meth:`parse` reads."""
        return (f"{self.suite}/{self.preset}/{self.seed}" + (f"@{self.epochs}" if self.epochs else "")
                + (":filler" if self.filler else ""))


def _job(spec: RunSpec, root: Path, epochs: int | None = None):
    """The suite job of ``spec`` under ``root``, ``spec.epochs`` long (else ``epochs``, the job's
    ``--epochs``, else the suite's length). Whether it compiles is no part of it: a run-time option
    of the worker (``TrainOptions.compile``), never of a run's recipe."""
    from attncnn.reproduce import get_suite, plan
    if spec.preset not in get_suite(spec.suite).rows:
        return _carried_job(spec, root)
    if spec.fit:
        raise ValueError(f"{spec.text}: a run of the job's own length is planned once sized (fitted_spec)")
    job = plan(get_suite(spec.suite), root / spec.suite, seeds=(spec.seed,), only=(spec.preset,),
               epochs=spec.epochs or epochs)[0]
    return job


def _carried_job(spec: RunSpec, root: Path):
    """A run folder under the suite's folder that is not one of the suite's runs (e.g. the fine-tune
    of a pruned model, ``attncnn prune --finetune-epochs``, in ``<suite>/<run>-pruned/seed0``),
    carried along (``--from``) to go on with its own configuration: its length, its recipe, its
    starting weights (``@fit`` keeps its length; the job's ``--epochs`` and ``--train-subset`` do not
    apply to it).

    Raises:
        ValueError: it was not carried along (no ``config.json`` under the job's folder), it names
            another seed than its folder, or another length than its own (``@EPOCHS``).
    """
    from attncnn.reproduce import Job
    from attncnn.runs import RunFolder, TrainConfig
    folder = root / spec.relative
    if not (folder / "config.json").is_file():
        raise ValueError(f"{spec.relative}: {spec.preset!r} is no preset of suite {spec.suite!r}, and no run folder "
                         "of that name was carried along (--from): only a started run can go on this way")
    stored = RunFolder(folder, mode="read").read_config()
    if spec.epochs not in (None, FIT, stored["epochs"]):        # @fit: its own length (fitted_spec)
        raise ValueError(f"{spec.text}: {spec.relative} is no run of suite {spec.suite!r}'s presets; it goes on with "
                         f"its own configuration, {stored['epochs']} epochs; drop @{spec.epochs}")
    if stored.get("seed", TrainConfig.seed) != spec.seed:
        raise ValueError(f"{spec.relative} holds a run of seed {stored.get('seed')}, not {spec.seed}")
    return Job(stored.get("preset", TrainConfig.preset), spec.seed, folder, (("epochs", stored["epochs"]),))


def fit_epochs(seconds: float, setup: float, epoch: float, most: int, share: float = FIT_SHARE) -> int:
    """The most epochs, at most ``most`` (the suite's), a new run can train in ``seconds``: its
    ``setup`` (data, attention paths, compilation) once, then ``epoch`` seconds per epoch (training
    and the test pass), within ``share`` of the time (:data:`FIT_SHARE`).

    Raises:
        ValueError: not even one epoch fits (the message gives the numbers)."""
    fitted = math.floor((seconds * share - setup) / epoch)
    if fitted < 1:
        raise ValueError(f"no epoch fits: {seconds:.0f} s left ({share:.0%} planned), {setup:.0f} s to set up, "
                         f"{epoch:.0f} s per epoch; give the job more seconds (--fit-seconds) or name a length (@N)")
    return min(most, fitted)


def measure_epoch(job, options) -> dict:
    """Time the new run ``job`` as its worker will train it here: its plan and its chooser's choices
    on the run's network (attention paths and ``compile`` by the written rule, as the worker will
    decide them), then
    on one real batch the first training step (compilation included), the median step after it, and
    the test pass's forward at the evaluation batch (eager, as the trainer evaluates).

    Returns:
        ``{"setup", "step", "infer", "steps", "test_batches", "epoch", "compile", "impl",
        "eval_impl", "device"}``: seconds, where ``setup`` is everything before the second step
        (planning, data, model, compilation) and ``epoch = steps * step + test_batches * infer``.
    """
    import torch

    from attncnn.layers.autocast_rules import autocast
    from attncnn.models import build_model
    from attncnn.perf.plan import make_plan
    from attncnn.perf.timing import seconds, time_median
    from attncnn.reproduce.running.runner import job_config
    from attncnn.training import Distributed, RunParts, count_test_passes
    from attncnn.training.choices import use_paths
    from attncnn.training.components import make_loaders, make_optimizer
    from attncnn.training.step import training_step
    started = time.monotonic()
    config = job_config(job, options)
    run_plan = make_plan(config, options.run_options())
    device = run_plan.device
    dataset, train_loader, test_loader = make_loaders(config, Distributed(device=device), data_dir=options.data_dir)
    torch.manual_seed(config.seed)
    model = build_model(config.preset, num_classes=dataset.num_classes,
                        **run_plan.model_options(config.model)).to(device).train()
    optimizer = make_optimizer(model, config, fused=run_plan.fused_optimizer)
    if run_plan.choose is not None:         # as the trainer decides: on this network and optimizer
        parts = RunParts(model=model, optimizer=optimizer, config=config, device=device, precision=run_plan.precision,
                         batch=train_loader.batch_size, image_shape=tuple(dataset.train.images.shape[1:]),
                         num_classes=dataset.num_classes, steps=config.epochs * len(train_loader),
                         eval_batch=max(min(test_loader.batch_size, len(dataset.test.labels)), 1),
                         test_batches=len(test_loader), test_passes=count_test_passes(config.epochs, config.eval_every))
        run_plan = run_plan.decided(run_plan.choose(parts))
        use_paths(model, run_plan.impl, run_plan.eval_impl)
    net = torch.compile(model, dynamic=False, mode=run_plan.compile_mode) if run_plan.compile else model
    graphs = run_plan.compile and run_plan.compile_mode == "reduce-overhead"
    _, (images, labels) = next(train_loader.batches(0))

    def train_step():
        if graphs:                                      # as the loop marks each step of CUDA graphs
            torch.compiler.cudagraph_mark_step_begin()
        training_step(net, optimizer, images, labels, run_plan.precision)

    seconds(train_step, device)                         # the first step: compilation when compiled
    setup = time.monotonic() - started
    step = time_median(train_step, device, warmup=0, reps=5)
    test_images, _ = next(iter(test_loader))
    model.eval()

    @torch.no_grad()
    def infer():
        with autocast(run_plan.precision, device):
            model(test_images)

    infer_s = time_median(infer, device, warmup=1, reps=3)
    return {"setup": setup, "step": step, "infer": infer_s, "steps": len(train_loader),
            "test_batches": len(test_loader), "epoch": len(train_loader) * step + len(test_loader) * infer_s,
            "compile": run_plan.compile, "impl": run_plan.impl, "eval_impl": run_plan.eval_impl, "device": str(device)}


def fitted_spec(spec: RunSpec, root: Path, seconds_left: float, measure, epochs: int | None = None) -> RunSpec:
    """``spec`` with its ``@fit`` resolved to a number of epochs: a run whose folder exists keeps its
    own length (the second call of a lease resumes it); a new one gets :func:`fit_epochs` of
    ``measure(spec)`` (a :func:`measure_epoch` dictionary) within ``seconds_left``, at most its
    suite's length (``epochs``, the job's ``--epochs``, instead where given). Other specs pass."""
    if not spec.fit:
        return spec
    suite_spec = RunSpec(spec.suite, spec.preset, spec.seed)
    folder = root / spec.relative
    if (folder / "config.json").is_file():
        from attncnn.runs import RunFolder
        epochs = RunFolder(folder, mode="read").read_config()["epochs"]
        print(f"{spec.relative}: @fit resumes at its own length, {epochs} epochs", flush=True)
        return RunSpec(spec.suite, spec.preset, spec.seed, epochs=epochs)
    most = dict(_job(suite_spec, root, epochs=epochs).overrides)["epochs"]
    timing = measure(suite_spec)
    epochs = fit_epochs(seconds_left, timing["setup"], timing["epoch"], most)
    print(f"{spec.relative}: @fit -> {epochs} epochs of {most} ({timing['epoch']:.1f} s per epoch: "
          f"{timing['steps']} steps of {timing['step'] * 1e3:.0f} ms, {timing['test_batches']} test batches of "
          f"{timing['infer'] * 1e3:.0f} ms; {timing['setup']:.0f} s to set up, compile {timing['compile']}, "
          f"paths {timing['impl']}/{timing['eval_impl']}; {seconds_left:.0f} s left)", flush=True)
    return RunSpec(spec.suite, spec.preset, spec.seed, epochs=epochs)


def write_training(root: Path, runs: list[str]) -> None:
    """Say which of the job's runs are still training (:data:`TRAINING_FILE`, replaced whole)."""
    tmp = root / (TRAINING_FILE + ".tmp")
    tmp.write_text(json.dumps({"training": runs}))
    tmp.replace(root / TRAINING_FILE)


def read_training(root: Path) -> int:
    """How many of the job's runs are training now (1 when no job says: a run trained alone)."""
    try:
        return max(1, len(json.loads((root / TRAINING_FILE).read_text())["training"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def load_average() -> float | None:
    """The system's 5-minute load average (runnable processes, this one's threads included), None
    where the system has none."""
    try:
        return round(os.getloadavg()[1], 2)
    except (AttributeError, OSError):
        return None


def sharing_metrics(epoch_metrics, root: Path):
    """``epoch_metrics`` with ``device_runs`` added, the job's runs training when the epoch began,
    and ``load_average``, the machine's load when it ended (the keys the package's reports read,
    :mod:`attncnn.reproduce.running.machines`).

    A job's runs only ever stop, so the count at an epoch's start is the most that shared the GPU
    during it; it is read when the worker starts and again at each epoch's end (the next one's start).
    """
    from attncnn.reproduce.running.machines import DEVICE_RUNS_KEY, LOAD_KEY
    began = [read_training(root)]

    def metrics(model) -> dict:
        out = dict(epoch_metrics(model))
        out[DEVICE_RUNS_KEY] = began[0]
        load = load_average()
        if load is not None:
            out[LOAD_KEY] = load
        began[0] = read_training(root)
        return out

    return metrics


def _worker(args: argparse.Namespace) -> int:
    """Train one run (a child process of ``train``)."""
    from attncnn.analysis.metrics import epoch_metrics
    from attncnn.reproduce.running.runner import train_jobs
    from attncnn.training import TrainingInterrupted
    spec = RunSpec.parse(args.run)
    job = _job(spec, Path(args.root), args.epochs)
    try:
        train_jobs([job], _train_options(args), progress=False,
                   epoch_metrics=sharing_metrics(epoch_metrics, Path(args.root)))
    except TrainingInterrupted as err:
        print(f"{spec.relative}: stopped, resumable from {err.checkpoint}", flush=True)
        return 130
    from attncnn.reproduce import job_state
    if job_state(job) == "finished":
        print(record_predictions(job.folder, args.data, args.device), flush=True)
    return 0


def record_predictions(folder: Path, data: str, device: str) -> str:
    """Record a finished run's prediction for each test image (``predictions.json``, as ``attncnn
    evaluate RUN --predictions`` writes it) on this device, at the run's precision; returns what it did.

    On the GPU this takes seconds, where a paper-width content model takes many minutes on a CPU; the
    record then travels with the run, so that a run whose weights do not come back, or are shipped
    without them (``tools/ship.py --without-weights``), still has the record its accuracy is
    checked by. A record of the final checkpoint already there is kept. A failure (the memory of a
    GPU that other runs share, say) is reported, not raised: the run is finished either way, and
    ``attncnn evaluate`` can record it later wherever its weights are.
    """
    from attncnn.api.evaluation import evaluate_run
    from attncnn.runs import PREDICTIONS_FILE, read_metadata, read_predictions
    path = folder / PREDICTIONS_FILE
    last = folder / "checkpoints" / "last.safetensors"
    try:
        if path.is_file() and read_predictions(path).epoch == read_metadata(last).get("epoch"):
            return f"{folder}: kept its prediction record of the final checkpoint"
    except (ValueError, OSError):
        pass                            # a damaged record (written again), or no checkpoint (evaluate says so)
    started = time.monotonic()
    try:
        evaluate_run(folder, data=data, predictions=path, device=device)
    except Exception as err:    # noqa: BLE001 - the trained run must come back whatever went wrong here
        return (f"{folder}: no prediction record ({type(err).__name__}: {err}); record it where its weights are: "
                "attncnn evaluate")
    return (f"{folder}: prediction record of {read_predictions(path).test_accuracy:.4f} accuracy written "
            f"in {time.monotonic() - started:.0f} s")


def _train_options(args: argparse.Namespace):
    """The run-time options of a worker's or a timing's run, from the job's flags."""
    from attncnn.reproduce.running.runner import TrainOptions
    return TrainOptions(data=args.data, device=args.device, train_subset=args.train_subset,
                        compile=True if args.compile else None, compile_mode=args.compile_mode,
                        fused_optimizer=args.fused_optimizer)


def _measure(args: argparse.Namespace) -> int:
    """Time a new run for ``@fit`` (a child process of ``train``: its CUDA memory goes with it);
    prints :func:`measure_epoch`'s dictionary as the last line."""
    job = _job(RunSpec.parse(args.run), Path(args.root), args.epochs)
    print(json.dumps(measure_epoch(job, _train_options(args))), flush=True)
    return 0


def _measure_in_child(spec: RunSpec, root: Path, args: argparse.Namespace, log: Path,
                      timeout: float | None = None) -> dict:
    """:func:`measure_epoch` of ``spec`` in a child process, its output in ``log``, stopped (with the
    processes it started: the compiler's workers) after ``timeout`` seconds.

    Raises:
        RuntimeError: the child failed or ran past ``timeout`` (the message ends with its output's
            last lines)."""
    command = [sys.executable, __file__, "measure", spec.text, "--root", str(root), "--data", args.data,
               "--device", args.device] + _run_flags(args)
    from row_process import kill_group

    # a session of its own, so that a stop reaches the compile workers too
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(child)
        stdout, stderr = child.communicate()
        log.write_text(stdout + stderr)
        raise RuntimeError(f"timing {spec.relative} took more than {timeout:.0f} s, the job's time left; stopped: "
                           f"{(stdout + stderr)[-1500:]}") from None
    finally:
        kill_group(child)
    log.write_text(stdout + stderr)
    if child.returncode != 0:
        raise RuntimeError(f"timing {spec.relative} failed: {(stdout + stderr)[-1500:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _run_flags(args: argparse.Namespace) -> list[str]:
    """The job's options that every run's process takes (compile and its mode, the optimizer's
    kernel, smoke-run length and subset)."""
    return ((["--compile"] if args.compile else [])
            + (["--compile-mode", args.compile_mode] if args.compile_mode != "default" else [])
            + (["--fused-optimizer"] if args.fused_optimizer else [])
            + (["--epochs", str(args.epochs)] if args.epochs else [])
            + (["--train-subset", str(args.train_subset)] if args.train_subset else []))


def _epochs_done(folder: Path) -> int:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


class _Running:
    """A run's process and the wall-clock times at which its epoch records appeared."""

    def __init__(self, spec: RunSpec, process: subprocess.Popen, folder: Path, epochs: int):
        self.spec, self.process, self.folder, self.epochs = spec, process, folder, epochs
        self.seen = _epochs_done(folder)
        self.times = [time.monotonic()]
        self.stopped = False

    def poll_epochs(self) -> None:
        done = _epochs_done(self.folder)
        if done > self.seen:
            self.times += [time.monotonic()] * (done - self.seen)
            self.seen = done

    def projected_end(self) -> float | None:
        """When the run would finish at the pace of its last epoch (None: no epoch timed yet;
        the first one includes the start and any compilation)."""
        if len(self.times) < 3:
            return None
        return self.times[-1] + (self.epochs - self.seen) * (self.times[-1] - self.times[-2])

    def stop(self) -> None:
        if not self.stopped and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)     # once: a second signal stops without a checkpoint
        self.stopped = True


def to_stop(running: list, now: float, deadline: float) -> list[tuple[object, str]]:
    """The runs to stop now, with the reason: every run at the deadline; before it, every filler
    as soon as a primary still training is projected to end after the deadline (its pace is that
    of its last epoch, which the fillers slow down: stopping them gives the primary the GPU)."""
    late = [r for r in running if not r.spec.filler and r.process.poll() is None
            and (r.projected_end() or 0) > deadline]
    out = []
    for r in running:
        if r.stopped or r.process.poll() is not None:
            continue
        if now > deadline:
            out.append((r, "deadline"))
        elif r.spec.filler and late:
            out.append((r, f"{late[0].spec.relative} projected past the deadline"))
    return out


def _train(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.budget
    specs = [RunSpec.parse(text) for text in args.runs]
    root = Path(args.work).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.data.endswith(DATA_SUFFIX):
        args.data = str(unpack_data(args.data, root / "data"))
        print(f"data: {args.data} rebuilt from its pack", flush=True)
    if args.from_dir:
        for spec in specs:
            source = Path(args.from_dir) / spec.relative
            if source.is_dir() and not (root / spec.relative).exists():
                shutil.copytree(source, root / spec.relative)
                print(f"{spec.relative}: carried along, resumes from its last checkpoint", flush=True)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    fit_seconds = args.budget if args.fit_seconds is None else args.fit_seconds
    sized = []
    for spec in specs:                  # before any run starts: each is timed with the GPU to itself
        log_file = logs / f"{spec.suite}-{spec.preset}-seed{spec.seed}-fit.log"
        try:
            # the timing may take what is left of the call's budget, no more: past it nothing trains
            sized.append(fitted_spec(spec, root, fit_seconds - (time.monotonic() - started),
                                     lambda s: _measure_in_child(s, root, args, log_file,
                                                                 max(deadline - time.monotonic(), 1.0)),
                                     args.epochs))
        except (RuntimeError, ValueError) as err:
            print(f"{spec.relative}: not trained: {err}", flush=True)
    specs = sized
    running = []
    write_training(root, [str(spec.relative) for spec in specs])     # before any worker reads it
    for spec in specs:
        epochs = dict(_job(spec, root, epochs=args.epochs).overrides).get("epochs") or 0     # the worker's length
        worker_spec = RunSpec(spec.suite, spec.preset, spec.seed, epochs=spec.epochs)     # the worker is no filler
        command = [sys.executable, __file__, "worker", worker_spec.text,
                   "--root", str(root), "--data", args.data, "--device", args.device] + _run_flags(args)
        log = open(logs / f"{spec.suite}-{spec.preset}-seed{spec.seed}.log", "w")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        running.append(_Running(spec, process, root / spec.relative, epochs))
        print(f"{spec.relative}: started ({'filler' if spec.filler else 'primary'}, pid {process.pid})", flush=True)
    while any(r.process.poll() is None for r in running):
        time.sleep(POLL)
        write_training(root, [str(r.spec.relative) for r in running if r.process.poll() is None and not r.stopped])
        now = time.monotonic()
        for r in running:
            r.poll_epochs()
        for r, why in to_stop(running, now, deadline):
            print(f"{r.spec.relative}: stopping ({why}) after {r.seen} epochs, {now - started:.0f} s", flush=True)
            r.stop()
        for r in running:
            if r.stopped and r.process.poll() is None and now > deadline + STOP_GRACE:
                r.process.kill()
    for r in running:
        r.poll_epochs()
        print(f"{r.spec.relative}: exit {r.process.returncode}, {r.seen} epoch records, "
              f"{time.monotonic() - started:.0f} s since the job started", flush=True)
        print((logs / f"{r.spec.suite}-{r.spec.preset}-seed{r.spec.seed}.log").read_text()[-1500:], flush=True)
    pack(root, specs, Path(args.pack_to), logs, epochs=args.epochs, max_bytes=int(args.max_mib * 2**20),
         part_bytes=int(args.part_mib * 2**20), max_files=args.max_files, data=args.data)
    return 0


def _prepare(root: Path, spec: RunSpec, epochs: int | None = None) -> dict:
    """Trim a finished run or ship an unfinished one in place; returns its entry in pack.json."""
    from trim import trim_run
    from unfinished import ship_unfinished

    from attncnn.reproduce import job_state
    job = _job(spec, root, epochs=epochs)
    state = job_state(job)
    if state == "finished":
        trim_run(job.folder, keep_epochs=False, lean=True)
    elif state == "interrupted":
        ship_unfinished(job.folder)
    entry = {"run": str(spec.relative), "state": state, "epochs": _epochs_done(job.folder)}
    if state == "finished":
        from attncnn.runs import PREDICTIONS_FILE, read_metadata, read_predictions
        final = json.loads((job.folder / "finished.json").read_text()).get("final") or {}
        entry["test_accuracy"] = final.get("test_accuracy")
        if (job.folder / PREDICTIONS_FILE).is_file():       # recorded on the device (record_predictions)
            entry["predictions"] = read_predictions(job.folder / PREDICTIONS_FILE).test_accuracy
        weights = job.folder / "checkpoints" / "last.safetensors"
        # packed again after a first call shrank it in place (a run resumed on the warm machine)
        if weights.is_file() and read_metadata(weights).get("weights_dtype") == "bfloat16":
            entry["weights"] = "bfloat16"
    return entry


#: where a job moves the weights that stay behind (the machine keeps nothing after the job)
LEFT_BEHIND = "left-behind"


def left_behind(root: Path, spec: RunSpec, epochs: int | None, why: str, data: str | None) -> bool:
    """Make the finished run ``spec``, whose weights cannot come back, a run shipped without them
    (``tools/ship.py --without-weights``, :func:`withhold.withhold_jobs`): its
    record of the weights (size, sha256, metadata, attention per layer, the command that trains it
    again), its ``checkpoints/`` moved to ``root/left-behind``. Returns False, changing nothing,
    where the run has no prediction record (then nothing could check its accuracy again), or where
    making the record fails (said, not raised: the other runs must still be packed)."""
    from withhold import withhold_jobs

    from attncnn.reproduce import get_suite
    from attncnn.runs import PREDICTIONS_FILE, WITHHELD_FILE
    job = _job(spec, root, epochs=epochs)
    if not (job.folder / PREDICTIONS_FILE).is_file():
        return False
    try:
        withhold_jobs(get_suite(spec.suite), root / spec.suite, [job], [spec.preset], data=data,
                      weights_to=root / LEFT_BEHIND / spec.suite,
                      note=f"left on the GPU machine of the job that trained it, which keeps nothing: {why}")
    except Exception as err:    # noqa: BLE001 - whatever failed, the pack goes on with the records alone
        if (job.folder / "checkpoints").exists():       # else the record was written and the weights moved
            print(f"warning: {spec.relative}: no record of its weights ({type(err).__name__}: {err})", flush=True)
            (job.folder / WITHHELD_FILE).unlink(missing_ok=True)   # a record beside its weights says nothing
            return False
    return True


def to_bfloat16(path: Path) -> None:
    """Rewrite a weights-only checkpoint with its floating-point tensors in bfloat16 (half the
    bytes; ``attncnn`` loads them into float32 models, widening exactly).

    Raises:
        ValueError: the checkpoint holds an optimiser state (a resumable one must stay exact)."""
    import torch

    from attncnn.runs import load_checkpoint, write_checkpoint
    ckpt = load_checkpoint(path)
    if ckpt.optimizer_state is not None:
        raise ValueError(f"{path} holds an optimiser state: only a finished run's weights are stored in bfloat16")
    ckpt.model_state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in ckpt.model_state.items()}
    ckpt.metadata = {**ckpt.metadata, "weights_dtype": "bfloat16"}
    write_checkpoint(path, ckpt)


def _tar_bytes(root: Path, relatives: list[Path], extra: list[Path], leave_out: set[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for relative in relatives:
            if (root / relative).exists():
                tar.add(root / relative, arcname=str(relative), filter=lambda info: None if root / info.name in
                        leave_out else info)
        for path in extra:
            tar.add(path, arcname=str(Path("logs") / path.name))
    return buffer.getvalue()


def pack(root: Path, specs: list[RunSpec], out: Path, logs: Path | None = None, *, epochs: int | None = None,
         max_bytes: int = MAX_BYTES, part_bytes: int = PART_BYTES, max_files: int = MAX_FILES,
         data: str | None = None) -> dict:
    """Pack the runs of ``specs`` under ``root`` into ``out``: parts ``runs.tar.gz.NNN`` of at most
    ``part_bytes`` and ``pack.json``. Returns the manifest.

    What does not fit in ``max_bytes``, or in ``max_files`` files with pack.json and the log
    (:data:`OTHER_FILES`), is shrunk one run at a time, largest first, until it fits:
    finished runs' weights are stored in bfloat16; then unfinished runs' checkpoints stay behind
    (``"checkpoint": "left behind"``; such a run is not unpacked); then finished runs' weights stay
    behind (their records and configuration still come back; ``"weights": "left behind"``). A
    finished run's weights go last because they are the result itself, while an unfinished run
    can be resumed on the still-warm machine or retrained; a paper-width model's resumable
    checkpoint (about 150 MB) never fits anyway and must not take a finished run's weights with it.

    A finished run whose weights stay behind and that has its prediction record
    (:func:`record_predictions`) comes back as a run shipped without its weights
    (``"weights": "withheld"``): :func:`left_behind` writes its ``weights-withheld.json`` here,
    from the weights, with its attention per layer measured on the test images of ``data``.
    Without a record it comes back with its records alone, and no command here can read it
    as a model.
    """
    if max_files <= OTHER_FILES:
        raise ValueError(f"a job returns pack.json and its log beside the parts: --max-files must be above "
                         f"{OTHER_FILES}, got {max_files}")
    max_bytes = min(max_bytes, (max_files - OTHER_FILES) * part_bytes)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for spec in specs:
        try:
            entries.append(_prepare(root, spec, epochs))
        except ValueError as err:        # e.g. never started: nothing to bring back
            entries.append({"run": str(spec.relative), "state": "not packed", "why": str(err)})
    log_files = sorted(logs.glob("*.log")) if logs else []
    relatives = [Path(e["run"]) for e in entries if e["state"] in ("finished", "interrupted")]
    leave_out: set[Path] = set()
    data = _tar_bytes(root, relatives, log_files, leave_out)

    def size(entry: dict, name: str) -> int:
        return sum(f.stat().st_size for f in (root / entry["run"] / name).rglob("*") if f.is_file())

    finished = sorted((e for e in entries if e["state"] == "finished"), key=lambda e: -size(e, "checkpoints"))
    unfinished = sorted((e for e in entries if e["state"] == "interrupted"), key=lambda e: -size(e, "checkpoints"))
    steps = ([(e, "weights", "bfloat16") for e in finished] + [(e, "checkpoint", "left behind") for e in unfinished]
             + [(e, "weights", "left behind") for e in finished])
    for entry, key, shrink in steps:
        if len(data) <= max_bytes:
            break
        if entry.get(key) == shrink:        # already in bfloat16 (shrunk by an earlier call)
            continue
        if key == "checkpoint":
            leave_out.add(root / entry["run"] / "checkpoints")
            print(f"warning: {entry['run']}: its resumable checkpoint left behind: the pack would exceed "
                  f"{max_bytes / 2**20:.0f} MiB", flush=True)
        elif shrink == "bfloat16":
            to_bfloat16(root / entry["run"] / "checkpoints" / "last.safetensors")
        else:
            spec = next(s for s in specs if str(s.relative) == entry["run"])
            why = f"the pack would exceed {max_bytes / 2**20:.0f} MiB"
            if left_behind(root, spec, epochs, why, data):
                shrink = "withheld"
            else:
                leave_out.add(root / entry["run"] / "checkpoints" / "last.safetensors")
            print(f"warning: {entry['run']}: its final weights left behind ({shrink}): {why}", flush=True)
        entry[key] = shrink
        data = _tar_bytes(root, relatives, log_files, leave_out)
    parts = []
    for n, start in enumerate(range(0, len(data), part_bytes)):
        chunk = data[start:start + part_bytes]
        name = f"runs.tar.gz.{n:03d}"
        (out / name).write_bytes(chunk)
        parts.append({"file": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"runs": entries, "parts": parts, "sha256": hashlib.sha256(data).hexdigest()}
    (out / PACK_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    for e in entries:
        print(f"packed {e['run']}: {e['state']}, {e.get('epochs', 0)} epochs"
              + (f", test accuracy {e['test_accuracy']:.4f}" if e.get("test_accuracy") is not None else "")
              + (f", weights {e['weights']}" if e.get("weights") else "")
              + (f", prediction record {e['predictions']:.4f}" if e.get("predictions") is not None else ""),
              flush=True)
    print(f"pack: {len(data) / 2**20:.1f} MiB in {len(parts)} parts", flush=True)
    return manifest


def pack_data(zip_path: str | Path, out: str | Path) -> int:
    """Write a zip of images (the CIFAR-10 JPEG copy) as one zlib stream: its members' names and
    bytes, in order. The copy's 60,000 JPEGs share their headers, so this is 18 MB where the zip is
    62 MB, which leaves room in the 64 MiB a job receives for unfinished runs to resume.
    Returns the bytes written."""
    import zipfile
    import zlib
    with zipfile.ZipFile(zip_path) as archive:
        infos = archive.infolist()
        index = [[i.filename, i.file_size] for i in infos]
        payload = b"".join(archive.read(i) for i in infos if not i.is_dir())
    head = json.dumps({"name": Path(zip_path).name, "members": index}).encode()
    data = zlib.compress(len(head).to_bytes(8, "little") + head + payload, 6)
    Path(out).write_bytes(data)
    return len(data)


def unpack_data(packed: str | Path, folder: str | Path) -> Path:
    """Rebuild the zip that :func:`pack_data` packed, under its own file name in ``folder``; the
    members' bytes are the original ones, so the decoded images (and a run's record of its data
    set) are the same. Returns the zip's path.

    Raises:
        ValueError: the pack's index does not account for its bytes (a damaged or cut file).
        zlib.error: the file is not a zlib stream (not made by :func:`pack_data`)."""
    import zipfile
    import zlib
    data = zlib.decompress(Path(packed).read_bytes())
    size = int.from_bytes(data[:8], "little")
    head = json.loads(data[8:8 + size])
    path = Path(folder) / head["name"]
    path.parent.mkdir(parents=True, exist_ok=True)
    offset = 8 + size
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, length in head["members"]:
            if name.endswith("/"):
                archive.mkdir(name) if hasattr(archive, "mkdir") else archive.writestr(name, b"")
                continue
            archive.writestr(name, data[offset:offset + length])
            offset += length
    if offset != len(data):
        raise ValueError(f"{packed} is damaged: its index does not account for its bytes")
    return path


def _read_pack(folder: Path) -> tuple[dict, bytes]:
    manifest = json.loads((folder / PACK_FILE).read_text())
    chunks = []
    for part in manifest["parts"]:
        path = folder / part["file"]
        if not path.is_file():
            raise ValueError(f"{path} is missing: fetch every file the job wrote ({PACK_FILE} lists them)")
        chunk = path.read_bytes()
        if hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise ValueError(f"{path} does not match its sha256 in {PACK_FILE}: the copy is damaged, fetch it again")
        chunks.append(chunk)
    data = b"".join(chunks)
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise ValueError(f"the parts in {folder} do not join into the packed file: fetch them again")
    return manifest, data


def unpack(folder: str | Path, into: str | Path) -> list[str]:
    """Extract a job's runs into ``into`` (e.g. ``results``); returns what happened to each run.

    A run not there yet is added; an unfinished run there is replaced when the pack holds it
    finished or further along; a finished run there is kept (the pack's copy is skipped).

    Raises:
        ValueError: a missing or damaged part (named).
    """
    from attncnn.runs import RunFolder
    manifest, data = _read_pack(Path(folder))
    into = Path(into)
    done = []
    with tempfile.TemporaryDirectory(dir=into.parent if into.parent.exists() else None) as tmp:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")      # refuses absolute paths, links out, devices
        for entry in manifest["runs"]:
            if entry["state"] not in ("finished", "interrupted"):
                done.append(f"{entry['run']}: not in the pack ({entry.get('why', entry['state'])})")
                continue
            source, target = Path(tmp) / entry["run"], into / entry["run"]
            if entry.get("checkpoint") == "left behind":      # records without a checkpoint resume nothing
                done.append(f"{entry['run']}: not unpacked: unfinished, and its checkpoint was left behind (its "
                            f"{entry['epochs']} epoch records are in the pack)")
                continue
            if target.exists():
                here = RunFolder(target, mode="read")
                if here.finished:
                    done.append(f"{entry['run']}: kept the finished run already in {into}")
                    continue
                if entry["state"] != "finished" and _epochs_done(target) >= entry["epochs"]:
                    done.append(f"{entry['run']}: kept {target} (as far along as the pack's copy)")
                    continue
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(source), str(target))
            done.append(f"{entry['run']}: {entry['state']} after {entry['epochs']} epochs -> {target}")
    return done


def _kernel_options(parser: argparse.ArgumentParser) -> None:
    """``--compile-mode`` and ``--fused-optimizer``: the runs' run-time options of the same names
    (:class:`attncnn.training.RunOptions`; reduce-overhead compiles without --compile, on CUDA only)."""
    parser.add_argument("--compile-mode", choices=("default", "reduce-overhead"), default="default",
                        help="torch.compile mode of the runs' steps (reduce-overhead: CUDA graphs; implies --compile)")
    parser.add_argument("--fused-optimizer", action="store_true", help="the optimizer's fused kernel in every run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train runs within a time budget and pack them (on the GPU machine)")
    t.add_argument("runs", nargs="+", metavar="SUITE/PRESET/SEED[@EPOCHS|@fit][:filler]")
    t.add_argument("--data", required=True, help=f"the CIFAR-10 zip or folder, or a *{DATA_SUFFIX} from pack-data")
    t.add_argument("--from", dest="from_dir", help="a results-like folder holding unfinished runs to resume")
    t.add_argument("--work", default="/tmp/attncnn-gpu-job", help="where the runs train")
    t.add_argument("--budget", type=float, required=True, help="seconds until every run is stopped and packed")
    t.add_argument("--fit-seconds", type=float, help="seconds from the job's start within which @fit runs end "
                   "(default: --budget; more when a second call on the warm machine will resume them)")
    t.add_argument("--pack-to", required=True, help="folder of the files to bring back ($OUT)")
    t.add_argument("--device", default="cuda")
    t.add_argument("--compile", action="store_true", help="torch.compile the runs' training steps (new and resumed)")
    _kernel_options(t)
    t.add_argument("--epochs", type=int, help="smoke runs: epochs instead of the suite's")
    t.add_argument("--train-subset", type=int, metavar="N", help="smoke runs: train on N images")
    t.add_argument("--max-mib", type=float, default=MAX_BYTES / 2**20, help="largest pack (default: %(default)s)")
    t.add_argument("--part-mib", type=float, default=PART_BYTES / 2**20,
                   help="largest file the machine returns, less room (default: %(default)s)")
    t.add_argument("--max-files", type=int, default=MAX_FILES,
                   help="files the machine returns, pack.json and the log included (default: %(default)s)")
    for name in ("worker", "measure"):           # a run's process, and a new run's timing for @fit
        w = sub.add_parser(name, help=argparse.SUPPRESS)
        w.add_argument("run")
        w.add_argument("--root", required=True)
        w.add_argument("--data", required=True)
        w.add_argument("--device", default="cuda")
        w.add_argument("--compile", action="store_true")
        _kernel_options(w)
        w.add_argument("--epochs", type=int)
        w.add_argument("--train-subset", type=int)
    d = sub.add_parser("pack-data", help=f"pack an image zip for the trip (here; train takes the *{DATA_SUFFIX})")
    d.add_argument("zip")
    d.add_argument("out")
    u = sub.add_parser("unpack", help="check a job's files and extract its runs (here)")
    u.add_argument("folder", help="the folder holding pack.json and its parts")
    u.add_argument("--into", default="results")
    args = parser.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.command == "worker":
        return _worker(args)
    if args.command == "measure":
        return _measure(args)
    if args.command == "train":
        return _train(args)
    if args.command == "pack-data":
        if not args.out.endswith(DATA_SUFFIX):
            parser.error(f"the packed data set's name must end with {DATA_SUFFIX} (train recognises it so)")
        print(f"{args.out}: {pack_data(args.zip, args.out) / 2**20:.1f} MiB")
        return 0
    for line in unpack(args.folder, args.into):
        print(line)
    return 0


if __name__ == "__main__":
    # a lent GPU machine has attncnn's dependencies but not attncnn: the job (and each worker and timing
    # it starts as `python gpu_job.py ...`) runs the checkout's src/, the code it carried; the process-group
    # kill is the one the GPU benchmarks use (benchmarks/gpu/row_process.py)
    _repo = Path(__file__).resolve().parents[1]
    sys.path[1:1] = [str(_repo / "src"), str(_repo / "benchmarks" / "gpu")]
    sys.exit(main())
