"""Throughput, memory and FLOP measurements for the presets.

Conventions:
- images/s: batch size / median wall time of one step over ``reps`` repetitions after ``warmup``
  untimed ones, on random normalised images; a training step is forward, cross-entropy, backward,
  SGD(momentum 0.9) update.
- FLOPs: counted by :class:`torch.utils.flop_counter.FlopCounterMode` (matrix products,
  convolutions, attention kernels; a multiply-accumulate is 2 FLOPs). "model FLOP/s" = counted
  training FLOPs per step / step time.
- peak memory: CUDA: ``torch.cuda.max_memory_allocated``; CPU: growth of the peak resident set,
  in a fresh process per configuration.
- attention paths: those ``attncnn train`` takes here by default, unless the options name ``impl``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_module
import resource
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ...errors import InputError
from ...layers import dense_attention
from ...layers.autocast_rules import autocast
from ...models import build_model, count_parameters, preset_model_config
from ...training.step import training_step
from ..host_memory import heap_policy, reuse_freed_memory
from ..rule import choose, device_kind
from ..timing import time_median

__all__ = ["matmul_peak", "time_median", "step_functions", "time_steps", "count_training_flops", "flops_per_image",
           "bench_preset", "bench_preset_isolated"]



def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, size: int | None = None,
                reps: int = 5) -> float:
    """Measured FLOP/s of a large square matrix product (the machine's practical peak)."""
    size = size or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = time_median(lambda: a @ b, device, warmup=2, reps=reps)
    return 2 * size ** 3 / seconds


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _addmm_inplace_flops(self_shape, mat1_shape, mat2_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * mat1_shape[0] * mat1_shape[1] * mat2_shape[1]


# torch 2.13's FlopCounterMode counts the CUDA SDPA kernels but not the CPU flash kernel that
# F.scaled_dot_product_attention dispatches to on CPU (GPSA's content term): without these two
# entries its products would count 0 FLOPs. Nor does it count the in-place ``addmm_`` (the folded
# path's backward adds the heads' input gradients with it).
_CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
             torch.ops.aten.addmm_: _addmm_inplace_flops}


def count_training_flops(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                         dense: bool = True) -> tuple[int, int]:
    """(forward FLOPs, forward+backward FLOPs) of one step on ``images``, by FlopCounterMode.

    ``dense=True`` counts the dense attention average (:func:`attncnn.layers.dense_attention`): "model
    FLOP/s" then compares models by their nominal work, as MFU does, whichever exact path computes
    it. ``dense=False`` counts the formulation the model actually runs (e.g. the separable path),
    the work the machine does."""
    def context():
        return dense_attention(model) if dense else contextlib.nullcontext()

    with context(), FlopCounterMode(display=False, custom_mapping=_CPU_SDPA) as counter:
        model(images)
    forward = counter.get_total_flops()
    with context(), FlopCounterMode(display=False, custom_mapping=_CPU_SDPA) as counter:
        F.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)
    return forward, counter.get_total_flops()


