"""The chooser a plan hands to the training loop: :class:`RunChooser`.

:func:`attncnn.perf.make_plan` and :func:`~attncnn.perf.resume_plan` decide what needs neither data
nor a network (device, precision, deterministic); what has to be measured on the run's network is
left to a :class:`RunChooser` in the plan (:attr:`attncnn.training.RunPlan.choose`). The loop calls
it once, after it has built the real model, optimizer and loaders and before the first step
(:func:`attncnn.training.choices.choose_on`), so nothing is built twice and the data set is loaded
once. It decides, in this order:

1. the attention paths (:func:`attncnn.perf.paths.run_paths`): each candidate path of the
   network's first attention layer, forward + backward in train mode on a random batch of the
   training batch's shape, and the forward alone in eval mode without gradients on the evaluation
   batch;
2. whether to compile (:func:`attncnn.perf.compiling.choose_compile`): the real model and optimizer's
   training step eager and ``torch.compile(model, dynamic=False)``, with the paths just chosen.

Both read and write this machine's cache first (:mod:`attncnn.perf.cache`). Whatever the timings
do to the run's objects is undone before the chooser returns (:func:`kept_state`): the model's
weights and buffers (BatchNorm statistics included), the optimizer's state (empty for a new run:
empty again), every ``.grad``, the modules' train/eval modes, the attention layers' paths, and the
torch CPU and CUDA random states; the loaders are never touched (inputs are random tensors of the
batch's shape). So a run that measured trains the same steps, from the same state, as one that
was handed the same choices. The compiled code stays in dynamo's cache: where compiling wins, the
loop's ``torch.compile`` of the same module reuses it.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from ..layers import attention_modules
from ..training.choices import use_paths
from ..training.plan import Choices, RunParts
from .compiling import choose_compile
from .paths import run_paths

__all__ = ["RunChooser", "kept_state"]


@dataclass(frozen=True)
class RunChooser:
    """Decides on a run's real objects what its plan leaves open (module docstring); called by the
    loop as ``chooser(parts)`` with a :class:`~attncnn.training.RunParts`.

    Attributes:
        paths: choose the training path (``--impl`` not given, paths measured).
        eval_path: choose the test-pass path too (``--eval-impl`` not given).
        compile: choose whether to compile (``--compile`` not given).
        given: the paths the options give (``{"impl": ..., "eval_impl": ...}``, those given), part
            of the compile record's model options.
    """

    paths: bool = True
    eval_path: bool = True
    compile: bool = True
    given: dict = field(default_factory=dict)

    def __call__(self, parts: RunParts) -> Choices:
        """The :class:`~attncnn.training.Choices` for the run of ``parts``, its objects' state put
        back; under torchrun (``parts.distributed``) nothing is measured: compile off, paths open.

        Raises:
            the first path's error when no attention path runs here at all.
        """
        if parts.distributed:
            return Choices(compile=False if self.compile else None)
        with kept_state(parts.model, parts.optimizer, parts.device):
            impl = eval_impl = None
            if self.paths:
                impl, eval_impl = run_paths(parts.model, image_size=tuple(parts.image_shape[1:]), batch=parts.batch,
                                            eval_batch=parts.eval_batch if self.eval_path else None,
                                            precision=parts.precision, device=parts.device, steps=parts.steps,
                                            test_calls=parts.test_batches * parts.test_passes)
            # the paths the network will run: those given, the chosen ones on top
            decided = dict(self.given)
            if impl is not None:
                decided["impl"] = impl
                if eval_impl is not None:
                    decided["eval_impl"] = eval_impl
            compile = None
            if self.compile:
                use_paths(parts.model, decided.get("impl"), decided.get("eval_impl"))    # put back afterwards
                compile = choose_compile(parts.model, parts.optimizer, parts.config,
                                         model_options={**parts.config.model, **decided},
                                         image_shape=parts.image_shape, num_classes=parts.num_classes,
                                         batch=parts.batch, precision=parts.precision, device=parts.device,
                                         steps=parts.steps)
        return Choices(impl=impl, eval_impl=eval_impl, compile=compile)


@contextlib.contextmanager
def kept_state(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device):
    """Inside, ``model`` and ``optimizer`` may be trained and evaluated; afterwards (after an error
    too) they are as they were: weights and buffers (copied back in place, so the optimizer's
    parameters stay the same objects), the optimizer's state and groups, each parameter's ``.grad``,
    each module's train/eval mode, the attention layers' paths and the model's ``config``; and the
    torch CPU random state with, on CUDA, ``device``'s."""
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer_state = copy.deepcopy(optimizer.state_dict())
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    paths = [(layer, layer.impl, layer.eval_impl) for layer in attention_modules(model)]
    config = getattr(model, "config", None)
    devices = [device] if torch.device(device).type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            model.load_state_dict(weights)
        optimizer.load_state_dict(optimizer_state)
        for p, grad in grads:
            p.grad = grad
        for m, training in modes:
            m.training = training
        for layer, impl, eval_impl in paths:
            layer.impl, layer.eval_impl = impl, eval_impl
        if config is not None:
            model.config = config
