"""Fixtures of the benchmark scripts' tests."""

import time
from pathlib import Path

import pytest


@pytest.fixture
def assert_process_ends():
    """A check that the process ``pid`` has ended within a few seconds: gone, or a zombie waiting
    for whoever adopted it to reap it (a stopped job's worker is killed, not waited for)."""
    def check(pid: int, what: str, seconds: float = 5.0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            status = Path(f"/proc/{pid}/status")
            if not status.exists() or "\tZ" in status.read_text():
                return
            time.sleep(0.1)
        pytest.fail(f"{what} {pid} still runs")
    return check
