"""The training loop: :func:`train`. Read it top to bottom; every decision is an inline ``if``.

The caller makes the run's :class:`~attncnn.training.RunPlan` (:func:`attncnn.perf.make_plan` or
:func:`attncnn.perf.resume_plan`); :func:`train` sets the run up (:func:`_train`) and :func:`_loop`
trains it. Every ``SYNC_EVERY`` steps the loop checks the loss and draws the progress; each epoch
ends with a test pass (every ``eval_every`` epochs and after the last; other records have no
``test_*`` keys), the metrics record and the checkpoints ``best``, periodic and ``last``.

What survives what:

* **SIGINT / SIGTERM**: the current step finishes, a resumable ``last`` checkpoint is written and
  :class:`TrainingInterrupted` is raised (the CLI exits with 130 / 143 and prints the ``--resume``
  command). A second signal stops at once.
* **Resume**, also mid-epoch (:mod:`attncnn.training.state`): bit-identical to an uninterrupted run
  on CPU in deterministic mode; ``checkpoint_every_steps`` refreshes ``last`` within epochs.
* **Non-finite loss**: read at every sync point and before every checkpoint, so the error names
  the exact step, batch and learning rate, and nothing is written after the failure.

Several processes: see :mod:`attncnn.training.distributed`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..data import DeviceLoader
from ..errors import InputError
from ..runs import RunFolder, TrainConfig, load_checkpoint, resumable_config
from ..runs.main_process_folder import MainProcessRunFolder
from .choices import choose_on
from .components import deterministic_algorithms, fitted_to_images, make_loaders
from .distributed import Distributed, launch_from_env, per_process_batch, processes
from .errors import NonFiniteLossError, TrainingError, TrainingInterrupted
from .evaluation import evaluate
from .init_from import load_weights
from .plan import RunPlan
from .progress import EpochMeter
from .saver import Saver
from .signals import stop_on_signals
from .state import TrainState, position_text
from .step import training_step

__all__ = ["train", "SYNC_EVERY", "EpochMetrics", "evaluates", "count_test_passes"]

log = logging.getLogger(__name__)

#: Steps between host syncs of the running sums: finite-loss check, progress bar and, under DDP,
#: the agreement on stop requests.
SYNC_EVERY = 25

#: Extra per-epoch metrics of the trained model, merged into its metrics record (the command line
#: passes :func:`attncnn.analysis.metrics.epoch_metrics`: per-head attention distances).
EpochMetrics = Callable[[nn.Module], dict]


def evaluates(epoch: int, epochs: int, eval_every: int) -> bool:
    """Whether epoch ``epoch`` (1-based) of a run of ``epochs`` ends with a test pass: every
    ``eval_every`` epochs, and the last one always."""
    return epoch % eval_every == 0 or epoch == epochs


def count_test_passes(epochs: int, eval_every: int) -> int:
    """How many test passes a run of ``epochs`` makes (:func:`evaluates`):
    ``ceil(epochs / eval_every)`` (the multiples of ``eval_every``, plus the last epoch), counted
    without a loop.

    Raises:
        InputError: ``eval_every`` < 1 (no schedule).
    """
    if eval_every < 1:
        raise InputError(f"eval_every must be >= 1, got {eval_every}")
    return -(-epochs // eval_every) if epochs > 0 else 0


def train(config: TrainConfig | None, out_dir: str | Path, plan: RunPlan, *, mode: str = "new",
          progress: bool = True, epoch_metrics: EpochMetrics | None = None) -> dict:
    """Train the recipe ``config`` into the run folder ``out_dir`` as ``plan`` says; returns the final summary.

    Args:
        config: the recipe (ignored on resume: the run's own ``config.json`` is used).
            ``config.batch_size`` is the global batch, whatever the number of processes.
        out_dir: run folder.
        plan: how this machine trains it (:class:`~attncnn.training.RunPlan`, from
            :func:`attncnn.perf.make_plan` or :func:`attncnn.perf.resume_plan`); what it leaves open
            is decided by ``plan.choose`` before the first step. A new run writes the recipe to
            ``config.json`` (never rewritten); the decided plan goes to ``machine.json``, one segment
            per call, and each epoch record names its ``"precision"`` and ``"compiled"``.
        mode: ``"new"`` (refuse a non-empty folder), ``"overwrite"``, or ``"resume"``
            (continue from the folder's last checkpoint with its stored recipe, also mid-epoch).
        progress: show a tqdm progress bar on stderr (rank 0 only under DDP).
        epoch_metrics: called with the model after each epoch's evaluation; its numbers join the
            epoch's record. It must not draw random numbers (a resumed run would differ).

    Under ``torchrun`` every process calls this with the same arguments (see
    :mod:`attncnn.training.distributed`); only rank 0 writes ``out_dir``; every process returns the
    same summary. Compiled code is left as it was: a caller that trains many compiled runs in one
    process calls ``torch._dynamo.reset()`` between them, as ``attncnn reproduce`` does, or dynamo
    stops compiling past its per-function cache limit.

    Raises:
        RunFolderError, DataError, ValueError, TrainingError: with a message naming the fix
            (ValueError also for a batch size that does not split evenly over the processes).
        NonFiniteLossError: NaN/Inf loss; nothing is written after it (the last checkpoint is good).
        TrainingInterrupted: SIGINT/SIGTERM; the message holds the ``--resume`` command, with the
            run-time flags this call was given (``plan.options``).
    """
    launch = launch_from_env()
    if launch is None or launch.rank == 0:      # the only writer; the other ranks learn of a refusal from it
        RunFolder.check_not_in_use(out_dir)
        if mode == "new":
            RunFolder.check_new(out_dir)        # before the data set is loaded for a run that could not start
    if mode == "resume":
        config = resumable_config(out_dir)
    # Everything that can fail on bad input (device, data, model options) happens before the run
    # folder is created or overwritten, so a failed start leaves no half-made run behind.
    per_process_batch(config.batch_size, 1 if launch is None else launch.world_size)
    with deterministic_algorithms(plan.deterministic, plan.device), processes(launch, plan.device) as dist:
        return _train(config, out_dir, plan, mode, progress and dist.is_main, dist, epoch_metrics)


def _train(config: TrainConfig, out_dir: str | Path, plan: RunPlan, mode: str, progress: bool, dist: Distributed,
           epoch_metrics: EpochMetrics | None) -> dict:
    """Set up the data, the state and the run folder (a new run's ``config.json``, this segment of
    ``machine.json``), then run :func:`_loop` and mark the run finished."""
    dataset, train_loader, test_loader = make_loaders(config, dist, data_dir=plan.options.data_dir,
                                                      download=plan.options.download)
    if mode != "resume":
        config = fitted_to_images(config, dataset)      # config.json records the size the network is built for
    # A new run reads --init-from before its folder exists, so a mismatch leaves nothing behind;
    # a resume checks the model against the checkpoint it will load before allocating it.
    resume_from = RunFolder(out_dir, mode="read").latest_checkpoint() if mode == "resume" else None
    state = TrainState.start(config, dataset, train_loader, dist, shaped_like=resume_from,
                             init_from=None if mode == "resume" else config.init_from, paths=plan.model_options({}),
                             fused_optimizer=plan.fused_optimizer)
    run = MainProcessRunFolder.open(out_dir, mode, dist)     # rank 0 writes, every rank reads
    try:
        saver = Saver(run, state, tuple(plan.options.flags()))
        if mode == "resume":
            _resume(state, saver)
        else:
            run.write_config(config.to_dict())
        # the choices left open, on the real objects (state put back), before the segment records them
        plan = choose_on(plan, state, dataset, train_loader, test_loader)
        segment = _segment(state, plan, dataset)
        run.start_segment(segment, plan.machine)
        log.info("preset %s: %s parameters, %d classes, data %s, device %s, precision %s%s", config.preset,
                 f"{state.about['parameters']:,}", dataset.num_classes, dataset.source, dist.device,
                 plan.precision, (f", compiled ({plan.compile_mode} mode)" if plan.compile else "")
                 + (", fused optimizer" if plan.fused_optimizer else ""))
        if "attention_paths" in segment:
            log.info("attention paths (training, per layer): %s", ", ".join(segment["attention_paths"]["train"]))
        if dist.enabled:
            log.info("DDP over %d processes: global batch %d = %d examples per process and step, %d steps "
                     "per epoch", dist.world_size, config.batch_size, train_loader.batch_size, len(train_loader))
        try:
            _loop(state, saver, plan, train_loader, test_loader, progress, epoch_metrics)
        except NonFiniteLossError as err:
            run.end_segment(state.epoch, "failed")       # every process found it at the same step
            saver.explain(err)
            raise
        except TrainingInterrupted:
            run.end_segment(state.epoch, "interrupted")  # agreed by every process
            raise
        run.end_segment(state.epoch, "finished")
        summary = {"preset": config.preset, "epochs": config.epochs, "parameters": state.about["parameters"],
                   "dataset": dataset.source, "final": state.record, "best": state.best}
        run.mark_finished(summary)
        return summary
    except BaseException:
        if mode != "resume":
            run.discard_if_unstarted()      # stopped before its first checkpoint: no half-made run left behind
        raise
    finally:
        run.close()


def _segment(state: TrainState, plan: RunPlan, dataset) -> dict:
    """This process's segment of ``machine.json`` as it starts (:mod:`attncnn.runs.machine_file`):
    where it starts, how the plan runs it, and each attention layer's paths."""
    segment = {"epochs": [state.epoch + 1, state.epoch], "start": {"epoch": state.epoch, "step": state.step},
               "device": str(state.dist.device), "precision": plan.precision, "compiled": plan.compile,
               **({"compile_mode": plan.compile_mode} if plan.compile else {}),
               "fused_optimizer": plan.fused_optimizer, "deterministic": plan.deterministic}
    model = state.model
    if hasattr(model, "attention_paths"):
        size = dataset.train.images.shape[-2:]
        was = model.training
        segment["attention_paths"] = {"train": model.train().attention_paths(*size),
                                      "test": model.eval().attention_paths(*size)}
        model.train(was)
    return segment


def _resume(state: TrainState, saver: Saver) -> None:
    """Restore ``state`` from the run folder's newest checkpoint (or, if there is none, start again
    from the run's initial weights) and make ``metrics.jsonl`` agree with it (records written after
    it dropped, a torn record of its own epoch restored from it)."""
    run, dist = saver.run, state.dist
    found = run.latest_checkpoint()
    if found is not None:
        state.from_checkpoint(load_checkpoint(found), found)
    elif state.config.init_from is not None:
        load_weights(state.model, state.config.init_from)     # stopped before its first checkpoint
    steps = state.schedule.steps_per_epoch
    _same_start(dist, -1 if found is None else state.epoch * (steps + 1) + state.step, run.path)
    # records of epochs after the checkpoint (all of them without one: a crash before the first
    # checkpoint) are trained again, so they go; the checkpoint's own epoch record replaces a torn line
    run.rewind_metrics(0 if found is None else state.epoch, state.record if found is not None else None)
    if found is not None:
        saver.last_good = (found, state.epoch, state.step)
        log.info("resuming %s from %s (%s)", run.path, found.name, position_text(state.epoch, state.step))


def _same_start(dist: Distributed, position: int, run_path: Path) -> None:
    """Under DDP, refuse to go on unless every process resumed from the same point (a collective)."""
    if dist.enabled and dist.max_int(position) != -dist.max_int(-position):
        raise TrainingError(f"the processes found different checkpoints in {run_path}: every process must see "
                            "the same run folder (on several nodes, put it on a shared file system)")


def _loop(state: TrainState, saver: Saver, plan: RunPlan, train_loader: DeviceLoader, test_loader: DeviceLoader,
          progress: bool, epoch_metrics: EpochMetrics | None) -> None:
    """Train from the state's position to the last epoch; see the module docstring for the order."""
    config, dist, steps, every = state.config, state.dist, len(train_loader), state.config.checkpoint_every_steps
    net = dist.wrap(state.model)   # DDP averages the gradients; state.model stays the plain module (saved weights)
    # static shapes: a ragged last batch compiles a second graph instead of turning every step dynamic
    net = torch.compile(net, dynamic=False, mode=plan.compile_mode) if plan.compile else net
    warming = plan.compile      # the first compiled step includes the compilation: log its cost
    # CUDA graphs replay into the same memory: each step is marked, so its outputs may overwrite the
    # last one's (nothing below keeps a step's loss or logits past the next step's start)
    graphs = plan.compile and plan.compile_mode == "reduce-overhead"
    with stop_on_signals() as stop:
        while state.epoch < config.epochs:
            epoch = state.epoch
            lr = state.schedule.lr_at(epoch, min(state.step, steps - 1))
            net.train()
            with EpochMeter(epoch, steps, state.step, state.sums, progress) as meter:
                for step, (images, labels) in train_loader.batches(epoch, start=state.step):
                    lr = state.schedule.set_lr(state.optimizer, epoch, step)
                    started = time.perf_counter() if warming else 0.0
                    if graphs:
                        torch.compiler.cudagraph_mark_step_begin()
                    loss, logits = training_step(net, state.optimizer, images, labels, plan.precision,
                                                 label_smoothing=config.label_smoothing)
                    if warming:
                        warming = False
                        log.info("first compiled step %.1f s (compile warm-up included)", time.perf_counter() - started)
                    state.add_step(loss.detach(), logits.detach(), labels)       # on the device: no host sync
                    synced = state.step % SYNC_EVERY == 0 or state.step == steps
                    if synced:
                        state.check_finite()                                     # one host sync
                        meter.show(state.step, state.sums, lr)
                    due = bool(every) and (epoch * steps + state.step) % every == 0 and state.step < steps
                    # A signal reaches each process on its own: one process looks after every step,
                    # several compare notes (a collective) only where all of them are at the same step.
                    if dist.enabled and not (synced or due):
                        continue
                    signum = dist.max_int(stop.signum or 0)
                    if signum or due:
                        state.check_finite()                                     # never checkpoint a broken model
                        saver.save("last")
                    if signum:
                        raise saver.interrupted(signum, f"epoch {epoch + 1}/{config.epochs}, step {state.step} "
                                                        f"of {steps}")
                stats = meter.finish(state.sums, lr, dist)
            test, tested = {}, "not evaluated"
            if evaluates(epoch + 1, config.epochs, config.eval_every):
                result = evaluate(state.model, test_loader, dist=dist, precision=plan.precision)
                test = {"test_loss": result.loss, "test_accuracy": result.accuracy, "eval_seconds": result.seconds}
                tested = f"test loss {result.loss:.4f} acc {result.accuracy:.4f}"
            record = {"epoch": epoch + 1, **stats, **test, "precision": plan.precision,    # a resume may change
                      "compiled": bool(plan.compile),                                  # these two
                      **(epoch_metrics(state.model) if epoch_metrics else {})}
            saver.run.append_metrics(record)
            log.info("epoch %d/%d  lr %.4f  train loss %.4f acc %.4f  %s  %.1fs  %.0f img/s", epoch + 1,
                     config.epochs, lr, stats["train_loss"], stats["train_accuracy"], tested, stats["seconds"],
                     stats["images_per_second"])
            if state.end_epoch(record):                  # the accuracy is summed over the processes:
                saver.save("best")                       # they all take the same branches
            if config.checkpoint_every and state.epoch % config.checkpoint_every == 0:
                saver.save_periodic()
            saver.save("last")
            signum = dist.max_int(stop.signum or 0)
            if signum and state.epoch < config.epochs:
                raise saver.interrupted(signum, f"the end of epoch {state.epoch}/{config.epochs}")
