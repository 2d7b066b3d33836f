"""What a run takes from the machine at hand: :class:`RunPlan`, and the hand-over of the choices
left open in it (:class:`RunParts`, :class:`Choices`, :data:`Chooser`).

The recipe (:class:`~attncnn.runs.TrainConfig`) says what to train; the plan says how this machine
trains it: :class:`~attncnn.training.RunOptions` resolved by :func:`attncnn.perf.make_plan` or
:func:`attncnn.perf.resume_plan`. What depends on the run's network and length (attention paths,
compile) is left to :attr:`RunPlan.choose`, which the loop calls once on the real objects
(:class:`RunParts`) before the first step; it trains with the :class:`Choices` returned. The plan
goes to ``machine.json``, never to ``config.json``. Without a chooser, an open ``compile`` means
eager and open paths the layers' own rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch import nn

from ..runs.config import TrainConfig
from .run_options import COMPILE_MODES, RunOptions

__all__ = ["RunPlan", "RunParts", "Choices", "Chooser"]


@dataclass(frozen=True)
class RunParts:
    """The real objects of a run as its chooser gets them, before the first step (:attr:`RunPlan.choose`);
    the chooser may run them (a timing trains and evaluates) but must leave them as it found them:
    weights, buffers, optimizer state, gradients, random states.

    Attributes:
        model: the plain network (not a DDP or compiled wrapper) on ``device``, with the plan's
            attention paths.
        optimizer: its optimizer, in the state the first step will find (empty for a new run, the
            checkpoint's for a resumed one).
        config: the run's recipe (a new run's fitted to its images).
        device: this process's device. precision: ``"fp32"`` or ``"bf16"``.
        batch: training images per step and process. image_shape: ``(C, H, W)`` of the images.
        num_classes: classes of the data set (labels are ``0 .. num_classes - 1``).
        steps: training steps this segment takes (a resumed run: those left).
        eval_batch: images per test batch (the whole test set where it is smaller).
        test_batches: test batches of one test pass. test_passes: test passes this segment makes.
        distributed: several processes train (under torchrun): nothing is measured.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    config: TrainConfig
    device: torch.device
    precision: str
    batch: int
    image_shape: tuple[int, int, int]
    num_classes: int
    steps: int
    eval_batch: int
    test_batches: int
    test_passes: int
    distributed: bool = False


@dataclass(frozen=True)
class Choices:
    """What a chooser decided; None: not decided by it (the plan's value holds).

    Attributes:
        impl: the attention path of training. eval_impl: that of test passes (only where it
            differs from ``impl``). compile: compile the training step.
    """

    impl: str | None = None
    eval_impl: str | None = None
    compile: bool | None = None


#: ``chooser(parts) -> Choices``: what a plan leaves open, decided on the run's real objects
Chooser = Callable[[RunParts], Choices]


@dataclass(frozen=True)
class RunPlan:
    """How one process trains a run here.

    Attributes:
        device: where this process trains (under torchrun: its own GPU, ``cuda:LOCAL_RANK``).
        precision: ``"fp32"`` or ``"bf16"``, this segment's.
        compile: compile the model (``torch.compile(dynamic=False)``; default False); None: left to
            :attr:`choose` (eager without one).
        compile_mode: one of :data:`~attncnn.training.run_options.COMPILE_MODES` (default
            ``"default"``); ``"reduce-overhead"`` only with ``compile`` True, on CUDA.
        fused_optimizer: the optimizer's fused kernel instead of its foreach ones (default False).
        deterministic: deterministic algorithms only (default False).
        impl: the attention path to train with (None, the default: the layers' own rule, unless
            :attr:`choose` decides it).
        eval_impl: the attention path of test passes (None: the training path).
        options: the run-time options this plan was made from (the data cache, and the flags an
            interrupted run's ``--resume`` command repeats).
        machine: the machine, as ``machine.json`` records it (:func:`attncnn.perf.machine_info`);
            None (default): not recorded.
        choose: what decides the choices left open on the run's real objects (:data:`Chooser`,
            e.g. :class:`attncnn.perf.plan.RunChooser`); None (default): nothing to decide.

    Raises:
        ValueError (on construction): a precision other than fp32 or bf16, a compile mode not in
            ``COMPILE_MODES``.
    """

    device: torch.device
    precision: str
    compile: bool | None = False
    compile_mode: str = "default"
    fused_optimizer: bool = False
    deterministic: bool = False
    impl: str | None = None
    eval_impl: str | None = None
    options: RunOptions = field(default_factory=RunOptions)
    machine: dict | None = None
    choose: Chooser | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"a plan's precision is 'fp32' or 'bf16' (resolve 'auto' first), got {self.precision!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"a plan's compile_mode is one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")

    def model_options(self, model: dict) -> dict:
        """The recipe's model options ``model`` with this plan's attention paths: what the network is built with."""
        paths = {k: v for k, v in (("impl", self.impl), ("eval_impl", self.eval_impl)) if v is not None}
        return {**model, **paths}

    def decided(self, choices: Choices | None = None) -> "RunPlan":
        """This plan with ``choices`` taken (their None fields leave the plan's values), nothing
        left open: ``compile`` True or False, no chooser."""
        choices = choices or Choices()
        paths = {"impl": self.impl, "eval_impl": self.eval_impl}
        if choices.impl is not None:
            paths = {"impl": choices.impl, "eval_impl": choices.eval_impl or self.eval_impl}
        compile = self.compile if choices.compile is None else choices.compile
        return replace(self, **paths, compile=bool(compile), choose=None)
