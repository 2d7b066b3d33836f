"""The run folder as every process of a torchrun job sees it: rank 0 writes, every rank reads.

:class:`MainProcessRunFolder` mirrors the parts of :class:`~attncnn.runs.folder.RunFolder` the loop
uses, so that the loop calls one method everywhere and only rank 0 touches the disk; each write is
also a barrier that tells every process whether it failed (:meth:`Distributed.on_main`). With one
process it is the plain run folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Protocol, TypeVar

from .folder import RunFolder
from .machine_file import MACHINE_FILE, end_segment, start_segment
from .unstarted import discard_if_unstarted

T = TypeVar("T")

__all__ = ["MainProcessRunFolder", "MainProcess"]


class MainProcess(Protocol):
    """What the folder needs of the process group (:class:`attncnn.training.Distributed` is one):
    run a function on rank 0 only, as a barrier every process leaves knowing whether it failed."""

    def on_main(self, fn: Callable[[], T], what: str) -> T | None: ...


class MainProcessRunFolder:
    """A :class:`RunFolder` whose writes happen on rank 0 only; reads work on every rank. On ranks > 0
    the writes wait for rank 0 and raise if it failed. Use :meth:`open` rather than the constructor."""

    def __init__(self, folder: RunFolder, dist: MainProcess) -> None:
        self._folder, self._dist = folder, dist

    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str, dist: MainProcess) -> "MainProcessRunFolder":
        """Rank 0 opens ``path`` in ``mode`` (creating or wiping it as :class:`RunFolder` does); the
        others then open it read-only (the folder must be visible to them: same node or a shared
        file system).

        Raises:
            RunFolderError: as :class:`RunFolder` (on ranks > 0: that rank 0 failed).
        """
        folder = dist.on_main(lambda: RunFolder(path, mode=mode), f"open the run folder {path}")
        if folder is None:
            folder = RunFolder(path, mode="read")
        return cls(folder, dist)

    # -- reads: every rank ----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._folder.path

    def checkpoint_path(self, name: str) -> Path:
        return self._folder.checkpoint_path(name)

    def periodic_path(self, epoch: int) -> Path:
        return self._folder.periodic_path(epoch)

    def latest_checkpoint(self) -> Path | None:
        return self._folder.latest_checkpoint()

    def read_metrics(self) -> list[dict]:
        return self._folder.read_metrics()

    # -- writes: rank 0, agreed by all ----------------------------------------------------------

    def write_config(self, config: dict) -> None:
        self._dist.on_main(lambda: self._folder.write_config(config), "write config.json")

    def append_metrics(self, record: dict) -> None:
        self._dist.on_main(lambda: self._folder.append_metrics(record), "write metrics.jsonl")

    def rewind_metrics(self, epoch: int, record: dict | None = None) -> None:
        """On rank 0, make ``metrics.jsonl`` agree with the checkpoint a resume starts from
        (:meth:`RunFolder.rewind_metrics`: ``record`` is the checkpoint's record of ``epoch``)."""
        self._dist.on_main(lambda: self._folder.rewind_metrics(epoch, record), "rewind metrics.jsonl")

    def mark_finished(self, summary: dict) -> None:
        self._dist.on_main(lambda: self._folder.mark_finished(summary), "write finished.json")

    def write_checkpoint(self, path: Path, write: Callable[[], None]) -> None:
        """Call ``write()`` (which writes ``path``) on rank 0, turning an OSError into a
        :class:`RunFolderError` that names the file and the fix."""
        self._write(path, write, f"write the checkpoint {path}")

    def _write(self, path: Path, write: Callable[[], None], what: str | None = None) -> None:
        def main() -> None:
            with self._folder.writing(path):
                write()
        self._dist.on_main(main, what or f"write {path.name}")

    def prune_periodic(self, keep: int) -> None:
        """On rank 0, delete the periodic checkpoints beyond the newest ``keep``
        (:meth:`RunFolder.prune_periodic`)."""
        self._dist.on_main(lambda: self._folder.prune_periodic(keep), "delete old periodic checkpoints")

    def start_segment(self, segment: dict, machine: dict | None) -> None:
        """On rank 0, append this process run's ``segment`` to ``machine.json``
        (:func:`attncnn.runs.machine_file.start_segment`)."""
        self._write(self.path / MACHINE_FILE, lambda: start_segment(self.path, segment, machine))

    def end_segment(self, last_epoch: int, ended: str) -> None:
        """On rank 0, complete this process run's segment of ``machine.json``
        (:func:`attncnn.runs.machine_file.end_segment`)."""
        self._write(self.path / MACHINE_FILE, lambda: end_segment(self.path, last_epoch, ended))

    def discard_if_unstarted(self) -> bool:
        """On rank 0 (the process that opened the folder to write),
        :func:`~attncnn.runs.unstarted.discard_if_unstarted`; no barrier: it runs while an error or
        interrupt unwinds, which other ranks may not share."""
        return discard_if_unstarted(self._folder)

    def close(self) -> None:
        self._folder.close()
