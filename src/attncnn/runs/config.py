"""Typed training configuration, resolved from a preset plus explicit overrides.

Every option is declared once, here, with its command-line help (:func:`option`). Defaults are
the paper's recipe (reference ``runs/*.sh`` and ``train.py``): SGD with lr 0.1, momentum 0.9,
weight decay 1e-4 (none on Gaussian centers and spreads), batch 100, 300 epochs, 5 % linear
warm-up then cosine decay updated every batch. ``lr_stepping="epoch"`` reproduces the reference
code's per-epoch stepping (LR 0 during epoch 0).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .._recorded_data import is_data_name
from .._typecheck import check_options
from ..errors import InputError
from ..models import get_preset, preset_model_config
from ..models.presets import ARCHITECTURES, PRESETS

__all__ = ["PRECISIONS", "MAX_EPOCHS", "MACHINE_FIELDS", "PATH_OPTIONS", "TrainConfig", "resolve_config",
           "recipe_from_dict", "without_paths", "option"]

#: values of ``--precision``; ``auto`` is resolved to one of the others when a run starts
PRECISIONS = ("auto", "fp32", "bf16")
#: the most ``epochs`` a run takes: far past any run, and where the schedule's step counts and a dry
#: run's estimate stay numbers (a float overflows near 1e308)
MAX_EPOCHS = 10**12
#: keys that configurations written before the recipe was kept apart from the machine stored beside
#: the recipe: how one machine ran it (now :class:`attncnn.training.RunOptions`); read, never written
MACHINE_FIELDS = ("device", "precision", "compile", "deterministic", "measure_paths", "data_dir", "download")
#: model options that name an attention computation path: a machine's choice (``--impl``,
#: ``--eval-impl``), never part of the recipe
PATH_OPTIONS = ("impl", "eval_impl")


def option(default=dataclasses.MISSING, *, help: str, factory=dataclasses.MISSING, **argparse_kwargs):
    """A :class:`TrainConfig` field with its command-line help.

    Args:
        default / factory: the field's default value / default factory (for lists and dicts).
        help: the ``--help`` text of its flag.
        **argparse_kwargs: extra flag settings: ``choices``, ``metavar``, or ``flag`` (a flag name
            other than ``--field-name``).
    """
    return field(default=default, default_factory=factory, metadata={"help": help, **argparse_kwargs})


@dataclass
class TrainConfig:
    """The recipe: everything that defines a training run (``config.json`` in the run folder), the
    same on every machine that trains or resumes it. How a machine runs it (device, precision,
    compile, deterministic, attention paths, data cache) is not here: see
    :class:`attncnn.training.RunOptions`.

    Raises (on construction):
        InputError: unknown preset, model options the preset's network rejects (checked on its
            configuration dataclass: no weights are allocated), an attention path among the model
            options (``impl``, ``eval_impl``: named with ``--impl`` / ``--eval-impl``), or an
            out-of-range value; the message names the option.
    """

    preset: str = option("quadratic", help="model preset (see `attncnn presets`; e.g. demo, minutes on a CPU)")
    model: dict = option(factory=dict, flag="--set", metavar="KEY=VALUE",
                         help="override a model option, e.g. --set num_heads=16 (repeatable)")
    data: str = option("cifar10", help="cifar10 (default), cifar100, or a folder/zip with train/<class>/ and "
                                       "test/<class>/")
    epochs: int = option(300, help="training epochs")
    batch_size: int = option(100, help="global batch size (split over the processes under torchrun)")
    eval_batch_size: int = option(500, help="evaluation batch per process (sets memory use only)")
    optimizer: str = option("sgd", choices=("sgd", "adamw"),
                            help="sgd (the paper's, with --momentum) or adamw (ConViT's and DeiT's: Adam with "
                                 "decoupled weight decay, betas 0.9/0.999; set its own --lr and --weight-decay, "
                                 "e.g. 5e-4 and 0.05)")
    lr: float = option(0.1, help="peak learning rate (paper: 0.1)")
    momentum: float = option(0.9, help="SGD momentum (not used by adamw)")
    weight_decay: float = option(1e-4, help="weight decay (never on Gaussian centers and spreads)")
    schedule: str = option("cosine", choices=("cosine", "multistep", "constant"),
                           help="learning-rate schedule: warm-up + cosine, steps at --milestones, or constant")
    warmup_ratio: float = option(0.05, help="linear warm-up as a fraction of all steps (cosine schedule)")
    milestones: list[int] = option(factory=lambda: [80, 150, 250], metavar="EPOCH",
                                   help="multistep schedule: epochs where the LR is multiplied by --gamma")
    gamma: float = option(0.1, help="multistep schedule: LR factor at each milestone")
    lr_stepping: str = option("step", choices=("step", "epoch"),
                              help="update the LR every batch (default) or once per epoch like the reference code")
    cutmix: float = option(0.0, metavar="P",
                           help="CutMix (Yun et al. 2019): the probability that a training batch is mixed, one "
                                "box pasted from another image of the batch and the labels mixed by area (0, the "
                                "paper's and every preset's: off; the CutMix paper's CIFAR runs use 0.5)")
    cutmix_alpha: float = option(1.0, metavar="ALPHA",
                                 help="CutMix's Beta(alpha, alpha) parameter of the mixed fraction (1.0: uniform)")
    label_smoothing: float = option(0.0, help="label smoothing of the training loss (0, the paper's: none)")
    seed: int = option(42, help="seed of the weights, the data order, augmentation and dropout")
    train_subset: int | None = option(None, help="train on a seeded class-balanced subset of N images")
    eval_every: int = option(1, metavar="EPOCHS",
                             help="evaluate on the test set every N epochs and after the last (default 1: every "
                                  "epoch); the best checkpoint is chosen among the evaluated epochs")
    checkpoint_every: int = option(10, help="periodic checkpoint interval in epochs (0: none)")
    checkpoint_every_steps: int = option(0, metavar="N",
                                         help="also refresh the 'last' checkpoint every N optimiser steps, so a "
                                              "killed run loses at most N steps (0, the default: only at the end "
                                              "of each epoch)")
    keep_checkpoints: int = option(30, help="periodic checkpoints to keep (0: all)")
    init_from: str | None = option(None, metavar="CHECKPOINT",
                                   help="start from this checkpoint's weights (fine-tune: new optimiser and "
                                        "schedule); a run folder means its last checkpoint")

    def __post_init__(self) -> None:
        for name in PATH_OPTIONS:
            if name in self.model:
                flag = "--" + name.replace("_", "-")
                raise InputError(f"--set {name}={self.model[name]} names how a machine runs the model, not the "
                                 f"recipe; pass {flag} {self.model[name]} instead")
        preset_model_config(self.preset, **self.model)   # names a bad preset or model option; builds nothing
        for name in ("epochs", "batch_size", "eval_batch_size", "eval_every"):
            if getattr(self, name) <= 0:
                raise InputError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.epochs > MAX_EPOCHS:
            digits = len(str(self.epochs))
            raise InputError(f"epochs must be at most {MAX_EPOCHS:,} (10**12), got "
                             f"{self.epochs if digits <= 20 else f'a number of {digits} digits'} (--epochs)")
        if self.train_subset is not None and self.train_subset <= 0:
            raise InputError(f"train_subset must be positive, got {self.train_subset}")
        for name in ("lr", "weight_decay"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise InputError(f"{name} must be a finite number >= 0, got {getattr(self, name)} "
                                 f"(--{name.replace('_', '-')})")
        if not 0.0 <= self.cutmix <= 1.0:
            raise InputError(f"cutmix must be a probability in [0, 1] (0: off), got {self.cutmix} (--cutmix)")
        if not (math.isfinite(self.cutmix_alpha) and self.cutmix_alpha > 0):
            raise InputError(f"cutmix_alpha must be a finite number > 0 (the Beta distribution's parameter; 1.0 draws "
                             f"the mixed fraction uniformly), got {self.cutmix_alpha} (--cutmix-alpha)")
        # warmup_ratio: the schedule's own check, here so that it fails before the data is loaded
        for name in ("label_smoothing", "momentum", "warmup_ratio"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InputError(f"{name} must be in [0, 1), got {getattr(self, name)} (--{name.replace('_', '-')})")
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise InputError(f"gamma must be a finite number > 0, got {self.gamma} (--gamma)")
        if any(m < 1 for m in self.milestones):
            raise InputError(f"milestones must be epochs >= 1, got {list(self.milestones)} (--milestones)")
        for name in ("optimizer", "schedule", "lr_stepping"):
            choices = _FIELDS[name].metadata["choices"]
            if getattr(self, name) not in choices:
                raise InputError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.init_from is not None and not self.init_from:
            raise InputError("init_from must be a checkpoint path or None, got an empty string")
        for name in ("checkpoint_every", "checkpoint_every_steps", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0 (0 turns it off), got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def recipe_from_dict(values: dict, *, source: str | os.PathLike[str] | None = None) -> tuple[TrainConfig, dict]:
    """The recipe in ``values`` (a ``config.json`` or a checkpoint's ``"config"``), and the machine
    fields that older runs stored beside it (:data:`MACHINE_FIELDS`, :data:`PATH_OPTIONS`; returned
    unchecked by the names of :class:`attncnn.training.RunOptions`' fields, never written back).

    Args:
        values: the options, by field name.
        source: the file they were read from: every error then starts with it.

    Returns:
        ``(recipe, machine fields)``.

    Raises:
        InputError: unknown key or wrong type (the key, the expected type, the value and the fix), an
            out-of-range value or a model option the preset rejects, prefixed with ``source``.
    """
    values = dict(values)
    machine = {name: values.pop(name) for name in MACHINE_FIELDS if name in values}
    if isinstance(values.get("model"), dict):
        model = dict(values["model"])
        machine.update({name: model.pop(name) for name in PATH_OPTIONS if name in model})
        values["model"] = model
    return _checked(values, source), machine


def without_paths(model: dict) -> dict:
    """Model options (a checkpoint's ``"model_config"``, a recipe's ``"model"``) without the attention
    paths (:data:`PATH_OPTIONS`) that older checkpoints stored: a network loads with the fastest exact
    path for the device it lands on."""
    return {k: v for k, v in model.items() if k not in PATH_OPTIONS}


def _checked(values: dict, source: str | os.PathLike[str] | None) -> TrainConfig:
    check_options(values, TrainConfig, "training option", source=source)
    preset = PRESETS.get(values.get("preset", TrainConfig.preset))
    if source is not None and preset is not None and isinstance(values.get("model"), dict):
        # the "model" entry of a file, checked key by key against its preset's network: errors name the file
        check_options(values["model"], ARCHITECTURES[preset.arch][0], "model option", owner=preset.arch,
                      source=f"{source} (its \"model\" entry)")
    values = dict(values)
    if "milestones" in values:
        values["milestones"] = list(values["milestones"])
    try:
        return TrainConfig(**values)
    except ValueError as err:
        if source is None:
            raise
        raise InputError(f"{source}: {err}; correct it there") from err


def resolve_config(preset: str, **overrides) -> TrainConfig:
    """The preset's recipe with ``overrides`` on top (None values mean "not given"): a new run's
    configuration. A ``data`` path that exists is made absolute (links resolved), so later commands
    find it from any folder.

    Raises:
        InputError: unknown preset or option (a machine's option such as ``device`` too: it belongs to
            :class:`attncnn.training.RunOptions`).
    """
    recipe = dict(get_preset(preset).train)
    recipe.update({k: v for k, v in overrides.items() if v is not None})
    recipe["preset"] = preset
    data = recipe.get("data")
    if isinstance(data, str) and not is_data_name(data) and Path(data.strip()).expanduser().exists():
        recipe["data"] = str(Path(data.strip()).expanduser().resolve())
    return _checked(recipe, None)
