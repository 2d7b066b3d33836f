"""Atomic file writes shared by every part of the package.

A crash or a full disk during a write must leave the previous file intact, so every
file the package produces is written to a temporary file in the same folder and then
moved over the destination with :func:`os.replace` (atomic on POSIX and Windows).
"""

from __future__ import annotations

import contextlib
import json
import hashlib
import os
import secrets
from pathlib import Path
from typing import Any, Iterator

from .errors import OutputError

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "make_folders", "file_sha256"]


def make_folders(folder: str | os.PathLike[str]) -> Path:
    """Create ``folder`` and its parents (nothing if it exists) and return it as a Path.

    Raises:
        attncnn.errors.OutputError (an OSError): it cannot be created (the message names it and the fix).
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the folder {folder} ({err.strerror or err}); choose a writable output "
                          "folder") from err
    return folder


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; move it onto ``dest`` if the block succeeds.

    The temporary file lives in the same folder, so that the final rename never crosses a file
    system. If the block raises, the temporary file is removed and ``dest`` is untouched. The file
    gets the mode a plain ``open()`` would give it (0666 less the umask).

    Raises:
        attncnn.errors.OutputError (an OSError): the folder is not writable (the message names it),
            or the block failed with an OSError, e.g. a full disk (the message names ``dest``; the
            errno is kept).
    """
    dest = Path(dest)
    folder = dest.parent
    tmp = _create_temp(folder, prefix=f".{dest.name}.", suffix=suffix + ".tmp")
    try:
        mode = tmp.stat().st_mode & 0o7777
        yield tmp
        # Some writers replace the file instead of writing into it (safetensors >= 0.8 writes its
        # own private temporary file and renames it over ``tmp``): give it back the mode it had.
        if tmp.stat().st_mode & 0o7777 != mode:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError) and not isinstance(err, OutputError):
            # a full disk or a vanished folder mid-write is the user's to fix: one line naming the
            # file (an OutputError keeps the errno, so a run folder's own message still tells ENOSPC)
            raise OutputError(err.errno, f"cannot write {dest}: {err.strerror or err}; free some space or "
                                         "choose another output folder (the previous file, if any, is intact)",
                              str(dest)) from err
        raise


def _create_temp(folder: Path, prefix: str, suffix: str) -> Path:
    """Create a new empty file ``folder/<prefix><random><suffix>`` and return its path, with mode
    0666 less the umask (not :func:`tempfile.mkstemp`'s 0600, which would make every written file
    unreadable to the user's group).

    Raises:
        attncnn.errors.OutputError (an OSError): the folder is not writable (the message names it).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue                  # another writer drew the same name: draw again
        except OSError as err:
            raise OutputError(err.errno, f"cannot write into {folder}: {err.strerror}; "
                                     "choose a writable output folder") from err
        os.close(fd)
        return tmp
    raise FileExistsError(f"cannot create a temporary file in {folder}: 100 random names were all taken; "
                          f"remove the leftover {prefix}*{suffix} files there")


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``dest`` atomically (:func:`atomic_path`, with an fsync before the rename).

    Raises:
        OSError: if the folder is not writable (the message names the folder) or the write fails.
    """
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(dest: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``dest`` atomically."""
    atomic_write_bytes(dest, text.encode("utf-8"))


def atomic_write_json(dest: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``dest`` atomically."""
    atomic_write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks (the digest that downloads, the
    reference conversion and the shipped-model records check)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
