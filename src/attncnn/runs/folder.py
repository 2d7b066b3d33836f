"""A training run's output folder.

Layout::

    <run>/config.json            resolved configuration (atomic write)
    <run>/metrics.jsonl          one JSON object per epoch (atomic rewrite per epoch)
    <run>/tb/                    TensorBoard event files (every numeric metric, step = epoch)
    <run>/checkpoints/<name>.safetensors   "best", "last", "epoch_0010", ...
    <run>/finished.json          written at the very end; a run without it is unfinished
    <run>/.lock                  locked while a process trains in the folder; names that process

Every file except the TensorBoard events is written atomically, so a crash or a full disk leaves
the previous version intact; a failed write raises :class:`RunFolderError` naming the file, the
cause and the fix. (The reference writes ``config.yaml``, ``*.checkpoint`` pickles and a
TensorBoardX folder.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .._io import atomic_write_bytes, atomic_write_json, atomic_write_text
from ..errors import InputError
from .errors import RunFolderError, write_error_message
from .lock import LOCK_FILE, RunLock
from .records import epoch_of as _epoch_of, finite as _finite, record_of as _record_of

__all__ = ["RunFolderError", "RunFolder", "write_error_message"]

log = logging.getLogger(__name__)

_MODES = ("new", "overwrite", "resume", "read")
_PERIODIC = re.compile(r"^epoch_(\d+)\.safetensors$")


class RunFolder:
    """A training run's output folder: config.json, metrics.jsonl, tensorboard events (tb/), checkpoints/.

    Args:
        path: the folder.
        mode:
            * ``"new"``: create it; refuse an existing non-empty folder (use resume or overwrite);
            * ``"overwrite"``: delete the previous contents (refused for the home folder, the current
              folder and its parents);
            * ``"resume"``: it must exist and hold ``config.json``;
            * ``"read"``: it must exist; nothing is written.

            The three writing modes hold an exclusive lock on the folder until :meth:`close`; a
            folder locked by a live process is refused (naming its pid and host).

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
        self.created = False            #: whether this object made the folder (:mod:`attncnn.runs.unstarted`)
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
            self.check_new(p)
        elif mode == "overwrite" and p.is_dir():
            resolved, cwd = p.resolve(), Path.cwd().resolve()
            if resolved == Path.home().resolve() or resolved == cwd or resolved in cwd.parents:
                raise RunFolderError(f"refusing to overwrite {p}: it is the home folder, the current folder or "
                                     "one of its parents; choose a dedicated output folder")
        try:
            self.created = not p.exists()
            p.mkdir(parents=True, exist_ok=True)
            self._lock = RunLock.take(p)          # before anything is deleted or written
            if mode == "overwrite":
                empty_folder(p)
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
        """Add ``record`` as one JSON line to ``metrics.jsonl`` (atomic rewrite) and log it to TensorBoard.

        Every int/float value except ``"epoch"`` goes to TensorBoard with ``tag = key`` and
        ``step = record["epoch"]``. A last line cut short is dropped with a logged warning.

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
            head, _, last = previous.rpartition(b"\n")
            if last and _record_of(last.decode("utf-8", errors="replace")) is None:
                log.warning("%s line %d is not a complete JSON record (cut short by a crash?); dropped before "
                            "epoch %d's record", f, previous.count(b"\n") + 1, epoch)
                previous = head + b"\n" if head else b""
            elif last:
                previous += b"\n"                  # a complete last record without its newline
            atomic_write_bytes(f, previous + line)
        writer = self._tb_writer()
        if writer is not None:
            for key, value in record.items():
                if key == "epoch" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                writer.add_scalar(key, value, global_step=epoch)
            writer.flush()

    def _parsed_metrics(self, fate: str) -> tuple[list[dict], list[int]]:
        """``(records in file order, numbers of the lines that are not complete records)``; each of the
        latter logged as a warning that says its ``fate``."""
        f = self.path / "metrics.jsonl"
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return [], []
        except OSError as err:
            raise RunFolderError(f"cannot read {f}: {err}") from err
        lines = [(number, _record_of(line)) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        torn = [number for number, r in lines if r is None]
        for number in torn:
            log.warning("%s line %d is not a complete JSON record (cut short by a crash?); %s", f, number, fate)
        return [r for _, r in lines if r is not None], torn

    def read_metrics(self) -> list[dict]:
        """Return the records of ``metrics.jsonl`` in file order (``[]`` if there is none).

        Lines that are not valid JSON objects (a last line cut short by a crash) are skipped with a
        logged warning naming the line number.

        Raises:
            RunFolderError: the file exists but cannot be read.
        """
        return self._parsed_metrics("ignored")[0]

    def rewind_metrics(self, epoch: int, record: dict | None = None) -> int:
        """Make ``metrics.jsonl`` what a resume from a checkpoint taken after ``epoch`` whole epochs
        continues: each epoch up to ``epoch`` once, in order (atomic rewrite, only where something
        changes). Later epochs' records go (the run logs an epoch before it saves its checkpoint: a
        kill between the two leaves an epoch the resume trains again), so do lines cut short (with a
        warning); ``record``, the checkpoint's copy of epoch ``epoch``'s record, fills in where the
        file lacks it; an epoch recorded twice keeps its last record.

        Returns the number of complete records dropped.

        Raises:
            RunFolderError: folder opened in ``"read"`` mode, or the file cannot be read or written.
        """
        self._check_writable("rewind metrics")
        f = self.path / "metrics.jsonl"
        records, torn = self._parsed_metrics("dropped")
        by_epoch = {r["epoch"]: r for r in records if _epoch_of(r) is not None and 1 <= r["epoch"] <= epoch}
        if epoch >= 1 and epoch not in by_epoch:
            if record and _epoch_of(record) == epoch:
                by_epoch[epoch] = dict(record)
                log.warning("%s: epoch %d's record was missing (its line torn by a crash?); restored from the "
                            "checkpoint", f, epoch)
            elif records or torn:
                log.warning("%s: epoch %d's record is missing and the checkpoint holds no copy of it", f, epoch)
        kept = [by_epoch[e] for e in sorted(by_epoch)]
        if torn or kept != records:
            with self.writing(f):
                atomic_write_text(f, "".join(json.dumps(r) + "\n" for r in kept))
        return len(records) - len({id(r) for r in kept} & {id(r) for r in records})

    # -- checkpoints --------------------------------------------------------------------------

    def checkpoint_path(self, name: str) -> Path:
        """``path/"checkpoints"/f"{name}.safetensors"``; the folder is created unless mode is ``"read"``.

        Raises:
            InputError: ``name`` is empty or contains a path separator.
        """
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise InputError(f"invalid checkpoint name {name!r}")
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
        """Delete the periodic checkpoints beyond the newest ``keep`` (by epoch number); ``keep <= 0``
        keeps them all. ``best``, ``last`` and any other file are never touched.

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

    @property
    def locked(self) -> bool:
        """Whether this object holds the folder's lock (a writing mode, not yet closed)."""
        return self._lock is not None

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
        """Fail at once if a live process trains in ``path`` (before a caller loads data for a run it
        could not write).

        Raises:
            RunFolderError: naming the holder's pid and host.
        """
        try:
            RunLock.probe(Path(path))
        except OSError:
            pass        # an unreadable folder gets its own clear error when it is opened

    @staticmethod
    def check_new(path: str | os.PathLike[str]) -> None:
        """Refuse to start a new run in ``path`` when it holds anything but a lock file: what
        ``mode="new"`` checks, for a caller to run before it loads data for a run it could not write.

        Raises:
            RunFolderError: the folder exists and is not empty (the message names ``--resume``,
                ``--overwrite`` and another folder); a file at ``path``.
        """
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise RunFolderError(f"run folder {p} exists but is not a folder; choose another output path")
        if p.is_dir() and any(entry.name != LOCK_FILE for entry in p.iterdir()):
            raise RunFolderError(f"run folder {p} already exists and is not empty; use --resume to continue "
                                 "it, --overwrite to replace it, or choose another output folder")

    @staticmethod
    def resumable_config(path: str | os.PathLike[str]) -> dict:
        """``config.json`` of a run that ``mode="resume"`` would accept, read without taking its lock.

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


def empty_folder(p: Path, *, ignore_errors: bool = False) -> None:
    """Delete everything in ``p`` but its lock file (links themselves, never what they point to);
    ``ignore_errors``: skip what cannot be deleted."""
    for entry in p.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=ignore_errors)
            continue
        try:
            entry.unlink()
        except OSError:
            if not ignore_errors:
                raise


def _check_resumable(p: Path) -> None:
    if not p.is_dir():
        raise RunFolderError(f"cannot resume: run folder {p} does not exist; start a new run without --resume")
    if not (p / "config.json").is_file():
        raise RunFolderError(f"cannot resume: {p} holds no config.json, so it is not a started attncnn run; start a "
                             "new run (with --overwrite to replace the folder)")
