"""The one way attncnn times code: wall-clock seconds of synchronised calls, medians of alternated rounds.

:func:`seconds` times one call (waiting for the GPU before and after); :func:`time_alternated` times
several candidates side by side, alternating them round by round (the order reversed every other
round) so that a machine that gets busier slows every candidate alike; :func:`time_median` is the
one-candidate case. A timing that runs for :data:`LONG_TIMING_SECONDS` or more says so once, with
the seconds so far and about how many are left.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from typing import Callable

import torch

from ..layers.base import GridAttention

__all__ = ["seconds", "time_alternated", "time_median", "time_impls", "run_impl", "paths_restored",
           "LONG_TIMING_SECONDS"]

log = logging.getLogger(__name__)

#: a timing running this long logs one line of progress (module docstring)
LONG_TIMING_SECONDS = 10.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call of ``fn`` on ``device`` (CUDA work finished before and after)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


class _Progress:
    """Counts the calls of one timing and logs one line once it has run :data:`LONG_TIMING_SECONDS`."""

    def __init__(self, what: str, calls: int) -> None:
        self.what, self.calls, self.done, self.logged = what, calls, 0, False
        self.start = time.perf_counter()

    def call_done(self) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        if self.logged or elapsed < LONG_TIMING_SECONDS or self.done >= self.calls:
            return
        self.logged = True
        log.info("timing %s: %.0f s for %d of %d calls so far, about %.0f s to go", self.what, elapsed, self.done,
                 self.calls, elapsed / self.done * (self.calls - self.done))


def time_alternated(fns: dict[str, Callable[[], object]], device: torch.device, *, reps: int = 3,
                    warmup: int = 1, what: str = "") -> dict[str, float]:
    """Median seconds per call of each of ``fns``, timed side by side.

    Args:
        fns: ``{name: fn}``, the candidates, called without arguments.
        device: where they run (CUDA is synchronised around every call).
        reps: timed calls per candidate, alternated across candidates (the order reversed every
            other round), so a busy machine slows every candidate alike.
        warmup: untimed calls of each candidate first (first touch of buffers, kernel choices).
        what: what is timed, for the progress line of a long timing (default: the candidates' names).

    Returns:
        ``{name: median seconds}``.
    """
    progress = _Progress(what or ", ".join(fns), len(fns) * (warmup + reps))
    for fn in fns.values():
        for _ in range(warmup):
            fn()
            progress.call_done()
    names = tuple(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(seconds(fns[name], device))
            progress.call_done()
    return {name: statistics.median(t) for name, t in times.items()}


def time_median(fn: Callable[[], object], device: torch.device, warmup: int = 1, reps: int = 3,
                what: str = "a call") -> float:
    """Median wall time of ``fn()`` in seconds after ``warmup`` untimed calls (``what``: as
    :func:`time_alternated`'s)."""
    return time_alternated({"fn": fn}, device, reps=reps, warmup=warmup, what=what)["fn"]


def time_impls(layer: GridAttention, x: torch.Tensor, *, autocast_dtype: torch.dtype | None = None,
               reps: int = 3, impls: tuple[str, ...] | None = None, backward: bool = True,
               warmup: int = 1) -> dict[str, float]:
    """Median seconds of one forward + backward (or forward only) of ``layer`` on ``x`` for each path.

    Args:
        layer: the layer, in the mode it will run in (train or eval); its ``impl`` and
            ``eval_impl`` are restored after.
        x: ``(B, H, W, D)`` input grid.
        autocast_dtype: run under :func:`torch.autocast` in this dtype (None: no autocast).
        reps: timed repetitions per path, alternated across paths (:func:`time_alternated`).
        impls: the paths to time (default: every path of the layer except ``"auto"`` and those
            that cannot run on ``x``'s device, :meth:`~attncnn.layers.GridAttention.path_unavailable`).
        backward: time forward + backward (training); False: the forward alone under
            :func:`torch.no_grad` (a test pass; put the layer in eval mode).
        warmup: untimed calls of each path first.

    Returns:
        ``{impl: seconds}``.

    Raises:
        ValueError: an ``impl`` the layer does not have.
    """
    impls = impls or tuple(i for i in layer.impls if i != "auto"
                           and layer.path_unavailable(i, x.device, backward=backward) is None)
    x = x.detach().requires_grad_(backward)

    def call(impl: str) -> Callable[[], None]:
        return lambda: run_impl(layer, x, impl, autocast_dtype=autocast_dtype, backward=backward)

    with paths_restored(layer):
        return time_alternated({impl: call(impl) for impl in impls}, x.device, reps=reps, warmup=warmup,
                               what=f"the attention paths {', '.join(impls)} of one layer")


@contextlib.contextmanager
def paths_restored(layer: GridAttention):
    """Run :func:`run_impl` calls inside: afterwards (after an error too) ``layer`` is back on its
    own ``impl`` and ``eval_impl``, and the gradients those calls left are dropped."""
    saved = layer.impl, layer.eval_impl
    try:
        yield layer
    finally:
        layer.impl, layer.eval_impl = saved
        layer.zero_grad(set_to_none=True)


def run_impl(layer: GridAttention, x: torch.Tensor, impl: str, *, autocast_dtype: torch.dtype | None = None,
             backward: bool = True) -> None:
    """One forward (+ backward) of ``layer`` on ``x`` through the path ``impl``, as :func:`time_impls`
    times it; the layer is left on that path (``eval_impl`` cleared) and its gradients are kept."""
    layer.impl, layer.eval_impl = impl, None
    ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with ctx, torch.set_grad_enabled(backward):
        out = layer(x)
    if backward:
        out.float().sum().backward()
