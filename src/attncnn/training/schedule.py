"""Learning-rate schedules: linear warm-up + cosine (attention models), multistep (ResNet), constant.

Source: the paper's training setup (SGD, 5 % linear warm-up, cosine decay) as the reference code
computes it (``utils/learning_rate.py`` and ``train.py``), and its ResNet18 baseline's schedule
(``runs/resnet``: ``MultiStepLR`` at epochs 80, 150, 250, x0.1).

Two ways of applying the schedule are offered, because the paper and its code differ here:

* ``stepping="step"`` (default): the LR is updated before every batch, which is what the paper
  describes. The cosine curve spans ``epochs * steps_per_epoch`` batches.
* ``stepping="epoch"``: replicates the reference code, which steps its scheduler once per epoch.
  Every batch of epoch ``e`` then uses one LR (a staircase sampled from the per-step curve), the
  very first epoch runs with LR 0, and the reference ``T_max = epochs * (N // batch + 1)`` is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = ["warmup_cosine_multiplier", "LRSchedule"]

_KINDS = ("cosine", "multistep", "constant")
_STEPPINGS = ("step", "epoch")


def warmup_cosine_multiplier(step: float, total_steps: int, warmup_steps: int) -> float:
    """Multiplier lambda(s) of the base LR: linear warm-up, then half a cosine down to 0.

    ``lambda(s) = s / warmup_steps`` for ``s < warmup_steps``, otherwise
    ``0.5 * (1 + cos(pi * (s - warmup_steps) / (total_steps - warmup_steps)))`` (reference ``utils/learning_rate.py``).
    Steps past ``total_steps`` are clamped to ``total_steps`` (multiplier 0) rather than letting the
    cosine rise again.

    Args:
        step: global step ``s >= 0`` (batches, or any unit consistent with the two totals).
        total_steps: ``T_max > warmup_steps``.
        warmup_steps: ``T_warmup >= 0``; 0 means no warm-up.

    Returns:
        A float in ``[0, 1]``.

    Raises:
        ValueError: negative ``step`` or ``warmup_steps``, or ``total_steps <= warmup_steps``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0:
        raise InputError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if total_steps <= warmup_steps:
        raise InputError(f"total_steps ({total_steps}) must be larger than warmup_steps ({warmup_steps})")
    if step < warmup_steps:
        return step / warmup_steps
    progress = min(step, total_steps) - warmup_steps
    return 0.5 * (1.0 + math.cos(math.pi * progress / (total_steps - warmup_steps)))


