"""Typed training configuration, resolved from a preset plus explicit overrides.

Defaults are the paper's recipe (PAPER.md 2.6 and 4): SGD with lr 0.1, momentum 0.9, weight
decay 1e-4 (none on Gaussian centres and spreads), batch 100, 300 epochs, 5 % linear warm-up then
cosine decay updated every batch. ``lr_stepping="epoch"`` reproduces the reference code's
per-epoch stepping (LR 0 during epoch 0).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from .._typecheck import value_matches
from ..models import get_preset

__all__ = ["TrainConfig", "resolve_config", "config_from_dict"]


@dataclass
class TrainConfig:
    """Everything that determines a training run (written to ``config.json`` in the run folder)."""

    preset: str = "quadratic"            #: model preset (attncnn.list_presets())
    model: dict = field(default_factory=dict)   #: overrides of the preset's model options
    data: str = "cifar10"                #: "cifar10", "cifar100", or a folder/zip path
    data_dir: str | None = None          #: cache folder for official archives (None: default)
    download: bool = False               #: fetch official archives when missing
    epochs: int = 300
    batch_size: int = 100
    eval_batch_size: int = 500
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: str = "cosine"             #: "cosine" (warm-up + cosine), "multistep", "constant"
    warmup_ratio: float = 0.05
    milestones: list[int] = field(default_factory=lambda: [80, 150, 250])
    gamma: float = 0.1
    lr_stepping: str = "step"            #: "step" (every batch) or "epoch" (reference quirk)
    seed: int = 42
    device: str = "auto"                 #: "auto", "cpu", "cuda", "cuda:1", ...
    train_subset: int | None = None      #: seeded, class-balanced subset of the training set
    checkpoint_every: int = 10           #: periodic checkpoint interval in epochs (0: none)
    checkpoint_every_steps: int = 0      #: also refresh ``last`` every N optimiser steps (0: epoch ends only)
    keep_checkpoints: int = 30           #: periodic checkpoints kept (0: all)
    deterministic: bool = False          #: torch.use_deterministic_algorithms
    init_from: str | None = None         #: start from this checkpoint's weights (fine-tuning); fresh optimiser

    def __post_init__(self) -> None:
        get_preset(self.preset)   # raises with the list of valid names
        for name in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.train_subset is not None and self.train_subset <= 0:
            raise ValueError(f"train_subset must be positive, got {self.train_subset}")
        if self.lr < 0 or self.weight_decay < 0 or not 0 <= self.momentum < 1:
            raise ValueError("lr and weight_decay must be >= 0 and momentum in [0, 1)")
        if self.schedule not in ("cosine", "multistep", "constant"):
            raise ValueError(f"schedule must be cosine, multistep or constant, got {self.schedule!r}")
        if self.lr_stepping not in ("step", "epoch"):
            raise ValueError(f"lr_stepping must be 'step' or 'epoch', got {self.lr_stepping!r}")
        if self.init_from is not None and not self.init_from:
            raise ValueError("init_from must be a checkpoint path or None, got an empty string")
        for name in ("checkpoint_every", "checkpoint_every_steps", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 turns it off), got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def config_from_dict(values: dict) -> TrainConfig:
    """Validate and build a :class:`TrainConfig` (e.g. from ``config.json`` or a checkpoint).

    Raises:
        ValueError: unknown key or wrong type, naming the key and the expected type.
    """
    hints = typing.get_type_hints(TrainConfig)
    for key, value in values.items():
        if key not in hints:
            raise ValueError(f"unknown training option {key!r}; valid options: {', '.join(hints)}")
        if not value_matches(value, hints[key]):
            raise ValueError(f"training option {key!r} must be {hints[key]}, got {value!r}")
    values = dict(values)
    if "milestones" in values:
        values["milestones"] = list(values["milestones"])
    return TrainConfig(**values)


def resolve_config(preset: str, **overrides) -> TrainConfig:
    """The preset's recipe with ``overrides`` on top (None values mean "not given").

    Raises:
        ValueError: unknown preset or option (named in the message).
    """
    recipe = dict(get_preset(preset).train)
    recipe.update({k: v for k, v in overrides.items() if v is not None})
    recipe["preset"] = preset
    return config_from_dict(recipe)
