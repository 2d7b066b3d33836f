"""Trimming finished run folders to what is worth committing (``attncnn reproduce ... --trim``).

A trimmed folder keeps ``config.json``, ``metrics.jsonl``, ``finished.json``, ``machine.json`` and
``checkpoints/last.safetensors``, weights only (``attncnn evaluate``, ``inspect``, ``plot``,
``viewer`` and ``train --init-from`` work on it as on any run folder; the optimiser state, as large
again as the weights, only serves to resume, and a finished run is not resumed); ``best`` only when
it is another epoch than ``last``. Periodic checkpoints are kept, weights only, for the runs that
feed the figure of centres over epochs (paper Fig. 3), and deleted elsewhere. TensorBoard events
and the lock file go. A lean trim (the sample-efficiency grid's many cells) also drops ``best``.
Unfinished folders are never touched: they are still needed to resume.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Sequence

from ..training import RunFolder, load_checkpoint, write_checkpoint
from ..training.checkpoint import read_metadata
from .suites import Job, job_state

log = logging.getLogger("attncnn.reproduce")

__all__ = ["trim_job", "trim_jobs", "folder_bytes"]

_KEEP_FILES = {"config.json", "metrics.jsonl", "finished.json", "machine.json"}


def folder_bytes(path: str | Path) -> int:
    """Total size of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _weights_only(path: Path) -> None:
    """Rewrite a checkpoint without its optimiser state (about half the size; not resumable)."""
    ckpt = load_checkpoint(path)
    if ckpt.optimizer_state is not None:
        ckpt.optimizer_state = None
        write_checkpoint(path, ckpt)


def trim_job(job: Job, *, keep_epochs: bool, lean: bool = False) -> tuple[int, int]:
    """Trim one finished job's folder in place; returns its size in bytes before and after.

    Args:
        keep_epochs: keep the periodic checkpoints (weights only) instead of deleting them.
        lean: keep ``last`` alone, never ``best`` (a grid of many cells reports the last epoch).

    Raises:
        ValueError: the job is not finished (its folder is needed to resume), or holds another run.
    """
    if job_state(job) != "finished":
        raise ValueError(f"{job.label} is not finished; only finished runs are trimmed (the rest resume)")
    before = folder_bytes(job.folder)
    folder = RunFolder(job.folder, mode="read")
    for entry in job.folder.iterdir():
        if entry.is_dir() and entry.name != "checkpoints":
            shutil.rmtree(entry)
        elif entry.is_file() and entry.name not in _KEEP_FILES:
            entry.unlink()
    last, best = folder.checkpoint_path("last"), folder.checkpoint_path("best")
    same = best.exists() and last.exists() and read_metadata(best).get("epoch") == read_metadata(last).get("epoch")
    if best.exists() and (same or lean):
        best.unlink()                                    # the same weights twice, or not wanted
    for kept in (last, best):
        if kept.exists():
            _weights_only(kept)
    for _, path in folder.periodic_checkpoints():
        if keep_epochs:
            _weights_only(path)
        else:
            path.unlink()
    return before, folder_bytes(job.folder)


def trim_jobs(jobs: Sequence[Job], *, keep_epochs_of: set[tuple[str, int]],
              lean: bool = False) -> list[tuple[Job, int, int]]:
    """Trim every finished job; ``keep_epochs_of`` names the ``(preset, seed)`` whose periodic
    checkpoints stay, ``lean`` is passed to :func:`trim_job`. Returns ``(job, bytes before,
    bytes after)`` of each trimmed job."""
    done = []
    for job in jobs:
        if job_state(job) == "finished":
            before, after = trim_job(job, keep_epochs=(job.preset, job.seed) in keep_epochs_of, lean=lean)
            log.info("trimmed %s: %.1f MB -> %.1f MB", job.folder, before / 1e6, after / 1e6)
            done.append((job, before, after))
    return done
