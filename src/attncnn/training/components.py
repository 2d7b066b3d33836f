"""The parts a run is made of, built from its :class:`TrainConfig`: device, data loaders,
optimizer, learning-rate schedule, deterministic mode."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Iterator

import torch
from torch import nn

from ..data import DataError, Dataset, DataShape, DeviceLoader, ImageSplit, class_balanced_subset, load_dataset
from ..errors import InputError
from ..models import preset_model_config
from ..runs.config import TrainConfig
from .distributed import Distributed, per_process_batch
from .errors import TrainingError
from .schedule import LRSchedule

__all__ = ["resolve_device", "make_loaders", "make_optimizer", "make_schedule", "deterministic_algorithms",
           "CUBLAS_DETERMINISTIC", "fitted_to_images"]

log = logging.getLogger(__name__)


#: the device types a run trains on; torch knows more (meta, xla, ...), which fail later and obscurely
_DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(name: str, *, source: str | None = None) -> torch.device:
    """The device named by a ``--device`` value (or a stored one): ``"auto"`` -> CUDA when
    available, else CPU; ``cpu``, ``cuda``, ``cuda:N`` (and ``mps``) -> that device, if this
    machine has it.

    Args:
        name: the device string.
        source: where ``name`` came from, to start the message (default ``--device 'NAME'``).

    Raises:
        InputError: ``name`` is no device, a device type no run trains on (``meta``, ``xla``, ...),
            or a device this machine does not have; the message names ``source`` and the values to use.
    """
    source = source or f"--device {name!r}"
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:       # not a string (a stored 1): torch.device(1) would be cuda:1
        device = torch.device(name) if isinstance(name, str) else None
    except (RuntimeError, TypeError, ValueError):      # torch's parser: "Expected one of cpu, cuda, ..."
        device = None
    if device is None or device.type not in _DEVICE_TYPES:
        choices = "auto, cpu, cuda, cuda:N or mps" if _mps_available() else "auto, cpu, cuda or cuda:N"
        raise InputError(f"{source}: not a device this program runs on; use --device {choices}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{source}: CUDA is not available on this machine; use --device cpu")
    if device.type == "mps" and not _mps_available():
        raise InputError(f"{source}: MPS is not available on this machine; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise InputError(f"{source}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}; use one of them "
                         "(or --device cuda)")
    return device


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


#: the values of ``CUBLAS_WORKSPACE_CONFIG`` that make cuBLAS deterministic (CUDA's documentation)
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool, device: torch.device) -> Iterator[None]:
    """While the block runs, ``torch.use_deterministic_algorithms(True)`` if ``enabled``; the
    previous setting comes back afterwards. On CUDA, cuBLAS also needs ``CUBLAS_WORKSPACE_CONFIG``
    set before its first use (the ``attncnn`` command sets it): this only checks it.

    Raises:
        TrainingError: ``enabled`` on a CUDA device and ``CUBLAS_WORKSPACE_CONFIG`` not one of
            :data:`CUBLAS_DETERMINISTIC`; the message gives the fix.
    """
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    found = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if enabled:
        if device.type == "cuda" and found not in CUBLAS_DETERMINISTIC:
            raise TrainingError(f"deterministic training on CUDA needs cuBLAS's deterministic workspace, but "
                                f"CUBLAS_WORKSPACE_CONFIG is {'unset' if found is None else repr(found)}: set "
                                "CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment before the process starts CUDA; "
                                "the attncnn command does this for --deterministic")
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def make_loaders(config: TrainConfig, dist: Distributed, *, data_dir: str | None = None,
                 download: bool = False) -> tuple[Dataset, DeviceLoader, DeviceLoader]:
    """``(dataset, train loader, test loader)`` for this process; ``batch_size`` is the global batch,
    each process trains on its share (the evaluation batch is per process). ``data_dir`` and
    ``download``: the official archives' cache (:class:`~attncnn.training.RunOptions`).

    Raises:
        DataError: the data cannot be read (on ranks > 0: rank 0 could not read it).
        InputError: ``train_subset`` or ``batch_size`` larger than the training set.
    """
    def load():
        return load_dataset(config.data, data_dir=data_dir, download=download)

    # Rank 0 first, so that a download or a first decoding (which fills the cache) happens once;
    # the other processes then read the files it left.
    dataset = dist.on_main(load, f"load the data set {config.data}", DataError)
    if dataset is None:
        dataset = load()
    train_split = dataset.train
    if config.train_subset is not None:
        if config.train_subset > len(train_split.labels):
            raise InputError(f"--train-subset {config.train_subset} exceeds the {len(train_split.labels)} "
                             "training images")
        idx = class_balanced_subset(train_split.labels, config.train_subset, config.seed)
        train_split = ImageSplit(train_split.images[idx], train_split.labels[idx])
    if config.batch_size > len(train_split.labels):
        raise InputError(f"batch size {config.batch_size} is larger than the {len(train_split.labels)} "
                         "training images; lower --batch-size")
    shard = {"rank": dist.rank, "world_size": dist.world_size, "device": dist.device}
    train_loader = DeviceLoader(train_split, batch_size=per_process_batch(config.batch_size, dist.world_size),
                                train=True, seed=config.seed, cutmix=config.cutmix, cutmix_alpha=config.cutmix_alpha,
                                num_classes=dataset.num_classes, **shard)
    test_loader = DeviceLoader(dataset.test, batch_size=config.eval_batch_size, train=False, **shard)
    return dataset, train_loader, test_loader


def fitted_to_images(config: TrainConfig, dataset: Dataset | DataShape) -> TrainConfig:
    """``config`` with ``model.image_size`` set to the images' side where its network holds a learned
    absolute position embedding (``pos_embed="learned"``) made for another size and its options name
    none; otherwise ``config`` itself (other mismatches are left to
    :func:`attncnn.runs.loading.check_images`). Only new runs are fitted. ``dataset`` may be the data
    set or only its sizes."""
    if "image_size" in config.model:
        return config
    _, model_config = preset_model_config(config.preset, dataset.num_classes, **config.model)
    if getattr(model_config, "pos_embed", "none") != "learned":
        return config
    _, height, width = dataset.image_shape
    if height != width or height == model_config.image_size or height % model_config.pooling:
        return config
    log.info("preset %s: its learned position embedding is built for the %dx%d training images (model option "
             "image_size=%d; the preset's is %d)", config.preset, height, width, height, model_config.image_size)
    return dataclasses.replace(config, model={**config.model, "image_size": height})


def make_optimizer(model: nn.Module, config: TrainConfig, *, fused: bool = False) -> torch.optim.Optimizer:
    """``config.optimizer`` (SGD, the paper's, or AdamW, ConViT's) with two groups: weight decay on
    everything except the model's ``no_weight_decay()`` names (Gaussian centers and spreads, as the
    reference optimiser in ``train.py``; by the same rule GPSA's ``v_pos`` and gates).

    ``fused``: the optimizer's fused kernel instead of torch's default ``foreach`` kernels (the same
    update up to float32 rounding; a run-time option, never the recipe's).
    """
    skip = getattr(model, "no_weight_decay", lambda: set())()
    decay = [p for n, p in model.named_parameters() if n not in skip]
    no_decay = [p for n, p in model.named_parameters() if n in skip]
    groups = [{"params": decay, "weight_decay": config.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    kernel = {"fused": True} if fused else {}
    if config.optimizer == "adamw":
        # Adam's per-parameter step sizes are what ConViT trains GPSA's gates with; under SGD at
        # the paper's learning rate they barely move (README, sample-efficiency results).
        return torch.optim.AdamW(groups, lr=config.lr, **kernel)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, **kernel)


def make_schedule(config: TrainConfig, train_loader: DeviceLoader) -> LRSchedule:
    """The run's learning rate for every (epoch, step) (the paper's warm-up and cosine; ``schedule.py``)."""
    return LRSchedule(base_lr=config.lr, epochs=config.epochs, steps_per_epoch=len(train_loader),
                      kind=config.schedule, warmup_ratio=config.warmup_ratio, stepping=config.lr_stepping,
                      milestones=tuple(config.milestones), gamma=config.gamma,
                      num_train_examples=len(train_loader.labels), batch_size=config.batch_size)