def flops_per_image(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int,
                    dense: bool = True) -> tuple[float, float]:
    """(forward, forward+backward) FLOPs per image of one step on ``batch_size`` images.

    A step's count is affine in the batch (per-image products plus per-step ones such as a
    batch-shared map), so this counts (:func:`count_training_flops`) on the first 2 and 4 of
    ``images`` and extrapolates, ``F(B) = F(2) + (B - 2) (F(4) - F(2)) / 2``; a batch of 4 or fewer is
    counted as it is.

    Raises:
        InputError: fewer than ``min(batch_size, 4)`` images.
    """
    if batch_size < 1 or len(images) < min(batch_size, 4):
        raise InputError(f"counting a step of {batch_size} images needs at least {min(batch_size, 4)} "
                         f"of them, got {len(images)}")
    if batch_size <= 4:
        forward, train = count_training_flops(model, images[:batch_size], labels[:batch_size], dense)
        return forward / batch_size, train / batch_size
    two = count_training_flops(model, images[:2], labels[:2], dense)
    four = count_training_flops(model, images[:4], labels[:4], dense)
    return tuple((f2 + (batch_size - 2) * (f4 - f2) / 2) / batch_size for f2, f4 in zip(two, four))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def step_functions(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, *,
                   run_model: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   precision: str = "fp32") -> tuple[Callable[[], None], Callable[[], None]]:
    """``(train_step, infer)``: the two calls :func:`time_steps` times, for timing or profiling.

    ``train_step()`` is forward under ``precision``'s autocast, float32 cross-entropy on ``labels``,
    backward and an SGD (momentum 0.9, lr 1e-3) update of ``model``'s weights; ``infer()`` a forward
    without gradients. Neither sets train/eval mode. Arguments as for :func:`time_steps`.
    """
    dev = images.device
    run_model = model if run_model is None else run_model     # (a compiled module has no truth value)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def train_step():
        training_step(run_model, optimizer, images, labels, precision)

    @torch.no_grad()
    def infer():
        with autocast(precision, dev):
            run_model(images)

    return train_step, infer


def time_steps(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, *,
               run_model: Callable[[torch.Tensor], torch.Tensor] | None = None, precision: str = "fp32",
               warmup: int = 1, reps: int = 3, what: str = "the model") -> dict:
    """Median seconds of one training step and one inference pass of ``model`` on ``images``
    (:func:`step_functions`: the step updates ``model``'s weights; time a copy if they matter).

    Args:
        images: ``(B, C, H, W)`` on the model's device. labels: ``(B,)`` int64.
        run_model: what to call instead of ``model`` (e.g. its ``torch.compile`` wrapper).
        precision: ``"fp32"`` or ``"bf16"`` (autocast, as ``attncnn train --precision bf16``: the loss
            in float32).
        what: names the model in the progress line of a long timing (:mod:`attncnn.perf.timing`).

    Returns:
        ``{"step_seconds", "infer_seconds", "peak_memory_bytes"}``; peak memory as in the module
        docstring (on CPU only meaningful in a fresh process).
    """
    dev = images.device
    train_step, infer = step_functions(model, images, labels, run_model=run_model, precision=precision)
    was_training = model.training
    model.train()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rss_before = _rss_bytes()
    step_s = time_median(train_step, dev, warmup=warmup, reps=reps, what=f"a training step of {what}")
    peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before)
    model.eval()
    infer_s = time_median(infer, dev, warmup=warmup, reps=reps, what=f"a test batch of {what}")
    model.train(was_training)
    return {"step_seconds": step_s, "infer_seconds": infer_s, "peak_memory_bytes": int(peak)}


