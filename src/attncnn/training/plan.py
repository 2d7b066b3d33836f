"""What a run takes from the machine at hand: :class:`RunPlan`.

A recipe (:class:`~attncnn.runs.TrainConfig`, a run folder's ``config.json``) says what to train;
the plan says how this machine trains it: the device, the precision of this machine's segment of
the run, the attention paths, whether to compile and to run deterministically. It is
:class:`~attncnn.training.RunOptions` resolved for this machine, before training, by
:func:`attncnn.perf.make_plan` (a new run) or :func:`attncnn.perf.resume_plan` (a run continued,
perhaps on another machine); the loop (:func:`attncnn.training.train`) takes the plan as it is,
measures nothing, records it in ``machine.json`` and never in ``config.json``. A plan written by
hand works too (tests do that).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .run_options import RunOptions

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    """How one process trains a run here.

    Attributes:
        device: where this process trains (under torchrun: its own GPU, ``cuda:LOCAL_RANK``).
        precision: ``"fp32"`` or ``"bf16"``, this segment's (each epoch record names the one that
            trained it, ``machine.json`` each segment's).
        compile: compile the model (``torch.compile(dynamic=False)``; default False).
        deterministic: deterministic algorithms only (default False).
        impl: the attention path to train with (None, the default: the layers' own rule, ``"auto"``).
        eval_impl: the attention path of test passes (None: the training path).
        options: the run-time options this plan was made from (default: none given): where the data
            cache is, and the flags an interrupted run's ``--resume`` command repeats.
        machine: the machine, as ``machine.json`` records it (:func:`attncnn.perf.machine_info`);
            None (default): not recorded.

    Raises:
        ValueError (on construction): a precision other than fp32 or bf16.
    """

    device: torch.device
    precision: str
    compile: bool = False
    deterministic: bool = False
    impl: str | None = None
    eval_impl: str | None = None
    options: RunOptions = field(default_factory=RunOptions)
    machine: dict | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"a plan's precision is 'fp32' or 'bf16' (resolve 'auto' first), got {self.precision!r}")

    def model_options(self, model: dict) -> dict:
        """The recipe's model options ``model`` with this plan's attention paths: what the network is built with."""
        paths = {k: v for k, v in (("impl", self.impl), ("eval_impl", self.eval_impl)) if v is not None}
        return {**model, **paths}
