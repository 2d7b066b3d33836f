"""The lock that keeps two processes from training in one run folder at once.

``<run>/.lock`` is held with ``fcntl.flock`` by the one process that writes the run; its text names
that process (pid and host) for the error another process gets.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from .errors import RunFolderError

__all__ = ["LOCK_FILE", "RunLock"]

#: the lock file of a run being trained, inside the run folder
LOCK_FILE = ".lock"
#: seconds to wait for a new holder's line (written right after it takes the lock)
_HOLDER_WAIT = 1.0


class RunLock:
    """An exclusive advisory lock (``fcntl.flock``) on ``<run>/.lock``, held while a process writes the
    run. The kernel releases it when the process ends in any way, so a stale lock never blocks a
    resume; the file stays and names the last holder."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def take(cls, folder: Path) -> "RunLock":
        """Lock ``folder`` or raise :class:`RunFolderError` naming the holder's pid and host."""
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err = _in_use(folder, fd)
            os.close(fd)
            raise err from None
        os.ftruncate(fd, 0)
        os.write(fd, f"attncnn pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        return cls(fd)

    def release(self) -> None:
        os.close(self.fd)         # closing the descriptor drops the flock

    @staticmethod
    def probe(folder: Path) -> None:
        """Raise as :meth:`take` if a live process holds ``folder``'s lock; otherwise change nothing. The
        probe asks for a *shared* lock, so two processes probing at once do not see each other as a trainer."""
        path = folder / LOCK_FILE
        if not path.is_file():
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(folder, fd) from None
        finally:
            os.close(fd)          # also drops the shared lock


def _holder(fd: int) -> str:
    """The line naming the lock's holder (pid and host). A holder that took the lock an instant ago
    writes its line just after: an empty file is read again for up to :data:`_HOLDER_WAIT` seconds."""
    deadline = time.monotonic() + _HOLDER_WAIT
    while True:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = os.read(fd, 256).decode("utf-8", "replace").strip()
        if holder or time.monotonic() >= deadline:
            return holder or "another process"
        time.sleep(0.02)


def _in_use(folder: Path, fd: int) -> RunFolderError:
    """The error for a folder whose lock another process holds; ``fd`` reads the holder's line."""
    holder = _holder(fd)
    return RunFolderError(f"run folder {folder} is in use: {holder} is training in it. Wait for that run to "
                          "finish or stop it (Ctrl-C / kill: it saves a checkpoint) before resuming, or "
                          "choose another --out folder")