def bench_preset(preset: str, *, baseline: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
                 batch_size: int = 100, device: str = "cpu", overrides: dict | None = None, warmup: int = 1,
                 reps: int = 3, precision: str = "fp32", compile: bool = False, channels_last: bool = False,
                 seed: int = 0) -> dict:
    """Measure one preset in this process; see the module docstring for the conventions.

    Args:
        baseline: times ``baseline(model)`` in the model's place: another formulation of the same
            network reading its weights (e.g. ``benchmarks/reference_style.py``'s); for
            :func:`bench_preset_isolated` a module-level function the child process can import.
            The model's paths are then those its options name.
        overrides: model options (e.g. ``{"num_layers": 2}``); without an ``impl``, the paths a
            run would take here.
        precision: ``"fp32"`` or ``"bf16"`` (autocast). compile: ``torch.compile`` the model.
    """
    dev = torch.device(device)
    host_memory = heap_policy() if dev.type == "cpu" else "n/a"
    overrides = dict(overrides or {})
    paths = _run_paths(preset, overrides, batch_size, precision, dev) if baseline is None else {}
    torch.manual_seed(seed)
    model = build_model(preset, **overrides, **paths)
    if baseline is not None:
        model = baseline(model)
    model = model.to(dev)
    images = torch.randn(batch_size, 3, 32, 32, device=dev)
    labels = torch.randint(0, 10, (batch_size,), device=dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.to(memory_format=torch.channels_last)
    per_image_fwd, per_image_train = flops_per_image(model, images, labels, batch_size)
    _, per_image_run = flops_per_image(model, images, labels, batch_size, dense=False)
    run_model = torch.compile(model) if compile else model
    timing = time_steps(model, images, labels, run_model=run_model, precision=precision, warmup=warmup, reps=reps)
    step_s, infer_s, peak = timing["step_seconds"], timing["infer_seconds"], timing["peak_memory_bytes"]
    return {"preset": preset, "baseline": None if baseline is None else baseline.__qualname__,
            "batch_size": batch_size, "overrides": overrides,
            "attention_paths": _attention_paths(model if baseline is None else None),
            "parameters": count_parameters(model), "train_images_per_s": batch_size / step_s,
            "infer_images_per_s": batch_size / infer_s, "step_seconds": step_s,
            "peak_memory_bytes": peak, "forward_flops_per_image": per_image_fwd,
            "train_flops_per_image": per_image_train,
            "model_flops_per_s": per_image_train * batch_size / step_s,
            "train_flops_per_image_as_run": per_image_run,
            "achieved_flops_per_s": per_image_run * batch_size / step_s,
            "precision": precision, "compile": compile, "host_memory": host_memory}


def _run_paths(preset: str, overrides: dict, batch_size: int, precision: str, device: torch.device) -> dict:
    """``{"impl": ..., "eval_impl": ...}``: the paths ``attncnn train`` takes for this preset on
    ``device`` by default (the written rule, on 32 x 32 images); empty when ``overrides`` name an
    ``impl`` or the network has no attention layers."""
    if "impl" in overrides:
        return {}
    _, config = preset_model_config(preset, 10, **overrides)
    if not hasattr(config, "attention"):
        return {}
    grid = (32 // config.pooling, 32 // config.pooling)
    rule = choose(device_kind(device), config.attention, grid, precision, 0, batch=batch_size)
    found = {"impl": rule.train_impl}
    if "eval_impl" not in overrides and rule.eval_impl != rule.train_impl:
        found["eval_impl"] = rule.eval_impl
    return found


def _attention_paths(model) -> dict:
    """``{"train": ..., "eval": ...}``: the attention path of each block in training and in eval mode;
    None for a network without attention and for a baseline (``model`` None: its layers compute
    another formulation, and have no path of ours to report)."""
    if not hasattr(model, "attention_paths"):
        return {"train": None, "eval": None}
    was_training = model.training
    try:
        return {"train": model.train().attention_paths(), "eval": model.eval().attention_paths()}
    finally:
        model.train(was_training)


def _child(queue, kwargs):
    try:
        if torch.device(kwargs.get("device", "cpu")).type == "cpu":
            reuse_freed_memory()        # this process is the harness's own: it measures as attncnn train runs
        queue.put(("ok", bench_preset(**kwargs)))
    except BaseException as err:     # report, don't hang the parent
        queue.put(("error", f"{type(err).__name__}: {err}"))


def bench_preset_isolated(**kwargs) -> dict:
    """:func:`bench_preset` in a fresh process (accurate CPU peak memory); same arguments.

    Raises:
        RuntimeError: the benchmark failed in the child (the message holds its error), or the child
            died without answering (e.g. a caller run from ``python -`` whose ``__main__`` a spawned
            process cannot import: run it from a file).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, kwargs))
    proc.start()
    while True:                     # wait for the answer, but not for a child that died without one
        alive = proc.is_alive()     # read before waiting: an answer sent just before exiting is still read
        try:
            status, result = queue.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not alive:
                raise RuntimeError(f"benchmark of {kwargs.get('preset')} failed: its process exited with code "
                                   f"{proc.exitcode} before answering (a caller run from `python -` or an "
                                   "interactive session cannot be imported by a spawned process: run it from a "
                                   "file)") from None
    proc.join()
    if status != "ok":
        raise RuntimeError(f"benchmark of {kwargs.get('preset')} failed: {result}")
    return result
