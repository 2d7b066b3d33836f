"""The temporary folders a download writes into (``<cache>/models/.download-*``), and the removal of
those whose download is gone.

A download writes into a new ``.download-<random>`` folder, renamed into place only when every
file matches the manifest, and holds an exclusive ``fcntl.flock`` on ``.download-<random>.lock``
while it writes (the kernel drops it when the process dies). Every download first removes the
folders whose lock nobody holds; a folder without a lock file is removed once it is older than
:data:`STALE_AFTER_SECONDS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator

__all__ = ["STAGING_PREFIX", "STALE_AFTER_SECONDS", "remove_stale_staging", "staging_folder"]

log = logging.getLogger(__name__)

#: the name every temporary download folder starts with
STAGING_PREFIX = ".download-"
#: age (seconds since its last change) after which a temporary folder without a lock file is removed
STALE_AFTER_SECONDS = 24 * 3600
_LOCK = ".lock"
#: a lock file without its folder is left alone this long (its download makes the folder just after it)
_YOUNG_LOCK_SECONDS = 60.0


def _age(path: Path) -> float:
    """Seconds since ``path`` last changed (0 where it cannot be read: treated as young)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _owner_gone(lock: Path) -> int | None:
    """An open descriptor holding ``lock``'s flock when no live process holds it (the caller closes
    it after removing what the lock guarded); None while its owner lives or the file is gone."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale_staging(root: Path) -> list[Path]:
    """Remove the temporary download folders under ``root`` that no live download writes; returns
    those removed (errors are ignored: a stale folder only costs disk space)."""
    removed: list[Path] = []
    try:
        entries = [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        if entry.name.endswith(_LOCK):
            # a lock whose folder is gone; a young one may be a download that has not made its folder yet
            if not entry.with_name(entry.name[:-len(_LOCK)]).exists() and _age(entry) > _YOUNG_LOCK_SECONDS:
                fd = _owner_gone(entry)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        entry.unlink()
                    os.close(fd)
            continue
        lock = entry.with_name(entry.name + _LOCK)
        if lock.exists():
            fd = _owner_gone(lock)
            if fd is None:
                continue                          # a live download is writing it
            try:
                shutil.rmtree(entry, ignore_errors=True)
                with contextlib.suppress(OSError):
                    lock.unlink()
            finally:
                os.close(fd)
        else:
            if _age(entry) < STALE_AFTER_SECONDS:
                continue                          # maybe a live download of a version without locks
            shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            log.info("removed %s, left by a download that was stopped", entry)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def staging_folder(root: Path) -> Iterator[Path]:
    """A new, empty ``root/.download-<random>`` folder, locked while the block runs and removed with its
    lock file afterwards (unless renamed into place).

    Raises:
        OSError: ``root`` is not writable (the caller names the cache and the fix).
    """
    remove_stale_staging(root)
    folder = root / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
    lock = folder.with_name(folder.name + _LOCK)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)        # a new file: at most a cleaner looking at it an instant holds it
        os.write(fd, f"attncnn download, pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        folder.mkdir()            # mode from the umask, as any folder the user makes
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(fd)
