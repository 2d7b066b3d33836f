"""Time, throughput and the progress bar of one training epoch."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm          # plain: the bar only ever draws on a terminal (below), never in a notebook

from .distributed import Distributed
from .state import RunningSums

__all__ = ["EpochMeter"]


class EpochMeter:
    """Measures one epoch from its first step (or its resume point) to its last, and shows a tqdm
    bar on stderr when ``enabled`` and stderr is a terminal. Use as a context manager: the bar is
    closed on any exit.

    When stderr is not a terminal (CI, ``nohup``, a scheduler's log file) there is no bar: its
    carriage-return frames would pile up in the log (25 KB for the 5-epoch demo); the loop's one
    plain line per epoch is the progress report there.

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
        self.bar = tqdm(total=steps, initial=start_step, desc=f"epoch {epoch + 1}", unit="batch", leave=False,
                        disable=not (enabled and sys.stderr.isatty()), dynamic_ncols=True)

    def __enter__(self) -> "EpochMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def show(self, step: int, sums: RunningSums, lr: float) -> None:
        """Update the bar to ``step`` batches done (this process's sums only: one host sync, no collective)."""
        if self.bar.disable:
            return
        mean_loss, accuracy = sums.means(Distributed())
        elapsed = time.perf_counter() - self.start
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", acc=f"{accuracy:.3f}",
                             img_s=f"{(sums.count - self.count_before) / elapsed:.0f}", lr=f"{lr:.4f}")
        self.bar.update(step - self.bar.n)

    def finish(self, sums: RunningSums, lr: float, dist: Distributed) -> dict:
        """The epoch's training metrics: loss and accuracy over all processes (a collective under
        DDP), the last learning rate, seconds, and images per second over all processes."""
        seconds = time.perf_counter() - self.start
        mean_loss, accuracy = sums.means(dist)
        # every process trains the same number of examples per step (the loader makes the shards equal)
        done_now = (sums.count - self.count_before) * dist.world_size
        return {"train_loss": mean_loss, "train_accuracy": accuracy, "lr": lr, "seconds": seconds,
                "images_per_second": done_now / seconds if seconds > 0 else 0.0}
