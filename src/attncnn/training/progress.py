"""Progress of a long loop over batches: a tqdm bar on a terminal, else a few log lines
(:class:`Progress`); and the time, throughput and progress of one training epoch (:class:`EpochMeter`)."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Callable

from tqdm import tqdm          # plain: the bar only ever draws on a terminal (below), never in a notebook

from .distributed import Distributed
from .state import RunningSums

__all__ = ["Progress", "EpochMeter", "LINE_EVERY", "MIN_LINE_SECONDS", "MIN_EPOCH_SECONDS"]

log = logging.getLogger(__name__)

#: without a terminal, a progress line about every this fraction of a loop (an epoch, a test pass) ...
LINE_EVERY = 0.1
#: ... but never sooner than this many seconds after the loop's start or the last line ...
MIN_LINE_SECONDS = 10.0
#: ... and none in a loop that, at its pace so far, takes less than this many seconds
MIN_EPOCH_SECONDS = 30.0


class Progress:
    """The progress of a loop of ``total`` steps: a tqdm bar on stderr when ``enabled`` and stderr
    is a terminal; otherwise one INFO line about every :data:`LINE_EVERY` of the steps, at most one
    per :data:`MIN_LINE_SECONDS`, none in a loop shorter than :data:`MIN_EPOCH_SECONDS` and none at
    its last step. What the bar and the lines say is asked of the caller only when drawn (a host sync
    only then). Close it (or use it as a context manager) to remove the bar.

    Args:
        total: steps in the loop.
        start: steps already done (a resumed epoch).
        desc: the bar's label.
        unit: what a step is, for the bar.
        enabled: show anything at all (rank 0 only under DDP).
    """

    def __init__(self, total: int, *, start: int = 0, desc: str, unit: str = "batch", enabled: bool = True) -> None:
        self.start = time.perf_counter()
        terminal = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=start, desc=desc, unit=unit, leave=False,
                        disable=not (enabled and terminal), dynamic_ncols=True)
        self.total, self.start_step = total, start
        self.lines = enabled and not terminal           # progress lines instead of the bar
        self.line_step, self.line_time = start, self.start     # where the last line (or the loop) began

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.bar.close()

    def show(self, step: int, postfix: Callable[[float], dict], line: Callable[[float], str]) -> None:
        """``step`` steps done: update the bar with ``postfix(seconds so far)`` (the values shown beside
        it), or without a terminal log ``line(seconds so far)`` where a line is due (class docstring)."""
        if self.bar.disable:
            if self.lines and self._due(step):
                now = time.perf_counter()
                log.info("%s", line(now - self.start))
                self.line_step, self.line_time = step, now
            return
        self.bar.set_postfix(**postfix(time.perf_counter() - self.start))
        self.bar.update(step - self.bar.n)

    def _due(self, step: int) -> bool:
        """A line is due: a tenth of the loop and MIN_LINE_SECONDS since the last one, in a loop long
        enough at its pace so far, before its last step."""
        now, done = time.perf_counter(), step - self.start_step
        if step >= self.total or done <= 0 or step - self.line_step < math.ceil(LINE_EVERY * self.total):
            return False
        if now - self.line_time < MIN_LINE_SECONDS:
            return False
        return (now - self.start) / done * (self.total - self.start_step) >= MIN_EPOCH_SECONDS


class EpochMeter:
    """Measures one epoch from its first step (or its resume point) to its last, with its
    :class:`Progress` (lines: step, running loss and accuracy, images/s), written only where the loop
    already syncs with the device (:meth:`show`). Use as a context manager.

    Args:
        epoch: 0-based epoch.
        steps: batches in the epoch.
        start_step: batches already done (a resumed epoch).
        sums: the epoch's running sums (their ``count`` now is the examples done before this call).
        enabled: draw the bar (rank 0 only under DDP) if stderr is a terminal.
    """

    def __init__(self, epoch: int, steps: int, start_step: int, sums: RunningSums, enabled: bool) -> None:
        self.count_before = sums.count
        self.progress = Progress(steps, start=start_step, desc=f"epoch {epoch + 1}", enabled=enabled)
        self.start = self.progress.start
        self.epoch, self.steps = epoch, steps

    @property
    def bar(self) -> tqdm:
        return self.progress.bar

    def __enter__(self) -> "EpochMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.close()

    def show(self, step: int, sums: RunningSums, lr: float) -> None:
        """Update the bar to ``step`` batches done (this process's sums only: one host sync, no collective);
        without a terminal, write a progress line where one is due (:class:`Progress`)."""
        def postfix(elapsed: float) -> dict:
            mean_loss, accuracy = sums.means(Distributed())
            return {"loss": f"{mean_loss:.3f}", "acc": f"{accuracy:.3f}",
                    "img_s": f"{(sums.count - self.count_before) / elapsed:.0f}", "lr": f"{lr:.4f}"}

        def line(elapsed: float) -> str:
            mean_loss, accuracy = sums.means(Distributed())
            return (f"epoch {self.epoch + 1}  step {step}/{self.steps} ({100 * step // self.steps} %)  train loss "
                    f"{mean_loss:.4f} acc {accuracy:.4f}  {(sums.count - self.count_before) / elapsed:.0f} img/s")

        self.progress.show(step, postfix, line)

    def finish(self, sums: RunningSums, lr: float, dist: Distributed) -> dict:
        """The epoch's training metrics: loss and accuracy over all processes (a collective under
        DDP), the last learning rate, seconds, and images per second over all processes."""
        seconds = time.perf_counter() - self.start
        mean_loss, accuracy = sums.means(dist)
        # every process trains the same number of examples per step (the loader makes the shards equal)
        done_now = (sums.count - self.count_before) * dist.world_size
        return {"train_loss": mean_loss, "train_accuracy": accuracy, "lr": lr, "seconds": seconds,
                "images_per_second": done_now / seconds if seconds > 0 else 0.0}
