"""Time the computation paths (``impl``) of one attention layer side by side.

Every path of a layer computes the same output (tests check it), so which one is fastest is a
property of the machine, the grid, the batch and the dtype, not of the model: this module measures
it; :mod:`attncnn.training.path_choice` decides when to ask and caches the answer per machine.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from .base import GridAttention

__all__ = ["time_impls"]


def time_impls(layer: GridAttention, x: torch.Tensor, *, autocast_dtype: torch.dtype | None = None,
               reps: int = 3, impls: tuple[str, ...] | None = None, backward: bool = True) -> dict[str, float]:
    """Median seconds of one forward + backward (or forward only) of ``layer`` on ``x`` for each path.

    Args:
        layer: the layer, in the mode it will run in (train or eval); its ``impl`` and
            ``eval_impl`` are restored after.
        x: ``(B, H, W, D)`` input grid.
        autocast_dtype: run under :func:`torch.autocast` in this dtype (None: no autocast).
        reps: timed repetitions per path, alternated across paths (the order reversed every other
            round, after one untimed warm-up each), so a busy machine slows every path alike.
        impls: the paths to time (default: every path of the layer except ``"auto"``).
        backward: time forward + backward (training); False: the forward alone under
            :func:`torch.no_grad` (a test pass; put the layer in eval mode).

    Returns:
        ``{impl: seconds}``.

    Raises:
        ValueError: an ``impl`` the layer does not have.
    """
    impls = impls or tuple(i for i in layer.impls if i != "auto")
    saved = layer.impl, layer.eval_impl
    x = x.detach().requires_grad_(backward)

    def once(impl: str) -> float:
        layer.impl, layer.eval_impl = impl, None
        start = time.perf_counter()
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx, torch.set_grad_enabled(backward):
            out = layer(x)
        if backward:
            out.float().sum().backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        return time.perf_counter() - start

    try:
        for impl in impls:
            once(impl)                                          # warm-up (first touch, kernel choice)
        times: dict[str, list[float]] = {impl: [] for impl in impls}
        for r in range(reps):
            for impl in (impls if r % 2 == 0 else impls[::-1]):
                times[impl].append(once(impl))
    finally:
        layer.impl, layer.eval_impl = saved
        layer.zero_grad(set_to_none=True)
    return {impl: statistics.median(t) for impl, t in times.items()}
