"""Everything a run must carry across a restart, in one object: :class:`TrainState`.

A checkpoint is :meth:`TrainState.to_checkpoint`; a resume is :meth:`TrainState.from_checkpoint`;
a field added here is a field resumed. The batch order and augmentation are a pure function of
``(seed, epoch)`` and the learning rate of ``(epoch, step)``, so the position ``(epoch, step)`` is
all the loop needs to continue as an uninterrupted run.

Checkpoint contents: the weights, the optimizer state, every process's random state
(:mod:`attncnn.training.rng`), and as metadata the position, the last metrics record, the best
accuracy so far, the model's and the run's configuration; mid-epoch also the epoch's running sums
(tensors ``train_loss_sum``, ``train_correct``, metadata ``train_count``), summed over processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..data import Dataset, DeviceLoader
from ..models import count_parameters, preset_model_config
from ..runs.checkpoint import Checkpoint
from ..runs.config import TrainConfig, without_paths
from ..runs.loading import build_checked, check_options_take_images, check_weights, specs_of
from .components import make_optimizer, make_schedule
from .distributed import Distributed
from .errors import NonFiniteLossError, TrainingError
from .init_from import init_from_mismatch, load_weights
from .rng import capture_rng, restore_rng, seed_rank_stream
from .schedule import LRSchedule

__all__ = ["RunningSums", "TrainState", "position_text"]

#: an optimizer param group's keys that choose its kernel, not its update (a run-time option)
_KERNEL_KEYS = ("foreach", "fused")


@dataclass
class RunningSums:
    """Loss and accuracy sums over the batches of the current epoch, kept on the device so that a
    step needs no host sync. Under DDP each process holds the sums of its own shard.

    Attributes:
        loss_sum: float64 sum of per-example losses.
        correct: int64 count of correct top-1 predictions.
        count: examples seen (a Python int: known without a sync).
        first_bad: int64, ``-1`` or the 0-based batch of the first non-finite loss.
        bad_loss: that loss (float32).
    """

    loss_sum: torch.Tensor
    correct: torch.Tensor
    count: int
    first_bad: torch.Tensor
    bad_loss: torch.Tensor

    @classmethod
    def zeros(cls, device: torch.device) -> "RunningSums":
        def zero(dtype):
            return torch.zeros((), device=device, dtype=dtype)
        return cls(zero(torch.float64), zero(torch.int64), 0, torch.full((), -1, device=device, dtype=torch.int64),
                   zero(torch.float32))

    def add(self, step: int, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Account for batch ``step`` (0-based) with its mean ``loss``; device operations only.
        ``labels``: ``(B,)`` class indices, or ``(B, classes)`` targets (CutMix), whose largest
        weight counts as the class to predict."""
        first = torch.logical_and(torch.logical_not(torch.isfinite(loss)), self.first_bad < 0)
        self.first_bad = torch.where(first, step, self.first_bad)
        self.bad_loss = torch.where(first, loss.float(), self.bad_loss)
        classes = labels.argmax(dim=-1) if labels.dim() == 2 else labels
        self.loss_sum += loss.double() * classes.numel()
        self.correct += (logits.argmax(dim=-1) == classes).sum()
        self.count += classes.numel()

    def totals(self, dist: Distributed) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(loss_sum float64, correct int64, count)`` summed over the processes (one all-reduce
        under DDP; this process's own otherwise)."""
        if not dist.enabled:
            return self.loss_sum, self.correct, self.count
        total = dist.sum(torch.stack([self.loss_sum, self.correct.double(),
                                      self.loss_sum.new_tensor(float(self.count))]))
        # float64 holds these counts exactly (far below 2**53)
        return total[0], total[1].round().long(), int(total[2].item())

    def means(self, dist: Distributed) -> tuple[float, float]:
        """Mean loss and accuracy so far (one host sync), over the processes of ``dist``."""
        loss_sum, correct, count = self.totals(dist)
        return loss_sum.item() / max(count, 1), correct.item() / max(count, 1)

    def first_non_finite(self, dist: Distributed) -> tuple[int, float, str] | None:
        """``(batch index, loss, where)`` of the first NaN/Inf loss on any process, or None (one
        host sync; a collective under DDP, where ``where`` names the rank that saw it first)."""
        if not dist.enabled:
            bad = int(self.first_bad.item())
            return None if bad < 0 else (bad, float(self.bad_loss.item()), "")
        pairs = dist.all_gather(torch.stack([self.first_bad.double(), self.bad_loss.double()]))
        seen = [(int(b), r, v) for r, (b, v) in enumerate(torch.stack(pairs).tolist()) if b >= 0]
        if not seen:
            return None
        bad, rank, value = min(seen)            # the earliest step; on a tie the lowest rank
        return bad, value, f" on rank {rank} of {dist.world_size}"


def position_text(epoch: int, step: int) -> str:
    """Where a checkpoint stands, in words: after ``epoch`` whole epochs and ``step`` batches."""
    return f"end of epoch {epoch}" if step == 0 else f"epoch {epoch + 1} after step {step}"


@dataclass
class TrainState:
    """The model, its optimizer and where the run stands; see the module docstring.

    Attributes:
        config: the run's configuration.
        model: the plain network (not a DDP wrapper), on ``dist.device``.
        optimizer: SGD over ``model``'s parameters.
        schedule: the learning rate of every ``(epoch, step)``.
        dist: this process's place among the processes (one process: a no-op).
        about: what checkpoints record about the run besides the state (classes, data, the
            training images' ``image_size`` ``[height, width]``, parameters).
        epoch: whole epochs done (0-based index of the current epoch).
        step: batches done in the current epoch.
        sums: the current epoch's running sums.
        best: ``{"accuracy", "epoch"}`` of the best test accuracy so far (-1 and None before any).
        record: the last epoch's metrics record (``{}`` before the first).
    """

    config: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    dist: Distributed
    about: dict
    epoch: int = 0
    step: int = 0
    sums: RunningSums = None   # type: ignore[assignment]  (set in __post_init__)
    best: dict = field(default_factory=lambda: {"accuracy": -1.0, "epoch": None})
    record: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sums is None:
            self.sums = RunningSums.zeros(self.dist.device)

    @classmethod
    def start(cls, config: TrainConfig, dataset: Dataset, train_loader: DeviceLoader, dist: Distributed, *,
              init_from: str | None = None, shaped_like: Path | None = None,
              paths: dict | None = None, fused_optimizer: bool = False) -> "TrainState":
        """A fresh state: the network built once from ``config`` (seeded identically on every process)
        with the plan's attention ``paths``, the weights of ``init_from`` if given, then each process's
        dropout stream; its optimizer fused where ``fused_optimizer`` says. The network is first checked
        on the meta device against ``init_from`` or ``shaped_like`` (the checkpoint a resume will load),
        against memory and the data set's image size.

        Raises:
            ValueError: the network does not fit that checkpoint, the device's memory or the
                images (named, with the fix).
            CheckpointError, TrainingError: ``init_from`` unreadable or not fitting the model.
        """
        torch.manual_seed(config.seed)          # the same initial weights on every process
        arch, model_config = preset_model_config(config.preset, dataset.num_classes, **config.model, **(paths or {}))
        source = f"preset {config.preset} with model options {config.model}"
        # images the network refuses (an absolute position embedding of another size) fail here,
        # before the run folder exists, not in the first step
        check_options_take_images(arch, model_config, tuple(dataset.train.images.shape[1:]), source)
        try:
            model = build_checked(arch, model_config, weights=init_from or shaped_like, device=dist.device,
                                  source=source)
        except ValueError as err:
            if init_from is None:
                raise
            raise init_from_mismatch(init_from, err) from err
        if init_from is not None:
            load_weights(model, init_from)
        seed_rank_stream(config.seed, dist)
        # image_size: a trained network is only right on images of this size; the Python API refuses others
        about = {"classes": list(dataset.classes), "dataset": dataset.source, "dataset_name": dataset.shareable_name,
                 "image_size": list(dataset.train.images.shape[-2:]), "parameters": count_parameters(model)}
        return cls(config, model, make_optimizer(model, config, fused=fused_optimizer),
                   make_schedule(config, train_loader), dist, about)

    # -- the loop's bookkeeping ---------------------------------------------------------------

    def add_step(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Count the step just taken: running sums (no host sync) and the position."""
        self.sums.add(self.step, loss, logits, labels)
        self.step += 1

    def check_finite(self) -> None:
        """One host sync (a collective under DDP): raise if any loss of this epoch was NaN or Inf.

        Raises:
            NonFiniteLossError: naming the epoch, step, batch index, learning rate and loss value.
        """
        found = self.sums.first_non_finite(self.dist)
        if found is None:
            return
        bad, value, where = found
        lr, n = self.schedule.lr_at(self.epoch, bad), self.schedule.steps_per_epoch
        raise NonFiniteLossError(
            f"the training loss became {value}{where} at epoch {self.epoch + 1}, step {bad + 1} of {n} (batch "
            f"index {bad} of the epoch's shuffled order, global step {self.epoch * n + bad + 1}), learning rate "
            f"{lr:.6g}; the weights are no longer usable. Lower --lr (or lengthen the warm-up with "
            "--warmup-ratio) or check the data for corrupt images, then start a new run.",
            epoch=self.epoch, batch_index=bad, lr=lr, loss=value)

    def end_epoch(self, record: dict) -> bool:
        """Close the epoch with its metrics ``record``; True when its test accuracy is the best so far
        (selected on the test set, as the reference does: there is no validation split), False for an
        epoch without evaluation."""
        self.epoch, self.step, self.record = self.epoch + 1, 0, record
        self.sums = RunningSums.zeros(self.dist.device)
        if "test_accuracy" not in record or record["test_accuracy"] <= self.best["accuracy"]:   # eval_every
            return False
        self.best = {"accuracy": record["test_accuracy"], "epoch": self.epoch}
        return True

    # -- checkpoints --------------------------------------------------------------------------

    def to_checkpoint(self) -> Checkpoint:
        """The state as a checkpoint. A collective under DDP (random states and sums are gathered
        from every process): call it on every process; rank 0 writes the result."""
        extra = capture_rng(self.dist)
        # the network's hyperparameters without its attention paths: a machine's choice (machine.json)
        meta = {"arch": self.model.arch, "model_config": without_paths(dataclasses.asdict(self.model.config)),
                "config": self.config.to_dict(), "epoch": self.epoch, "step_in_epoch": self.step,
                "metrics": self.record, "best": self.best, **self.about}
        if self.step:
            extra["train_loss_sum"], extra["train_correct"], meta["train_count"] = self.sums.totals(self.dist)
        return Checkpoint(model_state=self.model.state_dict(), optimizer_state=self.optimizer.state_dict(),
                          extra_tensors=extra, metadata=meta)

    def from_checkpoint(self, ckpt: Checkpoint, path: Path) -> None:
        """Restore this state (built by :meth:`start` from the same configuration) from ``ckpt``.

        Raises:
            ValueError: weights that do not fit the model (names the key).
            TrainingError: no optimizer state, or a position that does not fit this run.
        """
        check_weights(path, self.model, specs_of(ckpt.model_state))
        if ckpt.optimizer_state is None:
            raise TrainingError(f"checkpoint {path} holds no optimiser state, so the run cannot be resumed "
                                "exactly; start a new run")
        self.epoch, self.step = self._position(ckpt.metadata, path)
        self.model.load_state_dict(ckpt.model_state)
        # the kernel (fused or foreach) is this segment's choice: the stored param groups would bring the
        # writer's back (and place AdamW's step counts for it), so they are loaded with this optimizer's
        stored = ckpt.optimizer_state
        kernels = [{k: group[k] for k in _KERNEL_KEYS if k in group} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict({**stored, "param_groups": [
            {**group, **kernel} for group, kernel in zip(stored["param_groups"], kernels)]})
        restore_rng(self.dist, ckpt.extra_tensors, self.config.seed, self.epoch, self.step)
        self.best = dict(ckpt.metadata.get("best", self.best))
        self.record = dict(ckpt.metadata.get("metrics") or {})
        kept = ckpt.extra_tensors
        if self.step and self.dist.is_main and "train_loss_sum" in kept and "train_correct" in kept:
            # The stored sums are over all processes: rank 0 carries them on and the others start
            # from zero, so the end-of-epoch sum counts them once.
            device = self.dist.device
            self.sums.loss_sum = kept["train_loss_sum"].to(device, torch.float64).reshape(())
            self.sums.correct = kept["train_correct"].to(device, torch.int64).reshape(())
            self.sums.count = int(ckpt.metadata.get("train_count", 0))

    def _position(self, meta: dict, path: Path) -> tuple[int, int]:
        epochs, steps = self.config.epochs, self.schedule.steps_per_epoch
        try:
            epoch, step = int(meta["epoch"]), int(meta.get("step_in_epoch", 0))
        except (KeyError, TypeError, ValueError) as err:
            raise TrainingError(f"checkpoint {path} has no valid 'epoch'/'step_in_epoch' entries ({err}); it was "
                                "not written by attncnn train; start a new run") from err
        if not (0 <= epoch <= epochs and 0 <= step <= steps and (step == 0 or epoch < epochs)):
            raise TrainingError(f"checkpoint {path} was written at {position_text(epoch, step)}, which does not "
                                f"fit this run ({epochs} epochs of {steps} steps): the data or config.json changed "
                                "since; restore them or start a new run")
        return epoch, step
