"""SIGINT / SIGTERM become a stop request that the training loop reads after each step.

A run stopped this way finishes its current step and writes a resumable checkpoint instead of
dying half-way through a write. A second signal stops at once (KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["StopRequest", "stop_on_signals"]


class StopRequest:
    """Set by the handlers of :func:`stop_on_signals`; ``signum`` is None until a signal arrives."""

    signum: int | None = None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """While the block runs, SIGINT and SIGTERM only record a stop request (a second one raises
    KeyboardInterrupt at once); the previous handlers come back afterwards. Outside the main thread
    signals keep their usual effect."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.signum is not None:
            raise KeyboardInterrupt
        stop.signum = signum

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
