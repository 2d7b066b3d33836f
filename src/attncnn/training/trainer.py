"""The training loop: data resident on the device, SGD with warm-up + cosine, a run folder.

Read it top to bottom: :func:`train` sets up (data, model, optimiser, schedule, run folder,
resume), then loops over epochs calling :func:`train_one_epoch` and :func:`evaluate`, logging one
metrics line per epoch and writing checkpoints (periodic, ``best``, ``last``). Metrics are
accumulated on the device and read back once per epoch (plus every ``sync_every`` steps for the
progress bar), so there is no host synchronisation per step.

What survives what:

* **SIGINT / SIGTERM** (handlers installed by :func:`train` only while it runs): the current step
  finishes, a resumable ``last`` checkpoint is written and :class:`TrainingInterrupted` is raised
  (the CLI exits with 130 / 143 and prints the ``--resume`` command). A second signal stops at once.
* **Resume**, also in the middle of an epoch: a checkpoint holds the model, the optimiser, every
  RNG state, the epoch, the batches already done in the next epoch (``step_in_epoch``) and that
  epoch's running loss/accuracy sums. The batch order and augmentation are a pure function of
  ``(seed, epoch)`` and the LR a pure function of ``(epoch, step)``, so the resumed run takes the
  same steps as an uninterrupted one (bit-identical on CPU in deterministic mode).
  ``checkpoint_every_steps`` refreshes ``last`` within epochs, so even SIGKILL loses little.
* **Non-finite loss**: every step updates a device-side record of the first non-finite loss (no
  host sync); it is read at the progress sync points, at the end of the epoch and before every
  checkpoint, so the error names the exact step, batch and learning rate, and nothing is written
  after the failure: the last checkpoint is the last good one.

**Several processes** (``torchrun --nproc_per_node N -m attncnn train ...``; see
:mod:`attncnn.training.distributed`): the model is wrapped in DistributedDataParallel, the global
``batch_size`` is split evenly over the processes, and rank 0 alone writes the run folder and shows
progress. Epoch metrics are summed over the processes before they are logged. Stop requests and
non-finite losses are agreed with one small collective at fixed points (every ``SYNC_EVERY`` steps,
at mid-epoch checkpoints and at the end of each epoch), so every process stops after the same step
and rank 0 writes the checkpoint. Limitation: under DDP a signal is therefore honoured within
``SYNC_EVERY`` steps rather than after the current one (torchrun waits 30 s, ``--shutdown-timeout``,
before it kills the processes), and a NaN is reported at the next such point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shlex
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..data import DataError, DeviceLoader, ImageSplit, class_balanced_subset, load_dataset
from ..models import build_model, build_model_from_config, count_parameters, get_preset
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, config_from_dict
from .distributed import (Distributed, MainProcessRunFolder, gather_rank_rng_states, launch_from_env,
                          per_process_batch, process_group, rank_device, rank_seed, restore_rank_rng_state)
from .run_folder import RunFolder
from .schedule import LRSchedule

__all__ = ["TrainingError", "TrainingInterrupted", "NonFiniteLossError", "EvalResult", "EpochProgress",
           "train", "evaluate", "resolve_device", "make_optimizer", "load_model", "train_one_epoch"]

log = logging.getLogger(__name__)

#: Steps between host syncs of the running sums: progress bar, NaN check and, under DDP, the
#: agreement on stop requests.
SYNC_EVERY = 25


class TrainingError(RuntimeError):
    """A run cannot go on (non-finite loss, inconsistent resume); the message says why and what to do."""


class NonFiniteLossError(TrainingError):
    """The training loss became NaN or infinite.

    Attributes:
        epoch: 0-based epoch of the first non-finite loss.
        batch_index: 0-based batch of that epoch (the step is ``batch_index + 1``).
        lr: learning rate of that step.
        loss: the loss value (``nan``, ``inf`` or ``-inf``).
    """

    def __init__(self, message: str, *, epoch: int, batch_index: int, lr: float, loss: float) -> None:
        super().__init__(message)
        self.epoch, self.batch_index, self.lr, self.loss = epoch, batch_index, lr, loss


class TrainingInterrupted(TrainingError):
    """SIGINT or SIGTERM stopped the run after a whole step and a resumable checkpoint was written.

    Attributes:
        signum: the signal received.
        checkpoint: the checkpoint to resume from.
        exit_status: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), the shell convention.
    """

    def __init__(self, message: str, *, signum: int, checkpoint: Path) -> None:
        super().__init__(message)
        self.signum, self.checkpoint = signum, checkpoint

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum)


@dataclass
class EvalResult:
    loss: float        #: mean cross-entropy (nats)
    accuracy: float    #: fraction of correct top-1 predictions
    examples: int
    seconds: float


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; otherwise ``torch.device(name)``.

    Raises:
        ValueError: CUDA requested but not available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.SGD:
    """SGD with two groups: weight decay on everything except the model's ``no_weight_decay()``
    names (Gaussian centres and spreads), as the reference optimiser (PAPER.md 4)."""
    skip = getattr(model, "no_weight_decay", lambda: set())()
    decay = [p for n, p in model.named_parameters() if n not in skip]
    no_decay = [p for n, p in model.named_parameters() if n in skip]
    groups = [{"params": decay, "weight_decay": config.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)


def _check_sharding(loader: DeviceLoader, dist: Distributed | None) -> Distributed:
    world = 1 if dist is None else dist.world_size
    if loader.world_size != world:
        raise ValueError(f"the loader is sharded over {loader.world_size} process(es) but dist describes {world}; "
                         "pass the Distributed object of the process group the loader was made for")
    return dist or Distributed()


@torch.no_grad()
def evaluate(model: nn.Module, loader: DeviceLoader, *, dist: Distributed | None = None) -> EvalResult:
    """Mean cross-entropy and top-1 accuracy over every example of ``loader`` (model in eval mode).

    Args:
        model: the plain module (not the DDP wrapper: evaluation needs no gradient sync, and the
            shards may differ by one batch).
        dist: under DDP, the processes whose loaders together hold the test set (each example in
            exactly one shard); the sums are added over them, so every process gets the result over
            the whole set. ``EvalResult.seconds`` is this process's time.

    Raises:
        ValueError: ``loader`` sharded over a different number of processes than ``dist``.
    """
    dist = _check_sharding(loader, dist)
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    count = 0
    for x, y in loader:
        logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").double()
        correct += (logits.argmax(dim=-1) == y).sum()
        count += y.numel()
    model.train(was_training)
    if dist.enabled:
        total = dist.sum(torch.stack([loss_sum, correct.double(), loss_sum.new_tensor(float(count))]))
        loss_sum, correct, count = total[0], total[1], int(total[2].item())
    return EvalResult(loss=loss_sum.item() / max(count, 1), accuracy=correct.item() / max(count, 1),
                      examples=count, seconds=time.perf_counter() - start)


@dataclass
class EpochProgress:
    """Running sums of one epoch, kept on the device so that a step needs no host sync.

    Under DDP each process holds the sums of its own shard; :meth:`totals`, :meth:`metrics` and
    :meth:`check_finite` with a ``dist`` combine them (collectives: call them on every process).

    Attributes:
        epoch: 0-based epoch.
        steps_per_epoch: batches in the epoch.
        steps_done: batches already trained.
        loss_sum: float64 sum of per-example losses.
        correct: int64 count of correct top-1 predictions.
        count: examples seen.
        first_bad: int64, ``-1`` or the 0-based batch of the first non-finite loss.
        bad_loss: that loss (float32).
    """

    epoch: int
    steps_per_epoch: int
    steps_done: int
    loss_sum: torch.Tensor
    correct: torch.Tensor
    count: int
    first_bad: torch.Tensor
    bad_loss: torch.Tensor

    @classmethod
    def start(cls, epoch: int, steps_per_epoch: int, device: torch.device, *, steps_done: int = 0,
              loss_sum: torch.Tensor | None = None, correct: torch.Tensor | None = None,
              count: int = 0) -> "EpochProgress":
        """Fresh sums, or those of a partly done epoch (restored from a checkpoint)."""
        def tensor(value, dtype):
            if value is None:
                return torch.zeros((), device=device, dtype=dtype)
            return value.detach().to(device=device, dtype=dtype).reshape(())
        return cls(epoch=epoch, steps_per_epoch=steps_per_epoch, steps_done=steps_done,
                   loss_sum=tensor(loss_sum, torch.float64), correct=tensor(correct, torch.int64), count=count,
                   first_bad=torch.full((), -1, device=device, dtype=torch.int64),
                   bad_loss=torch.zeros((), device=device, dtype=torch.float32))

    def add(self, step: int, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Account for batch ``step`` (0-based); device operations only."""
        first = torch.logical_and(torch.logical_not(torch.isfinite(loss)), self.first_bad < 0)
        self.first_bad = torch.where(first, step, self.first_bad)
        self.bad_loss = torch.where(first, loss.float(), self.bad_loss)
        self.loss_sum += loss.double() * labels.numel()
        self.correct += (logits.argmax(dim=-1) == labels).sum()
        self.count += labels.numel()
        self.steps_done = step + 1

    def check_finite(self, schedule: LRSchedule, dist: Distributed | None = None) -> None:
        """One host sync: raise if any loss so far was NaN or infinite (under DDP: on any process,
        so that every process raises the same error at the same point).

        Raises:
            NonFiniteLossError: naming the epoch, step, batch index, learning rate and loss value
                (and the rank that saw it first under DDP).
        """
        where = ""
        if dist is not None and dist.enabled:
            pairs = dist.all_gather(torch.stack([self.first_bad.double(), self.bad_loss.double()]))
            seen = [(int(b), r, v) for r, (b, v) in enumerate(torch.stack(pairs).tolist()) if b >= 0]
            if not seen:
                return
            bad, rank, value = min(seen)            # the earliest step; on a tie the lowest rank
            where = f" on rank {rank} of {dist.world_size}"
        else:
            bad = int(self.first_bad.item())
            if bad < 0:
                return
            value = float(self.bad_loss.item())
        lr = schedule.lr_at(self.epoch, bad)
        n = self.steps_per_epoch
        raise NonFiniteLossError(
            f"the training loss became {value}{where} at epoch {self.epoch + 1}, step {bad + 1} of {n} (batch "
            f"index {bad} of the epoch's shuffled order, global step {self.epoch * n + bad + 1}), learning rate "
            f"{lr:.6g}; the weights are no longer usable. Lower --lr (or lengthen the warm-up with "
            "--warmup-ratio) or check the data for corrupt images, then start a new run.",
            epoch=self.epoch, batch_index=bad, lr=lr, loss=value)

    def totals(self, dist: Distributed | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(loss_sum float64, correct int64, count)``, summed over the processes of ``dist``
        (one all-reduce) or this process's own."""
        if dist is None or not dist.enabled:
            return self.loss_sum, self.correct, self.count
        total = dist.sum(torch.stack([self.loss_sum, self.correct.double(),
                                      self.loss_sum.new_tensor(float(self.count))]))
        # float64 holds these counts exactly (far below 2**53)
        return total[0], total[1].round().long(), int(total[2].item())

    def metrics(self, dist: Distributed | None = None) -> tuple[float, float]:
        """Mean loss and accuracy so far (one host sync), over all processes of ``dist`` if given."""
        loss_sum, correct, count = self.totals(dist)
        return loss_sum.item() / max(count, 1), correct.item() / max(count, 1)


def train_one_epoch(model, optimizer, loader: DeviceLoader, schedule: LRSchedule, epoch: int,
                    *, progress: bool = True, sync_every: int = SYNC_EVERY, start_step: int = 0,
                    sums: EpochProgress | None = None,
                    after_step: Callable[[EpochProgress], None] | None = None,
                    dist: Distributed | None = None) -> dict:
    """One pass over ``loader`` (from batch ``start_step``); returns train loss/accuracy, last LR,
    seconds and images/s (loss, accuracy and images/s over all processes of ``dist``).

    Args:
        model: the network to train; under DDP its DistributedDataParallel wrapper.
        start_step: batches of this epoch already done (a resumed run); they are skipped at no cost.
        sums: the running sums of those batches (default: zeros).
        after_step: called with the running sums after every optimiser step (the trainer checks
            for signals and writes mid-epoch checkpoints there).
        dist: under DDP, the process group ``loader`` is sharded over (the NaN checks and the
            returned metrics are collectives over it).

    Raises:
        NonFiniteLossError: the loss became NaN or infinite (checked at every progress sync point,
            every ``sync_every`` steps, and at the end; the message names the exact step).
        ValueError: ``loader`` sharded over a different number of processes than ``dist``.
    """
    dist = _check_sharding(loader, dist)
    model.train()
    device = next(model.parameters()).device
    n = len(loader)
    if sums is None:
        sums = EpochProgress.start(epoch, n, device, steps_done=start_step)
    lr = schedule.lr_at(epoch, max(min(start_step, n - 1), 0)) if n else 0.0
    count_before = sums.count
    start = time.perf_counter()
    bar = tqdm(total=n, initial=start_step, desc=f"epoch {epoch + 1}", unit="batch", leave=False,
               disable=not progress, dynamic_ncols=True)
    try:
        for step, (x, y) in enumerate(loader.iter_from(start_step), start=start_step):
            lr = schedule.set_lr(optimizer, epoch, step)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            sums.add(step, loss.detach(), logits.detach(), y)
            if (step + 1) % sync_every == 0 or step + 1 == n:
                sums.check_finite(schedule, dist)               # one host sync per sync_every steps
                if progress:
                    mean_loss, accuracy = sums.metrics()        # this process's shard only: no collective
                    elapsed = time.perf_counter() - start
                    bar.set_postfix(loss=f"{mean_loss:.3f}", acc=f"{accuracy:.3f}",
                                    img_s=f"{(sums.count - count_before) / elapsed:.0f}", lr=f"{lr:.4f}")
                    bar.update(step + 1 - bar.n)
            if after_step is not None:
                after_step(sums)
        sums.check_finite(schedule, dist)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    mean_loss, accuracy = sums.metrics(dist)
    # every process trains the same number of examples per step (the loader makes the shards equal)
    done_now = (sums.count - count_before) * dist.world_size
    return {"train_loss": mean_loss, "train_accuracy": accuracy, "lr": lr, "seconds": seconds,
            "images_per_second": done_now / seconds if seconds > 0 else 0.0}


def _rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """Every RNG state: torch CPU (+ CUDA) as tensors, Python's and NumPy's as tensors + JSON."""
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"torch_cuda_{i}"] = s
    version, internal, gauss_next = random.getstate()
    state["python_mt"] = torch.tensor(internal, dtype=torch.int64)
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy_mt"] = torch.from_numpy(keys.astype(np.int64))
    meta = {"python": [version, gauss_next], "numpy": [kind, int(pos), int(has_gauss), float(cached)]}
    return state, meta