@dataclass(frozen=True)
class LRSchedule:
    """Learning rate of every batch of a run.

    Attributes:
        base_lr: peak LR (paper: 0.1 with SGD).
        epochs: number of training epochs (> 0).
        steps_per_epoch: batches actually run per epoch (> 0; 500 for CIFAR-10 at batch 100).
        kind: ``"cosine"`` (linear warm-up + cosine, attention models), ``"multistep"`` (ResNet,
            reference ``runs/resnet``) or ``"constant"``.
        warmup_ratio: warm-up length as a fraction of ``T_max``, in ``[0, 1)`` (paper: 0.05).
        stepping: ``"step"`` (update every batch, the paper's description) or ``"epoch"``
            (the reference code's once-per-epoch update; see the module docstring).
        milestones: multistep decay epochs (0-based epoch indices; paper: 80, 150, 250).
        gamma: multistep decay factor (paper: 0.1).
        num_train_examples, batch_size: needed only for ``kind="cosine", stepping="epoch"``,
            where the reference uses ``T_max = epochs * (num_train_examples // batch_size + 1)``.

    Multistep semantics:
        * ``stepping="step"``: ``lr = base_lr * gamma ** #{m in milestones : m <= epoch}``, i.e. the
          decay starts at the milestone epoch (0-based), as ``MultiStepLR`` stepped at the end of
          each epoch would do.
        * ``stepping="epoch"``: the reference calls ``scheduler.step()`` at the *start* of every
          epoch, so epoch ``e`` runs after ``e + 1`` steps and
          ``lr = base_lr * gamma ** #{m : m <= epoch + 1}``: each decay lands one epoch earlier.

    Raises:
        InputError: ``epochs <= 0``, ``steps_per_epoch <= 0``, unknown ``kind``/``stepping``,
            ``warmup_ratio`` outside ``[0, 1)``, negative ``base_lr``, ``gamma <= 0``, or
            ``stepping="epoch"`` cosine without positive ``num_train_examples``/``batch_size``.
    """

    base_lr: float
    epochs: int
    steps_per_epoch: int
    kind: str = "cosine"
    warmup_ratio: float = 0.05
    stepping: str = "step"
    milestones: tuple[int, ...] = (80, 150, 250)
    gamma: float = 0.1
    num_train_examples: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "milestones", tuple(int(m) for m in self.milestones))
        if self.kind not in _KINDS:
            raise InputError(f"unknown LR schedule kind {self.kind!r}; choose one of {', '.join(_KINDS)}")
        if self.stepping not in _STEPPINGS:
            raise InputError(f"unknown LR stepping {self.stepping!r}; choose 'step' (update every batch) "
                             "or 'epoch' (reference: update once per epoch)")
        if not self.epochs > 0:
            raise InputError(f"epochs must be > 0, got {self.epochs}")
        if not self.steps_per_epoch > 0:
            raise InputError(f"steps_per_epoch must be > 0, got {self.steps_per_epoch}")
        if not (self.base_lr >= 0 and math.isfinite(self.base_lr)):
            raise InputError(f"base_lr must be a finite number >= 0, got {self.base_lr}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise InputError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not self.gamma > 0:
            raise InputError(f"gamma must be > 0, got {self.gamma}")
        if self.kind == "cosine" and self.stepping == "epoch":
            for name in ("num_train_examples", "batch_size"):
                value = getattr(self, name)
                if value is None or value <= 0:
                    raise InputError(f"cosine schedule with stepping='epoch' needs a positive {name} "
                                     f"(reference T_max = epochs * (num_train_examples // batch_size + 1)), "
                                     f"got {value}")

    @property
    def total_steps(self) -> int:
        """Cosine ``T_max`` in batches: ``epochs * steps_per_epoch`` (per-step) or the reference's
        ``epochs * (num_train_examples // batch_size + 1)`` (per-epoch)."""
        if self.stepping == "epoch" and self.num_train_examples is not None and self.batch_size is not None:
            return self.epochs * (self.num_train_examples // self.batch_size + 1)
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        """Cosine ``T_warmup = int(warmup_ratio * T_max)`` in batches."""
        return int(self.warmup_ratio * self.total_steps)

    def lr_at(self, epoch: int, step_in_epoch: int) -> float:
        """LR used for batch ``step_in_epoch`` (0-based) of epoch ``epoch`` (0-based).

        Raises:
            ValueError: ``epoch`` outside ``[0, epochs)`` or ``step_in_epoch`` outside
                ``[0, steps_per_epoch)``.
        """
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} is outside [0, {self.epochs})")
        if not 0 <= step_in_epoch < self.steps_per_epoch:
            raise ValueError(f"step_in_epoch {step_in_epoch} is outside [0, {self.steps_per_epoch})")
        if self.kind == "constant":
            return float(self.base_lr)
        if self.kind == "multistep":
            reached = epoch if self.stepping == "step" else epoch + 1
            decays = sum(1 for m in self.milestones if m <= reached)
            return float(self.base_lr * self.gamma ** decays)
        step = epoch * self.steps_per_epoch + (step_in_epoch if self.stepping == "step" else 0)   # "epoch": its start
        return float(self.base_lr * warmup_cosine_multiplier(step, self.total_steps, self.warmup_steps))

    def set_lr(self, optimizer: Any, epoch: int, step_in_epoch: int) -> float:
        """Write the LR of this batch into every parameter group of ``optimizer`` and return it.

        A group holding an ``"lr_scale"`` key gets ``lr * lr_scale`` (default scale 1).

        Raises:
            ValueError: as :meth:`lr_at`.
        """
        lr = self.lr_at(epoch, step_in_epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr * float(group.get("lr_scale", 1.0))
        return lr
