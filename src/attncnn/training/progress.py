"""Time, throughput and the progress bar (or, without a terminal, progress lines) of one training epoch."""

from __future__ import annotations

import logging
import math
import sys
import time

from tqdm import tqdm          # plain: the bar only ever draws on a terminal (below), never in a notebook

from .distributed import Distributed
from .state import RunningSums

__all__ = ["EpochMeter", "LINE_EVERY", "MIN_LINE_SECONDS", "MIN_EPOCH_SECONDS"]

log = logging.getLogger(__name__)

#: without a terminal, a progress line about every this fraction of an epoch ...
LINE_EVERY = 0.1
#: ... but never sooner than this many seconds after the epoch's start or the last line ...
MIN_LINE_SECONDS = 10.0
#: ... and none in an epoch that, at its pace so far, takes less than this many seconds
MIN_EPOCH_SECONDS = 30.0


class EpochMeter:
    """Measures one epoch from its first step (or its resume point) to its last, and shows a tqdm
    bar on stderr when ``enabled`` and stderr is a terminal. Use as a context manager: the bar is
    closed on any exit.

    When stderr is not a terminal (CI, ``nohup``, a scheduler's log file) there is no bar: its
    carriage-return frames would pile up in the log (25 KB for the 5-epoch demo). There a long
    epoch (several minutes of a paper-width model on a 2-core CPU) logs one INFO line about every
    :data:`LINE_EVERY` of its steps instead (step, running loss and accuracy, images/s), at most one
    per :data:`MIN_LINE_SECONDS` and none in an epoch shorter than :data:`MIN_EPOCH_SECONDS` at its
    pace so far; the loop's line per epoch follows as before. Lines are only written where the loop
    already syncs with the device (:meth:`show`), so they add no host sync of their own.

    Args:
        epoch: 0-based epoch.
        steps: batches in the epoch.
        start_step: batches already done (a resumed epoch).
        sums: the epoch's running sums (their ``count`` now is the examples done before this call).
        enabled: draw the bar (rank 0 only under DDP) if stderr is a terminal.
    """

    def __init__(self, epoch: int, steps: int, start_step: int, sums: RunningSums, enabled: bool) -> None:
        self.count_before = sums.count
        self.start = time.perf_counter()
        terminal = sys.stderr.isatty()
        self.bar = tqdm(total=steps, initial=start_step, desc=f"epoch {epoch + 1}", unit="batch", leave=False,
                        disable=not (enabled and terminal), dynamic_ncols=True)
        self.epoch, self.steps, self.start_step = epoch, steps, start_step
        self.lines = enabled and not terminal           # progress lines instead of the bar
        self.line_step, self.line_time = start_step, self.start     # where the last line (or the epoch) began

    def __enter__(self) -> "EpochMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def show(self, step: int, sums: RunningSums, lr: float) -> None:
        """Update the bar to ``step`` batches done (this process's sums only: one host sync, no collective);
        without a terminal, write a progress line where one is due (class docstring)."""
        if self.bar.disable:
            if self.lines:
                self._line(step, sums)
            return
        mean_loss, accuracy = sums.means(Distributed())
        elapsed = time.perf_counter() - self.start
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", acc=f"{accuracy:.3f}",
                             img_s=f"{(sums.count - self.count_before) / elapsed:.0f}", lr=f"{lr:.4f}")
        self.bar.update(step - self.bar.n)

    def _line(self, step: int, sums: RunningSums) -> None:
        """One INFO line of progress if a tenth of the epoch and MIN_LINE_SECONDS have passed since
        the last one, in an epoch long enough (its last step is the loop's epoch line, not this)."""
        now, done = time.perf_counter(), step - self.start_step
        if step >= self.steps or done <= 0 or step - self.line_step < math.ceil(LINE_EVERY * self.steps):
            return
        if now - self.line_time < MIN_LINE_SECONDS:
            return
        elapsed = now - self.start
        if elapsed / done * (self.steps - self.start_step) < MIN_EPOCH_SECONDS:
            return
        mean_loss, accuracy = sums.means(Distributed())
        log.info("epoch %d  step %d/%d (%d %%)  train loss %.4f acc %.4f  %.0f img/s", self.epoch + 1, step,
                 self.steps, 100 * step // self.steps, mean_loss, accuracy, (sums.count - self.count_before) / elapsed)
        self.line_step, self.line_time = step, now

    def finish(self, sums: RunningSums, lr: float, dist: Distributed) -> dict:
        """The epoch's training metrics: loss and accuracy over all processes (a collective under
        DDP), the last learning rate, seconds, and images per second over all processes."""
        seconds = time.perf_counter() - self.start
        mean_loss, accuracy = sums.means(dist)
        # every process trains the same number of examples per step (the loader makes the shards equal)
        done_now = (sums.count - self.count_before) * dist.world_size
        return {"train_loss": mean_loss, "train_accuracy": accuracy, "lr": lr, "seconds": seconds,
                "images_per_second": done_now / seconds if seconds > 0 else 0.0}
