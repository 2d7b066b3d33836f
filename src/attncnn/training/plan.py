"""What a run takes from the machine at hand: :class:`RunPlan`.

A configuration (:class:`~attncnn.runs.TrainConfig`) says what to train; the plan says how this
machine trains it: the device, the precision of this machine's segment of the run, the attention
paths and whether to compile. Those are the speed choices that depend on the machine; they are made
before training, by :func:`attncnn.perf.make_plan` (a new run) or :func:`attncnn.perf.resume_plan`
(a run continued, perhaps on another machine), and the loop (:func:`attncnn.training.train`) takes
the plan as it is and measures nothing. A plan written by hand works too (tests do that).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..runs.config import TrainConfig

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    """How one process trains a run here.

    Attributes:
        device: where this process trains (under torchrun: its own GPU, ``cuda:LOCAL_RANK``).
        precision: ``"fp32"`` or ``"bf16"``, this segment's (a bf16 run resumed on a CPU without
            bf16 units trains in fp32 there; ``config.json`` keeps the run's own, each epoch record
            names the one that trained it).
        compile: compile the model (``torch.compile(dynamic=False)``).
        impl: the attention path to train with (``model.impl``); None keeps the model options' own.
        eval_impl: the attention path of test passes (``model.eval_impl``); None keeps the options'
            own (unset: the training path).
        device_option: the ``--device`` value to record in ``config.json`` for the rest of the run;
            None keeps the stored one.
    """

    device: torch.device
    precision: str
    compile: bool = False
    impl: str | None = None
    eval_impl: str | None = None
    device_option: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"a plan's precision is 'fp32' or 'bf16' (resolve 'auto' first), got {self.precision!r}")

    def applied_to(self, config: TrainConfig) -> TrainConfig:
        """``config`` as this plan trains it: precision, compile, the attention paths and the device option."""
        model = dict(config.model)
        if self.impl is not None:
            model["impl"] = self.impl
        if self.eval_impl is not None:
            model["eval_impl"] = self.eval_impl
        return dataclasses.replace(config, precision=self.precision, compile=self.compile, model=model,
                                   device=self.device_option if self.device_option is not None else config.device)

    def changes_stored(self, stored: TrainConfig) -> bool:
        """True when a resumed run's ``config.json`` must be rewritten: this plan chose new attention
        paths or another ``--device`` for it (precision and compile are not rewritten)."""
        return ((self.impl is not None and self.impl != stored.model.get("impl"))
                or (self.eval_impl is not None and self.eval_impl != stored.model.get("eval_impl"))
                or (self.device_option is not None and self.device_option != stored.device))
