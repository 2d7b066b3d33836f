"""Timing a run's choices on its own objects, only when the user asks: ``attncnn train --impl
measure`` (the attention paths) and ``--measure-compile`` (whether a compiled step pays back).

The written rule (:mod:`attncnn.perf.rule`) decides by default; these measure instead, once, on
the run's real network and optimizer before the first step (:func:`measure_paths`,
:func:`measure_compile`), put back whatever the timings change (:func:`kept_state`), and forget the
answer at exit (a timing taken beside other work ranks the candidates by how the load fell on them,
so it is never handed to a later run).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import statistics

import torch
from torch import nn

from ..layers import attention_modules
from ..training.step import training_step
from .timing import paths_restored, run_impl, seconds, time_alternated, time_impls

__all__ = ["REPS", "MIN_SPEEDUP", "CompileTiming", "kept_state", "measure_paths", "time_compile", "pays_back",
           "measure_compile"]

log = logging.getLogger(__name__)

#: timed calls of each path, alternated across paths
REPS = 7
#: compiled must be at least this much faster than eager, per step, to be chosen
MIN_SPEEDUP = 1.10


@contextlib.contextmanager
def kept_state(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device):
    """Inside, ``model`` and ``optimizer`` may be trained and evaluated; afterwards (after an error
    too) they are as they were: weights and buffers (copied back in place), the optimizer's state and
    groups, gradients, train/eval modes, the attention layers' paths and the model's ``config``, and
    the CPU (and ``device``'s CUDA) random state."""
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


def _fastest(layer, x: torch.Tensor, dtype: torch.dtype | None, *, backward: bool) -> tuple[str, dict]:
    """The fastest path of ``layer`` on ``x`` and the seconds of each; a path that raises here (a
    fused kernel this device or torch build lacks) is left out with a warning.

    Raises:
        the first path's error when no path runs.
    """
    impls = [i for i in layer.impls if i != "auto" and layer.path_unavailable(i, x.device, backward=backward) is None]
    working, errors = [], []
    probe = x.detach().requires_grad_(backward)
    with paths_restored(layer):
        for impl in impls:          # each once: finds the paths that run, and does the first touch
            try:
                run_impl(layer, probe, impl, autocast_dtype=dtype, backward=backward)
            except Exception as err:    # noqa: BLE001 - any failure of a path means: do not choose it
                errors.append(err)
                log.warning("attention path %s failed on %s (%s: %s); it is left out of the measurement", impl,
                            x.device, type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            else:
                working.append(impl)
    if not working:
        raise errors[0]
    timings = time_impls(layer, x, autocast_dtype=dtype, reps=REPS, impls=tuple(working), backward=backward,
                         warmup=0)
    return min(timings, key=timings.get), timings


def measure_paths(model: nn.Module, *, grid: tuple[int, int], batch: int | None, eval_batch: int | None, precision: str,
                  device: torch.device) -> tuple[str | None, str | None]:
    """The training path (where ``batch`` is given) and the test-pass path (where ``eval_batch`` is)
    of ``model``: each path of its first attention layer that can run here, forward + backward in
    training mode and the forward alone in eval mode, :data:`REPS` alternated calls each
    (:func:`attncnn.perf.timing.time_impls`), the fastest winning; None for each not measured, and
    without attention layers. The caller puts the model's state back (:func:`kept_state`).

    Args:
        grid: ``(H, W)`` of the layers' token grid. batch: training images per step. eval_batch:
            images per test batch.
        precision: ``"fp32"`` or ``"bf16"``. device: where the run trains.
    """
    layers = attention_modules(model)
    if not layers:
        return None, None
    layer, dtype = layers[0], (torch.bfloat16 if precision == "bf16" else None)
    chosen = []
    for mode, images in (("training", batch), ("test pass", eval_batch)):
        if images is None:
            chosen.append(None)
            continue
        layer.train(mode == "training")
        x = torch.randn(images, *grid, layer.dim, device=device)
        best, timings = _fastest(layer, x, dtype, backward=mode == "training")
        log.info("attention path (%s) %s, measured on one layer of the run's network (%s): %s", mode, best,
                 "forward + backward" if mode == "training" else "forward",
                 ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in timings.items()))
        chosen.append(best)
    return chosen[0], chosen[1]


@dataclasses.dataclass(frozen=True)
class CompileTiming:
    """Seconds of one training step (forward, loss, backward, optimizer step) of the same network:
    ``eager`` and ``compiled`` (medians), ``warmup`` (the first compiled step: tracing and code
    generation)."""

    eager: float
    compiled: float
    warmup: float

    @property
    def speedup(self) -> float:
        """``eager / compiled``: above 1 when the compiled step is faster."""
        return self.eager / self.compiled


def pays_back(timing: CompileTiming, steps: int, *, min_speedup: float = MIN_SPEEDUP) -> bool:
    """Whether compiling saves time over a run of ``steps`` training steps: compiled at least
    ``min_speedup`` times faster per step, and the seconds saved over the run larger than the warm-up."""
    return timing.eager >= min_speedup * timing.compiled and (timing.eager - timing.compiled) * steps > timing.warmup


def time_compile(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor, *,
                 precision: str, reps: int = 3) -> CompileTiming:
    """Time training steps of ``model`` eager and compiled (``torch.compile(model, dynamic=False)``,
    as the trainer compiles), alternated, on one batch. The weights and the optimizer's state change
    (the optimizer steps): give it a copy, or put them back (:func:`kept_state`). The compiled code
    stays in dynamo's cache: the trainer's own compilation of the same module reuses it.

    Args:
        model: the network in training mode, on the batch's device. optimizer: over its parameters.
        images: ``(B, C, H, W)`` float32. labels: ``(B,)`` class indices.
        precision: ``"fp32"`` or ``"bf16"``. reps: timed steps per mode after the warm-up.

    Raises:
        whatever ``torch.compile`` raises on this machine (e.g. no C++ compiler for inductor on a CPU).
    """
    device = images.device

    def call(net):
        return lambda: training_step(net, optimizer, images, labels, precision)

    seconds(call(model), device)                       # first touch of every buffer, kernel choices
    eager = statistics.median(seconds(call(model), device) for _ in range(2))
    compiled_model = torch.compile(model, dynamic=False)
    log.info("compile: compiling the training step to time it (eager: %.0f ms a step)...", 1e3 * eager)
    warmup = seconds(call(compiled_model), device)
    seconds(call(compiled_model), device)
    timed = time_alternated({"eager": call(model), "compiled": call(compiled_model)}, device, reps=reps, warmup=0,
                            what="the training step eager and compiled")
    return CompileTiming(eager=timed["eager"], compiled=timed["compiled"], warmup=warmup)


def measure_compile(model: nn.Module, optimizer: torch.optim.Optimizer, *, image_shape: tuple[int, int, int],
                    num_classes: int, batch: int, precision: str, device: torch.device, steps: int) -> bool:
    """Whether the run compiles, timed on ``model`` and ``optimizer`` themselves with random images of
    ``(batch, *image_shape)`` (:func:`time_compile`, :func:`pays_back` over ``steps``); a compiler
    that fails here means False, with a warning. The caller puts their state back (:func:`kept_state`)."""
    images = torch.randn(batch, *image_shape, device=device)
    labels = torch.randint(0, num_classes, (batch,), device=device)
    model.train()
    try:
        timing = time_compile(model, optimizer, images, labels, precision=precision)
    except Exception as err:        # noqa: BLE001 - any compiler failure means: train eager
        log.warning("torch.compile failed on this machine, training without it (%s: %s)", type(err).__name__,
                    str(err).splitlines()[0] if str(err) else "")
        return False
    decision = pays_back(timing, steps)
    log.info("compile: %s (measured on this run's network: a training step %.0f ms eager, %.0f ms compiled, "
             "%.2fx; warm-up %.1f s; %d steps save about %.0f s)", "on" if decision else "off", 1e3 * timing.eager,
             1e3 * timing.compiled, timing.speedup, timing.warmup, steps, (timing.eager - timing.compiled) * steps)
    return decision
