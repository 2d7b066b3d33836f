"""The training loop: data resident on the device, SGD with warm-up + cosine, a run folder.

Read it top to bottom: :func:`train` sets up (data, model, optimiser, schedule, run folder,
resume), then loops over epochs calling :func:`train_one_epoch` and :func:`evaluate`, logging one
metrics line per epoch and writing checkpoints (periodic, ``best``, ``last``). Metrics are
accumulated on the device and read back once per epoch (plus every ``sync_every`` steps for the
progress bar), so there is no host synchronisation per step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..data import DeviceLoader, ImageSplit, class_balanced_subset, load_dataset
from ..models import build_model, build_model_from_config, count_parameters, get_preset
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, config_from_dict
from .run_folder import RunFolder
from .schedule import LRSchedule

__all__ = ["TrainingError", "EvalResult", "train", "evaluate", "resolve_device", "make_optimizer",
           "load_model", "train_one_epoch"]

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """A run cannot go on (non-finite loss, inconsistent resume); the message says why and what to do."""


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


@torch.no_grad()
def evaluate(model: nn.Module, loader: DeviceLoader) -> EvalResult:
    """Mean cross-entropy and top-1 accuracy over every example of ``loader`` (model in eval mode)."""
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
    return EvalResult(loss=loss_sum.item() / max(count, 1), accuracy=correct.item() / max(count, 1),
                      examples=count, seconds=time.perf_counter() - start)


def train_one_epoch(model, optimizer, loader: DeviceLoader, schedule: LRSchedule, epoch: int,
                    *, progress: bool = True, sync_every: int = 25) -> dict:
    """One pass over ``loader``; returns train loss/accuracy, last LR, seconds and images/s.

    Raises:
        TrainingError: the loss became NaN or infinite (checked every ``sync_every`` steps
            and at the end; the message names the epoch, step range and learning rate).
    """
    model.train()
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    count, lr, last_checked = 0, 0.0, 0
    start = time.perf_counter()
    bar = tqdm(total=len(loader), desc=f"epoch {epoch + 1}", unit="batch", leave=False,
               disable=not progress, dynamic_ncols=True)
    for step, (x, y) in enumerate(loader):
        lr = schedule.set_lr(optimizer, epoch, step)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach().double() * y.numel()
        correct += (logits.detach().argmax(dim=-1) == y).sum()
        count += y.numel()
        if (step + 1) % sync_every == 0 or step + 1 == len(loader):
            mean_loss = loss_sum.item() / count          # one host sync per sync_every steps
            if not math.isfinite(mean_loss):
                bar.close()
                raise TrainingError(
                    f"non-finite loss in epoch {epoch + 1} between steps {last_checked + 1} and {step + 1} "
                    f"(learning rate {lr:.4g}); lower --lr or check the data. The last good checkpoint "
                    "is kept in the run folder.")
            last_checked = step + 1
            elapsed = time.perf_counter() - start
            bar.set_postfix(loss=f"{mean_loss:.3f}", acc=f"{correct.item() / count:.3f}",
                            img_s=f"{count / elapsed:.0f}", lr=f"{lr:.4f}")
            bar.update(step + 1 - bar.n)
    bar.close()
    seconds = time.perf_counter() - start
    return {"train_loss": loss_sum.item() / max(count, 1), "train_accuracy": correct.item() / max(count, 1),
            "lr": lr, "seconds": seconds, "images_per_second": count / seconds if seconds > 0 else 0.0}


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"torch_cuda_{i}"] = s
    return state


def _set_rng_state(extra: dict[str, torch.Tensor]) -> None:
    if "torch_cpu" in extra:
        torch.set_rng_state(extra["torch_cpu"].cpu())
    if torch.cuda.is_available():
        states = [extra[k].cpu() for k in sorted(extra) if k.startswith("torch_cuda_")]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild a network from a checkpoint file (or a run folder: its ``best`` or ``last``).

    The stored configuration is validated before the model is built, and every weight must
    match the built model's names and shapes.

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
    for key in ("arch", "model_config"):
        if key not in meta:
            raise ValueError(f"checkpoint {path} has no {key!r} entry; it was not written by attncnn train")
    model = build_model_from_config(meta["arch"], dict(meta["model_config"]))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ckpt.model_state))
    unexpected = sorted(set(ckpt.model_state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit its configuration: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, tensor in ckpt.model_state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"checkpoint {path}: weight {name!r} has shape {tuple(tensor.shape)}, "
                             f"the configuration needs {tuple(expected[name].shape)}")
    model.load_state_dict(ckpt.model_state)
    return model.to(device).eval(), meta


def _loaders(config: TrainConfig, device: torch.device):
    dataset = load_dataset(config.data, data_dir=config.data_dir, download=config.download)
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
    train_loader = DeviceLoader(train_split, batch_size=config.batch_size, device=device, train=True,
                                seed=config.seed)
    test_loader = DeviceLoader(dataset.test, batch_size=config.eval_batch_size, device=device, train=False)
    return dataset, train_loader, test_loader


def train(config: TrainConfig, out_dir: str | Path, *, mode: str = "new", progress: bool = True) -> dict:
    """Train ``config`` into the run folder ``out_dir``; returns the final summary.

    Args:
        config: the resolved configuration (ignored on resume: the stored one is used).
        out_dir: run folder.
        mode: ``"new"`` (refuse a non-empty folder), ``"overwrite"``, or ``"resume"``
            (continue from the folder's last checkpoint with its stored configuration).
        progress: show a tqdm progress bar on stderr.

    Raises:
        RunFolderError, DataError, ValueError, TrainingError: with a message naming the fix.
    """
    if mode == "resume":
        config = config_from_dict(RunFolder(out_dir, mode="resume").read_config())
    # Everything that can fail on bad input (device, data, model options) happens before the
    # run folder is created or overwritten, so a failed start leaves no half-made run behind.
    device = resolve_device(config.device)
    seed_everything(config.seed)
    if config.deterministic:
        torch.use_deterministic_algorithms(True)
    dataset, train_loader, test_loader = _loaders(config, device)
    model = build_model(config.preset, num_classes=dataset.num_classes, **config.model).to(device)
    run = RunFolder(out_dir, mode=mode)
    try:
        optimizer = make_optimizer(model, config)
        schedule = LRSchedule(base_lr=config.lr, epochs=config.epochs, steps_per_epoch=len(train_loader),
                              kind=config.schedule, warmup_ratio=config.warmup_ratio,
                              stepping=config.lr_stepping, milestones=tuple(config.milestones),
                              gamma=config.gamma, num_train_examples=train_loader.num_examples,
                              batch_size=config.batch_size)
        preset = get_preset(config.preset)
        model_config = dataclasses.asdict(model.config)
        start_epoch, best = 0, {"accuracy": -1.0, "epoch": None}
        if mode == "resume":
            last = run.latest_checkpoint()
            if last is not None:
                ckpt = load_checkpoint(last)
                model.load_state_dict(ckpt.model_state)
                optimizer.load_state_dict(ckpt.optimizer_state)
                _set_rng_state(ckpt.extra_tensors)
                start_epoch = int(ckpt.metadata["epoch"])
                best = dict(ckpt.metadata.get("best", best))
                run.rewind_metrics(start_epoch)
                log.info("resuming %s from %s (epoch %d done)", run.path, last.name, start_epoch)
        else:
            run.write_config(config.to_dict())
        params = count_parameters(model)
        log.info("preset %s: %s parameters, %d classes, data %s, device %s", config.preset, f"{params:,}",
                 dataset.num_classes, dataset.source, device)

        def save(path: Path, epoch: int, metrics: dict) -> None:
            save_checkpoint(path, model=model, optimizer=optimizer, extra_tensors=_rng_state(), metadata={
                "arch": preset.arch, "model_config": model_config, "config": config.to_dict(),
                "epoch": epoch, "metrics": metrics, "best": best, "classes": list(dataset.classes),
                "dataset": dataset.source, "parameters": params})

        record: dict = {}
        for epoch in range(start_epoch, config.epochs):
            train_loader.set_epoch(epoch)
            stats = train_one_epoch(model, optimizer, train_loader, schedule, epoch, progress=progress)
            result = evaluate(model, test_loader)
            record = {"epoch": epoch + 1, **stats, "test_loss": result.loss, "test_accuracy": result.accuracy,
                      "eval_seconds": result.seconds}
            run.append_metrics(record)
            log.info("epoch %d/%d  lr %.4f  train loss %.4f acc %.4f  test loss %.4f acc %.4f  %.1fs  %.0f img/s",
                     epoch + 1, config.epochs, stats["lr"], stats["train_loss"], stats["train_accuracy"],
                     result.loss, result.accuracy, stats["seconds"], stats["images_per_second"])
            if result.accuracy > best["accuracy"]:
                # Selected on the test set, as the reference does (there is no validation split).
                best = {"accuracy": result.accuracy, "epoch": epoch + 1}
                save(run.checkpoint_path("best"), epoch + 1, record)
            if config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0:
                run.save_periodic(epoch + 1, lambda p, e=epoch + 1: save(p, e, record), config.keep_checkpoints)
            save(run.checkpoint_path("last"), epoch + 1, record)
        summary = {"preset": config.preset, "epochs": config.epochs, "parameters": params,
                   "dataset": dataset.source, "final": record, "best": best}
        run.mark_finished(summary)
        return summary
    finally:
        run.close()
