"""A training run's output folder.

Layout::

    <run>/config.json            resolved configuration (atomic write)
    <run>/metrics.jsonl          one JSON object per epoch (atomic rewrite per epoch)
    <run>/tb/                    TensorBoard event files (every numeric metric, step = epoch)
    <run>/checkpoints/<name>.safetensors   "best", "last", "epoch_0010", ...
    <run>/finished.json          written at the very end; a run without it is unfinished
    <run>/.lock                  locked while a process trains in the folder; names that process

Every file except the TensorBoard events is written atomically (temporary file in the same folder,
fsync, rename), so a crash or a full disk during a write leaves the previous version intact; a
failed write raises :class:`RunFolderError` naming the file, the cause and the fix.

This replaces the reference's ``config.yaml`` + ``*.checkpoint`` pickles + TensorBoardX folder
(``train.py``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .._io import atomic_write_bytes, atomic_write_json, atomic_write_text
from .errors import RunFolderError
from .lock import LOCK_FILE, RunLock

__all__ = ["RunFolderError", "RunFolder", "write_error_message"]

log = logging.getLogger(__name__)

_MODES = ("new", "overwrite", "resume", "read")
_PERIODIC = re.compile(r"^epoch_(\d+)\.safetensors$")


_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def write_error_message(path: str | os.PathLike[str], err: OSError) -> str:
    """One sentence for a failed write of ``path``: what failed, why, and the fix.

    A full disk (ENOSPC, EDQUOT) asks to free space or choose another ``--out``; a read-only or
    permission-denied folder asks to fix permissions or choose another ``--out``. Both state that
    the previous files are intact (every write is atomic).
    """
    path = Path(path)
    reason = os.strerror(err.errno) if err.errno else str(err)
    if err.errno in _FULL:
        fix = (f"the disk holding {path.parent} is full: free some space there and continue with --resume, "
               "or start again with another --out folder")
    elif err.errno in _DENIED:
        fix = f"{path.parent} is not writable: fix its permissions or choose another --out folder"
    else:
        fix = "check the disk, or choose another --out folder"
    return f"cannot write {path} ({reason}); {fix}. The previous version of the file, if any, is intact"


class RunFolder:
    """A training run's output folder: config.json, metrics.jsonl, tensorboard events (tb/), checkpoints/.

    Args:
        path: the folder.
        mode:
            * ``"new"``: create it; refuse an existing non-empty folder (use resume or overwrite);
            * ``"overwrite"``: delete the previous contents (refused for the home folder, the current
              folder and its parents, so a slip such as ``--out . --overwrite`` cannot wipe them);
            * ``"resume"``: it must exist and hold ``config.json``;
            * ``"read"``: it must exist; nothing is written (evaluate an existing run).

            The three writing modes hold an exclusive lock on the folder until :meth:`close`; a
            folder locked by a live process is refused before its contents are looked at
            (:class:`RunFolderError`: in use, naming its pid and host). ``"read"`` takes no lock.

    Raises:
        ValueError: unknown ``mode``.
        RunFolderError: the folder is missing/not a folder/not writable/not creatable, or the mode's
            precondition fails; the message names the path and the fix.
    """

    def __init__(self, path: str | os.PathLike[str], *, mode: str) -> None:
        if mode not in _MODES:
            raise ValueError(f"unknown run folder mode {mode!r}; choose one of {', '.join(_MODES)}")
        self.path = Path(path)
        self.mode = mode
        self._writer: Any = None
        self._tb_unavailable = False
        self._lock: RunLock | None = None
        p = self.path
        if p.exists() and not p.is_dir():
            raise RunFolderError(f"run folder {p} exists but is not a folder; choose another output path")
        if mode == "read":
            if not p.is_dir():
                raise RunFolderError(f"run folder {p} does not exist; check the path")
            return
        if p.is_dir():
            # A live trainer's folder is refused as in use before any check of its contents: a
            # process started at the same moment as that trainer finds its first files, and being
            # told to --resume a folder that another process holds would only be refused again.
            self.check_not_in_use(p)
        if mode == "resume":
            _check_resumable(p)
        elif mode == "new":
            if p.is_dir() and any(entry.name != LOCK_FILE for entry in p.iterdir()):
                raise RunFolderError(f"run folder {p} already exists and is not empty; use --resume to continue "
                                     "it, --overwrite to replace it, or choose another output folder")
        elif mode == "overwrite" and p.is_dir():
            resolved, cwd = p.resolve(), Path.cwd().resolve()
            if resolved == Path.home().resolve() or resolved == cwd or resolved in cwd.parents:
                raise RunFolderError(f"refusing to overwrite {p}: it is the home folder, the current folder or "
                                     "one of its parents; choose a dedicated output folder")
        try:
            p.mkdir(parents=True, exist_ok=True)
            self._lock = RunLock.take(p)          # before anything is deleted or written
            if mode == "overwrite":
                for entry in p.iterdir():
                    if entry.name == LOCK_FILE:
                        continue
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                log.info("overwrote the previous contents of %s", p)
            fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=p)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            self.close()
            raise RunFolderError(f"cannot create or write the run folder {p}: {err.strerror or err}; choose a "
                                 "writable output folder (or fix its permissions)") from err

    # -- files --------------------------------------------------------------------------------

    def _check_writable(self, what: str) -> None:
        if self.mode == "read":
            raise RunFolderError(f"run folder {self.path} was opened read-only; cannot {what}")

    @contextlib.contextmanager
    def writing(self, path: str | os.PathLike[str]) -> Iterator[None]:
        """Turn an :class:`OSError` raised by the block (a write of ``path``) into a
        :class:`RunFolderError` whose message names the file, the cause and the fix
        (see :func:`write_error_message`).

        Raises:
            RunFolderError: folder opened in ``"read"`` mode, or the block raised OSError.
        """
        self._check_writable(f"write {path}")
        try:
            yield
        except OSError as err:
            raise RunFolderError(write_error_message(path, err)) from err

    def write_config(self, config: dict) -> None:
        """Write ``config.json`` atomically (indented, sorted keys).

        Raises:
            RunFolderError: folder opened in ``"read"`` mode or not writable.
            TypeError: ``config`` is not JSON serialisable.
        """
        with self.writing(self.path / "config.json"):
            atomic_write_json(self.path / "config.json", config)

    def read_config(self) -> dict:
        """Return the parsed ``config.json``.

        Raises:
            RunFolderError: missing or not valid JSON (the message names the file).
        """
        f = self.path / "config.json"
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise RunFolderError(f"{f} does not exist; {self.path} is not a started attncnn run") from err
        except (OSError, ValueError) as err:
            raise RunFolderError(f"cannot read {f}: {err}") from err
        if not isinstance(data, dict):
            raise RunFolderError(f"{f} does not hold a JSON object")
        return data

    def _tb_writer(self) -> Any:
        if self._writer is None and not self._tb_unavailable:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:  # tensorboard is a declared dependency; degrade if it is missing
                log.warning("TensorBoard logging disabled: %s", err)
                self._tb_unavailable = True
                return None
            self._writer = SummaryWriter(log_dir=str(self.path / "tb"))
        return self._writer

    def append_metrics(self, record: dict) -> None:
        """Add ``record`` as one JSON line to ``metrics.jsonl`` and log it to TensorBoard.

        The file is rewritten atomically with the new line at the end (a few hundred short lines at
        most), so a failed write leaves the previous records exactly as they were. Every int/float
        value (bools and non-numbers skipped) except ``"epoch"`` is written to TensorBoard with
        ``tag = key`` and ``step = record["epoch"]``. If the file's last line was cut short (a crash
        in an older version), a newline is inserted first so the new record stays on its own line.

        Raises:
            ValueError: ``record`` has no integer ``"epoch"``.
            TypeError: ``record`` is not JSON serialisable.
            RunFolderError: folder opened in ``"read"`` mode or the write failed.
        """
        self._check_writable("append metrics")
        epoch = record.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ValueError(f"a metrics record needs an integer 'epoch' entry, got {epoch!r}")
        line = (json.dumps(record) + "\n").encode("utf-8")
        f = self.path / "metrics.jsonl"
        with self.writing(f):
            try:
                previous = f.read_bytes()
            except FileNotFoundError:
                previous = b""
            if previous and not previous.endswith(b"\n"):
                previous += b"\n"
            atomic_write_bytes(f, previous + line)
        writer = self._tb_writer()
        if writer is not None:
            for key, value in record.items():
                if key == "epoch" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                writer.add_scalar(key, value, global_step=epoch)
            writer.flush()

    def read_metrics(self) -> list[dict]:
        """Return the records of ``metrics.jsonl`` in file order (``[]`` if there is none).

        Lines that are not valid JSON objects (a last line cut short by a crash) are skipped with a
        logged warning naming the line number.
        """
        f = self.path / "metrics.jsonl"
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        except OSError as err:
            raise RunFolderError(f"cannot read {f}: {err}") from err
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                log.warning("%s line %d is not a complete JSON record (truncated by a crash?); ignored", f, number)
                continue
            records.append(record)
        return records

    def rewind_metrics(self, epoch: int) -> int:
        """Drop the records of epochs after ``epoch`` (a crash between logging an epoch and saving
        its checkpoint would otherwise leave that epoch twice after a resume). Atomic rewrite.

        Returns the number of records dropped.
        """
        self._check_writable("rewind metrics")
        records = self.read_metrics()
        kept = [r for r in records if isinstance(r.get("epoch"), int) and r["epoch"] <= epoch]
        if len(kept) != len(records):
            with self.writing(self.path / "metrics.jsonl"):
                atomic_write_text(self.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        return len(records) - len(kept)

    # -- checkpoints --------------------------------------------------------------------------

    def checkpoint_path(self, name: str) -> Path:
        """``path/"checkpoints"/f"{name}.safetensors"``; the folder is created unless mode is ``"read"``.

        Raises:
            ValueError: ``name`` is empty or contains a path separator.
        """
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"invalid checkpoint name {name!r}")
        folder = self.path / "checkpoints"
        if self.mode != "read":
            try:
                folder.mkdir(exist_ok=True)
            except OSError as err:
                raise RunFolderError(f"cannot create {folder}: {err}") from err
        return folder / f"{name}.safetensors"

    def periodic_checkpoints(self) -> list[tuple[int, Path]]:
        """``(epoch, path)`` of every ``epoch_NNNN`` checkpoint, oldest epoch first."""
        folder = self.path / "checkpoints"
        if not folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _PERIODIC.match(p.name))]
        return sorted(found)

    def periodic_path(self, epoch: int) -> Path:
        """``checkpoints/epoch_NNNN.safetensors``: where the periodic checkpoint taken after ``epoch``
        whole epochs goes (at least four digits; :meth:`periodic_checkpoints` reads the number back,
        so ``epoch_10000`` sorts after ``epoch_9999``)."""
        return self.checkpoint_path(f"epoch_{epoch:04d}")

    def prune_periodic(self, keep: int) -> list[Path]:
        """Delete the periodic checkpoints beyond the newest ``keep`` (newest by epoch number, not by
        name or file time); ``keep <= 0`` keeps them all. ``best``, ``last`` and any other file are
        never touched. A periodic save is :meth:`periodic_path`, the write, then this.

        Returns:
            The deleted files, oldest first.

        Raises:
            RunFolderError: folder opened in ``"read"`` mode.
        """
        self._check_writable("delete old periodic checkpoints")
        if keep <= 0:
            return []
        periodic = self.periodic_checkpoints()
        deleted = []
        for old_epoch, old in periodic[:max(len(periodic) - keep, 0)]:
            try:
                old.unlink()
            except FileNotFoundError:
                continue
            log.debug("deleted old checkpoint %s (epoch %d)", old, old_epoch)
            deleted.append(old)
        return deleted

    def latest_checkpoint(self) -> Path | None:
        """``checkpoints/last.safetensors`` if it exists, else the newest periodic one, else ``None``."""
        last = self.path / "checkpoints" / "last.safetensors"
        if last.is_file():
            return last
        periodic = self.periodic_checkpoints()
        return periodic[-1][1] if periodic else None

    # -- end of run ---------------------------------------------------------------------------

    def mark_finished(self, summary: dict) -> None:
        """Write ``finished.json`` atomically; its presence marks the run as complete.

        Raises:
            RunFolderError: folder opened in ``"read"`` mode or not writable.
        """
        with self.writing(self.path / "finished.json"):
            atomic_write_json(self.path / "finished.json", _finite(summary))

    @property
    def finished(self) -> bool:
        """True when ``finished.json`` exists."""
        return (self.path / "finished.json").is_file()

    def close(self) -> None:
        """Flush and close the TensorBoard writer and release the folder's lock (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @staticmethod
    def check_not_in_use(path: str | os.PathLike[str]) -> None:
        """Fail at once if a live process trains in ``path`` (before a caller spends time loading
        data for a run it could not write); the lock itself is taken when the folder is opened.

        Raises:
            RunFolderError: naming the holder's pid and host.
        """
        try:
            RunLock.probe(Path(path))
        except OSError:
            pass        # an unreadable folder gets its own clear error when it is opened

    @staticmethod
    def resumable_config(path: str | os.PathLike[str]) -> dict:
        """``config.json`` of a run that ``mode="resume"`` would accept, read without taking its
        lock (every process of a torchrun job reads it; only rank 0 opens the folder to write).

        Raises:
            RunFolderError: the folder or its config.json is missing or unreadable.
        """
        _check_resumable(Path(path))
        return RunFolder(path, mode="read").read_config()

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r}, mode={self.mode!r})"


def _check_resumable(p: Path) -> None:
    if not p.is_dir():
        raise RunFolderError(f"cannot resume: run folder {p} does not exist; start a new run without --resume")
    if not (p / "config.json").is_file():
        raise RunFolderError(f"cannot resume: {p} holds no config.json, so it is not a started attncnn run; start a "
                             "new run (with --overwrite to replace the folder)")


def _finite(obj: Any) -> Any:
    """Replace NaN/inf floats by None so the summary is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