def _set_rng_state(extra: dict[str, torch.Tensor], meta: dict | None) -> None:
    if "torch_cpu" in extra:
        torch.set_rng_state(extra["torch_cpu"].cpu())
    if torch.cuda.is_available():
        states = [extra[k].cpu() for k in sorted(extra) if k.startswith("torch_cuda_")]
        if states and len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
    meta = meta or {}
    if "python_mt" in extra and "python" in meta:
        version, gauss_next = meta["python"]
        random.setstate((version, tuple(int(v) for v in extra["python_mt"].tolist()), gauss_next))
    if "numpy_mt" in extra and "numpy" in meta:
        kind, pos, has_gauss, cached = meta["numpy"]
        np.random.set_state((kind, extra["numpy_mt"].numpy().astype(np.uint32), pos, has_gauss, cached))


def _check_weights(path: Path, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every weight must match the built model's names and shapes (the message names the key)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit its configuration: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"checkpoint {path}: weight {name!r} has shape {tuple(tensor.shape)}, "
                             f"the configuration needs {tuple(expected[name].shape)}")


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild a network from a checkpoint file (or a run folder: its ``best`` or ``last``).

    The stored configuration is validated before the model is built (unknown keys and wrong types
    are named), and every weight must match the built model's names and shapes.

    Returns:
        ``(model in eval mode, checkpoint metadata)``.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        attncnn.training.checkpoint.CheckpointError: not a safe attncnn checkpoint.
        ValueError: configuration or weights that do not fit (the message names the key).
    """
    path = Path(path)
    if path.is_dir():
        folder = RunFolder(path, mode="read")
        best, last = folder.checkpoint_path("best"), folder.checkpoint_path("last")
        path = best if best.exists() else last
        if not path.exists():
            raise FileNotFoundError(f"run folder {folder.path} holds no 'best' or 'last' checkpoint")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    ckpt = load_checkpoint(path)
    meta = ckpt.metadata
    if not isinstance(meta, dict):
        raise ValueError(f"checkpoint {path}: its metadata is not a JSON object; it was not written by attncnn train")
    for key, kind in (("arch", str), ("model_config", dict)):
        if key not in meta:
            raise ValueError(f"checkpoint {path} has no {key!r} entry; it was not written by attncnn train")
        if not isinstance(meta[key], kind):
            raise ValueError(f"checkpoint {path}: {key!r} must be a {kind.__name__}, got {meta[key]!r}")
    if "config" in meta:
        if not isinstance(meta["config"], dict):
            raise ValueError(f"checkpoint {path}: 'config' must be a JSON object, got {meta['config']!r}")
        try:
            config_from_dict(meta["config"])
        except ValueError as err:
            raise ValueError(f"checkpoint {path}: invalid stored training configuration: {err}") from err
    try:
        model = build_model_from_config(meta["arch"], dict(meta["model_config"]))
    except (ValueError, TypeError) as err:
        raise ValueError(f"checkpoint {path}: invalid stored model configuration: {err}") from err
    _check_weights(path, model, ckpt.model_state)
    model.load_state_dict(ckpt.model_state)
    return model.to(device).eval(), meta


def _init_weights(model: nn.Module, path: str | Path) -> None:
    """Load a checkpoint's weights into a freshly built ``model`` (``TrainConfig.init_from``).

    Only the weights are taken: optimiser state, RNG and epoch counters start anew, so the run is
    a fine-tune with its own schedule (the paper's pruned run, PAPER.md 3.8).

    Raises:
        CheckpointError: missing or unreadable file (message names it).
        TrainingError: the weights do not fit the model (names the mismatching tensors and the
            preset/model options to use).
    """
    path = Path(path)
    ckpt = load_checkpoint(path)
    try:
        _check_weights(path, model, ckpt.model_state)
    except (ValueError, RuntimeError) as err:
        raise TrainingError(f"--init-from {path}: {err}. Build the same model as the checkpoint "
                            "(same --preset and --model options).") from err
    model.load_state_dict(ckpt.model_state)
    log.info("initialised the weights from %s", path)


def _loaders(config: TrainConfig, device: torch.device, dist: Distributed):
    def load():
        return load_dataset(config.data, data_dir=config.data_dir, download=config.download)

    # Rank 0 first, so that a download or a first decoding (which fills the cache) happens once;
    # the other processes then read the files it left.
    dataset = dist.on_main(load, f"load the data set {config.data}", DataError)
    if dataset is None:
        dataset = load()
    train_split = dataset.train
    if config.train_subset is not None:
        if config.train_subset > len(train_split.labels):
            raise ValueError(f"--train-subset {config.train_subset} exceeds the {len(train_split.labels)} "
                             "training images")
        idx = class_balanced_subset(train_split.labels, config.train_subset, config.seed)
        train_split = ImageSplit(train_split.images[idx], train_split.labels[idx])
    if config.batch_size > len(train_split.labels):
        raise ValueError(f"batch size {config.batch_size} is larger than the {len(train_split.labels)} "
                         "training images; lower --batch-size")
    # batch_size is the global batch: each process trains on its share of every batch. The
    # evaluation batch is per process (it only sets memory use).
    shard = {"rank": dist.rank, "world_size": dist.world_size}
    train_loader = DeviceLoader(train_split, batch_size=per_process_batch(config.batch_size, dist.world_size),
                                device=device, train=True, seed=config.seed, **shard)
    test_loader = DeviceLoader(dataset.test, batch_size=config.eval_batch_size, device=device, train=False,
                               **shard)
    return dataset, train_loader, test_loader


class _StopRequest:
    """Set by the signal handlers of :func:`_stop_on_signals`; read by the loop after each step."""

    signum: int | None = None


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[_StopRequest]:
    """While the block runs, SIGINT and SIGTERM only record a stop request (a second one raises
    KeyboardInterrupt at once). The previous handlers come back afterwards. Outside the main
    thread (where Python cannot install handlers) signals keep their usual effect."""
    stop = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.signum is not None:
            raise KeyboardInterrupt
        stop.signum = signum

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _position(epoch: int, step: int) -> str:
    return f"end of epoch {epoch}" if step == 0 else f"epoch {epoch + 1} after step {step}"


def _resume_position(meta: dict, path: Path, epochs: int, steps_per_epoch: int) -> tuple[int, int]:
    try:
        epoch, step = int(meta["epoch"]), int(meta.get("step_in_epoch", 0))
    except (KeyError, TypeError, ValueError) as err:
        raise TrainingError(f"checkpoint {path} has no valid 'epoch'/'step_in_epoch' entries ({err}); it was "
                            "not written by attncnn train; start a new run") from err
    if not (0 <= epoch <= epochs and 0 <= step <= steps_per_epoch and (step == 0 or epoch < epochs)):
        raise TrainingError(f"checkpoint {path} was written at {_position(epoch, step)}, which does not fit this "
                            f"run ({epochs} epochs of {steps_per_epoch} steps): the data or config.json changed "
                            "since; restore them or start a new run")
    return epoch, step


def train(config: TrainConfig, out_dir: str | Path, *, mode: str = "new", progress: bool = True) -> dict:
    """Train ``config`` into the run folder ``out_dir``; returns the final summary.

    Args:
        config: the resolved configuration (ignored on resume: the stored one is used).
            ``config.batch_size`` is the global batch, whatever the number of processes.
        out_dir: run folder.
        mode: ``"new"`` (refuse a non-empty folder), ``"overwrite"``, or ``"resume"``
            (continue from the folder's last checkpoint with its stored configuration, also from
            the middle of an epoch).
        progress: show a tqdm progress bar on stderr (rank 0 only under DDP).

    While it runs, SIGINT and SIGTERM (main thread only) make it finish the current step, write
    a resumable ``last`` checkpoint and raise :class:`TrainingInterrupted`.

    Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) every process calls this with the
    same arguments. It creates the process group (NCCL with each process on ``cuda:LOCAL_RANK``;
    gloo on CPU), trains with DistributedDataParallel on ``batch_size / WORLD_SIZE`` examples per
    process and step, and destroys the group at the end, also after an error. Only rank 0 writes
    ``out_dir`` and shows progress; every process returns the same summary. A resume loads the same
    checkpoint on every process, so ``out_dir`` must be visible to all of them (one node, or a
    shared file system). Signals are honoured at the next agreement point (module docstring).

    Raises:
        RunFolderError, DataError, ValueError, TrainingError: with a message naming the fix
            (ValueError also for a batch size that does not split evenly over the processes).
        NonFiniteLossError: NaN/Inf loss; nothing is written after it (the last checkpoint is good).
        TrainingInterrupted: SIGINT/SIGTERM; the message holds the ``--resume`` command.
    """
    launch = launch_from_env()
    if mode == "resume":
        config = config_from_dict(RunFolder(out_dir, mode="resume").read_config())
    # Everything that can fail on bad input (device, data, model options) happens before the
    # run folder is created or overwritten, so a failed start leaves no half-made run behind.
    per_process_batch(config.batch_size, 1 if launch is None else launch.world_size)
    device = resolve_device(config.device) if launch is None else rank_device(config.device, launch.local_rank)
    seed_everything(config.seed)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    if config.deterministic:
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS
        torch.use_deterministic_algorithms(True)
    try:
        group = (contextlib.nullcontext(Distributed(device=device)) if launch is None
                 else process_group(launch, device))
        with group as dist:
            return _train(config, out_dir, mode, progress and dist.is_main, dist)
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)


def _resume_command(run_path: Path, dist: Distributed) -> str:
    command = f"attncnn train --resume {shlex.quote(str(run_path))}"
    if not dist.enabled:
        return command
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size))
    command = f"torchrun --nproc_per_node {per_node} -m {command}"
    if per_node != dist.world_size:
        command += " (on every node, with this run's rendezvous options)"
    return command


def _train(config: TrainConfig, out_dir: str | Path, mode: str, progress: bool, dist: Distributed) -> dict:
    device = dist.device
    dataset, train_loader, test_loader = _loaders(config, device, dist)
    model = build_model(config.preset, num_classes=dataset.num_classes, **config.model).to(device)
    if config.init_from is not None and mode != "resume":
        _init_weights(model, config.init_from)   # before the run folder exists: a mismatch leaves nothing
    if dist.rank:
        # The shared seed gave every process the same initial weights; from here on each one
        # draws its own dropout masks (rank 0 keeps the single-process stream).
        torch.manual_seed(rank_seed(config.seed, dist.rank))
    run = MainProcessRunFolder.open(out_dir, mode, dist)     # rank 0 writes, every rank reads
    try:
        optimizer = make_optimizer(model, config)
        steps = len(train_loader)
        schedule = LRSchedule(base_lr=config.lr, epochs=config.epochs, steps_per_epoch=steps,
                              kind=config.schedule, warmup_ratio=config.warmup_ratio,
                              stepping=config.lr_stepping, milestones=tuple(config.milestones),
                              gamma=config.gamma, num_train_examples=len(train_loader.labels),
                              batch_size=config.batch_size)
        preset = get_preset(config.preset)
        model_config = dataclasses.asdict(model.config)
        start_epoch, start_step, sums = 0, 0, None
        best: dict = {"accuracy": -1.0, "epoch": None}
        record: dict = {}
        last_path = run.checkpoint_path("last")
        last_good: tuple[Path, int, int] | None = None      # (file, epoch, step) of the newest checkpoint
        if mode == "resume":
            found = run.latest_checkpoint()
            if found is not None:
                ckpt = load_checkpoint(found)
                _check_weights(found, model, ckpt.model_state)
                if ckpt.optimizer_state is None:
                    raise TrainingError(f"checkpoint {found} holds no optimiser state, so the run cannot be "
                                        "resumed exactly; start a new run")
                start_epoch, start_step = _resume_position(ckpt.metadata, found, config.epochs, steps)
                model.load_state_dict(ckpt.model_state)
                optimizer.load_state_dict(ckpt.optimizer_state)
                _set_rng_state(ckpt.extra_tensors, ckpt.metadata.get("rng"))
                restore_rank_rng_state(dist, ckpt.extra_tensors, config.seed, start_epoch, start_step)
                best = dict(ckpt.metadata.get("best", best))
            elif config.init_from is not None:
                # Stopped before its first checkpoint: start again from the same initial weights.
                _init_weights(model, config.init_from)
            _same_start(dist, -1 if found is None else start_epoch * (steps + 1) + start_step, run.path)
            if found is not None:
                if start_step:
                    # The checkpoint holds the sums over all processes: rank 0 carries them on and
                    # the others start from zero, so the end-of-epoch sum counts them once.
                    kept = ckpt.extra_tensors if dist.is_main else {}
                    sums = EpochProgress.start(
                        start_epoch, steps, device, steps_done=start_step,
                        loss_sum=kept.get("train_loss_sum"), correct=kept.get("train_correct"),
                        count=int(ckpt.metadata.get("train_count", 0)) if dist.is_main else 0)
                run.rewind_metrics(start_epoch)
                record = next(reversed(run.read_metrics()), {})
                last_good = (found, start_epoch, start_step)
                log.info("resuming %s from %s (%s)", run.path, found.name, _position(start_epoch, start_step))
        else:
            run.write_config(config.to_dict())
        params = count_parameters(model)
        log.info("preset %s: %s parameters, %d classes, data %s, device %s", config.preset, f"{params:,}",
                 dataset.num_classes, dataset.source, device)
        if dist.enabled:
            log.info("DDP over %d processes: global batch %d = %d examples per process and step, %d steps "
                     "per epoch", dist.world_size, config.batch_size, train_loader.batch_size, steps)
        net = dist.wrap(model)   # DDP averages the gradients; `model` stays the plain module (saved weights)

        def save(path: Path, epoch: int, step: int = 0, partial: EpochProgress | None = None) -> None:
            """Checkpoint after ``epoch`` whole epochs and ``step`` batches of the next one.

            Every process calls it (it gathers their RNG states and running sums); rank 0 writes."""
            nonlocal last_good
            extra, rng_meta = _rng_state()
            extra.update(gather_rank_rng_states(dist))
            meta = {"arch": preset.arch, "model_config": model_config, "config": config.to_dict(),
                    "epoch": epoch, "step_in_epoch": step, "metrics": record, "best": best,
                    "classes": list(dataset.classes), "dataset": dataset.source, "parameters": params,
                    "rng": rng_meta}
            if partial is not None and step:
                extra["train_loss_sum"], extra["train_correct"], meta["train_count"] = partial.totals(dist)
            run.write_checkpoint(path, lambda: save_checkpoint(path, model=model, optimizer=optimizer,
                                                               extra_tensors=extra, metadata=meta))
            if path == last_path:
                last_good = (path, epoch, step)

        def interrupted(signum: int, where: str) -> TrainingInterrupted:
            name = signal.Signals(signum).name
            message = (f"interrupted by {name} at {where}; saved a resumable checkpoint {last_path}. "
                       f"Resume with: {_resume_command(run.path, dist)}")
            (log.warning if dist.is_main else log.debug)("%s", message)    # once, not once per process
            return TrainingInterrupted(message, signum=signum, checkpoint=last_path)

        with _stop_on_signals() as stop:
            def agreed_stop() -> int | None:
                """The signal that asks to stop, if any process got one (a collective under DDP)."""
                return dist.max_int(stop.signum or 0) or None

            for epoch in range(start_epoch, config.epochs):
                train_loader.set_epoch(epoch)

                def after_step(progress_sums: EpochProgress, epoch: int = epoch) -> None:
                    done = progress_sums.steps_done
                    every = config.checkpoint_every_steps
                    due = bool(every) and (epoch * steps + done) % every == 0 and done < steps
                    # A signal reaches each process on its own. One process looks after every step;
                    # several compare notes only at fixed steps (one collective each), so that all
                    # of them stop after the same step.
                    if dist.enabled and not (due or done % SYNC_EVERY == 0 or done == steps):
                        return
                    signum = agreed_stop()
                    if signum is not None:
                        progress_sums.check_finite(schedule, dist)     # never checkpoint a broken model
                        save(last_path, epoch, done, progress_sums)
                        raise interrupted(signum, f"epoch {epoch + 1}/{config.epochs}, step {done} of {steps}")
                    if due:
                        progress_sums.check_finite(schedule, dist)
                        save(last_path, epoch, done, progress_sums)

                first = epoch == start_epoch
                try:
                    stats = train_one_epoch(net, optimizer, train_loader, schedule, epoch, progress=progress,
                                            start_step=start_step if first else 0, sums=sums if first else None,
                                            after_step=after_step, dist=dist)
                except NonFiniteLossError as err:
                    kept = ("no checkpoint had been written yet" if last_good is None else
                            f"the last good checkpoint is {last_good[0]} ({_position(last_good[1], last_good[2])})")
                    err.args = (f"{err.args[0]} Nothing was written after the failure; {kept}.",)
                    raise
                result = evaluate(model, test_loader, dist=dist)
                record = {"epoch": epoch + 1, **stats, "test_loss": result.loss,
                          "test_accuracy": result.accuracy, "eval_seconds": result.seconds}
                # Per-head attention metrics of position-only models (cheap: no forward pass,
                # no RNG use); empty for content models and ResNet.
                from ..analysis.metrics import epoch_metrics
                record.update(epoch_metrics(model))
                run.append_metrics(record)
                log.info("epoch %d/%d  lr %.4f  train loss %.4f acc %.4f  test loss %.4f acc %.4f  %.1fs  "
                         "%.0f img/s", epoch + 1, config.epochs, stats["lr"], stats["train_loss"],
                         stats["train_accuracy"], result.loss, result.accuracy, stats["seconds"],
                         stats["images_per_second"])
                # The accuracy is summed over the processes, so they all take the same branches here.
                if result.accuracy > best["accuracy"]:
                    # Selected on the test set, as the reference does (there is no validation split).
                    best = {"accuracy": result.accuracy, "epoch": epoch + 1}
                    save(run.checkpoint_path("best"), epoch + 1)
                if config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0:
                    run.save_periodic(epoch + 1, lambda p, e=epoch + 1: save(p, e), config.keep_checkpoints)
                save(last_path, epoch + 1)
                signum = agreed_stop()
                if signum is not None and epoch + 1 < config.epochs:
                    raise interrupted(signum, f"the end of epoch {epoch + 1}/{config.epochs}")
        summary = {"preset": config.preset, "epochs": config.epochs, "parameters": params,
                   "dataset": dataset.source, "final": record, "best": best}
        run.mark_finished(summary)
        return summary
    finally:
        run.close()


def _same_start(dist: Distributed, position: int, run_path: Path) -> None:
    """Under DDP, refuse to go on unless every process resumed from the same point (a collective)."""
    if dist.enabled and dist.max_int(position) != -dist.max_int(-position):
        raise TrainingError(f"the processes found different checkpoints in {run_path}: every process must see "
                            "the same run folder (on several nodes, put it on a shared file system)")
