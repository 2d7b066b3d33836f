"""A benchmark row in a process of its own, stopped with everything it started after a time limit:
what ``speed.py`` and ``mini_speed.py`` share (a row's compilation and CUDA graphs die with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Finished", "run_limited", "kill_group"]


@dataclass(frozen=True)
class Finished:
    """How a row's process ended: ``returncode`` (None: stopped at the limit), its ``stdout`` and
    ``stderr`` (``stderr`` empty where it was merged into ``stdout``), ``seconds`` of wall time."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def stopped(self) -> bool:
        return self.returncode is None


def run_limited(cmd: list[str], env: dict[str, str], cwd: Path, limit: float | None,
                merge_stderr: bool = False) -> Finished:
    """Run ``cmd`` in a session of its own and wait at most ``limit`` seconds (None: no limit); on
    the limit, and after it returns (workers a compiler left behind), SIGKILL its process group."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=cwd, start_new_session=True,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        return Finished(None, "", "", time.monotonic() - start)
    finally:
        kill_group(proc)
    return Finished(proc.returncode, stdout or "", stderr or "", time.monotonic() - start)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group that ``proc`` leads (nothing where it is gone)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
