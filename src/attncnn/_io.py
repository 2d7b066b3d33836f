"""Atomic file writes shared by every part of the package.

A crash or a full disk during a write must leave the previous file intact, so every
file the package produces is written to a temporary file in the same folder and then
moved over the destination with :func:`os.replace` (atomic on POSIX and Windows).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_write_json"]


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; move it onto ``dest`` if the block succeeds.

    The temporary file lives in the same folder so that the final rename never crosses a
    file system. If the block raises, the temporary file is removed and ``dest`` is untouched.

    Raises:
        OSError: if the folder is not writable (the message names the folder).
    """
    dest = Path(dest)
    folder = dest.parent
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix + ".tmp", dir=folder)
    except OSError as err:
        raise OSError(err.errno, f"cannot write into {folder}: {err.strerror}; "
                                 "choose a writable output folder") from err
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes, *, shared: bool = False) -> None:
    """Write ``data`` to ``dest`` atomically (temp file in the same folder, fsync, rename).

    The file is private to the user (mode 0600, from :func:`tempfile.mkstemp`) unless ``shared``,
    which gives it the mode a plain ``open()`` would: 0666 less the umask (a file meant to be
    handed to others, such as the viewer page).
    """
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if shared:
            umask = os.umask(0)       # the only way to read the umask is to set it
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)


def atomic_write_text(dest: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``dest`` atomically."""
    atomic_write_bytes(dest, text.encode("utf-8"))


def atomic_write_json(dest: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``dest`` atomically."""
    atomic_write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")
