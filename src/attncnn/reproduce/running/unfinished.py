"""Unfinished runs that travel: shipped for ``git add`` mid-way, resumed on another machine.

A long suite outlives a working session. When work stops, ``attncnn reproduce <suite> --ship``
prepares the suite folder for committing: finished runs are trimmed as ``--trim`` does
(:mod:`.ship`), and each unfinished run folder is reduced by :func:`ship_unfinished` to what
resuming needs:

* ``config.json``, ``metrics.jsonl`` (and ``machine.json`` if any);
* the newest resumable checkpoint (``checkpoints/last.safetensors``, refreshed every
  ``checkpoint_every_steps`` steps by the mini recipe, else the newest periodic one) **with** its
  optimiser state, random states and running sums: the resumed run continues exactly there;
* ``checkpoints/best.safetensors``, weights only, when it holds another point of training;
* the starting weights its ``init_from`` names, where they are in its ``checkpoints/`` (a pruned
  model's fine-tune).

* its periodic checkpoints, weights only, where a figure of the study is drawn from them
  (``keep_epochs``: the run whose centres a suite draws over the epochs, paper Fig. 3).

Other periodic checkpoints, TensorBoard events (``tb/``, rewritten by the resumed run) and the lock
file go, and the local paths the run records are replaced by file names
(:func:`~attncnn.reproduce.running.ship.share_run_folder`). From a fresh clone, the same
``attncnn reproduce <suite> --data <data set>`` resumes it: :func:`attncnn.runs.point_at_data`
first tells the shipped configuration where its data set is on this machine (the file name must
match), and
:func:`attncnn.perf.resume_plan` gives it this machine's device and chooses its attention paths here
(from this machine's cache, or measured).
"""

from __future__ import annotations

import logging
import shutil
import statistics
from pathlib import Path
from typing import Sequence

from ...errors import InputError
from ...runs import RunFolder, load_checkpoint
from ...runs.checkpoint import read_metadata
from .jobs import Job, job_state
from .machines import machine_segments, segment_text
from .ship import _weights_only, folder_bytes, share_run_folder

log = logging.getLogger("attncnn.reproduce")

__all__ = ["ship_unfinished", "ship_unfinished_jobs", "run_progress", "progress_text"]

_KEEP_FILES = {"config.json", "metrics.jsonl", "machine.json"}


def _position(path: Path) -> tuple[int, int]:
    meta = read_metadata(path)
    return int(meta.get("epoch", -1)), int(meta.get("step_in_epoch", 0))


def _starting_weights(folder: RunFolder) -> Path | None:
    """The checkpoint in the run's own ``checkpoints/`` that its ``init_from`` names (a pruned
    model's fine-tune keeps its starting weights there, ``attncnn prune --finetune-epochs``): part
    of the run's record, so it travels with it. None where the run starts elsewhere or from scratch."""
    init_from = folder.read_config().get("init_from")
    if not isinstance(init_from, str) or not init_from.endswith(".safetensors"):
        return None
    # by name: a shipped run records a bare file name (share_run_folder), a copied one the path of
    # its first folder; the trainer's own checkpoints (last, best, epoch_NNNN) are never starting weights
    stem = Path(init_from).stem
    if stem in ("last", "best") or any(path.stem == stem for _, path in folder.periodic_checkpoints()):
        return None
    path = folder.checkpoint_path(stem)
    return path if path.is_file() else None


def ship_unfinished(job: Job, *, keep_epochs: bool = False) -> tuple[int, int]:
    """Reduce an unfinished job's folder to what resuming it elsewhere needs (see the module's
    description), and with ``keep_epochs`` its periodic checkpoints as weights; returns its size in
    bytes before and after. Safe to run again.

    Raises:
        InputError: the job is finished (trim it instead) or was never started, or its newest
            checkpoint has no optimiser state (it could not be resumed).
        RunFolderError: a process is training the run now (its lock is held).
    """
    state = job_state(job)
    if state != "interrupted":
        raise InputError(f"{job.label} is {state}, not unfinished: only started, unfinished runs are shipped this way")
    RunFolder.check_not_in_use(job.folder)
    before = folder_bytes(job.folder)
    folder = RunFolder(job.folder, mode="read")
    resume_from = folder.latest_checkpoint()
    if resume_from is not None and load_checkpoint(resume_from).optimizer_state is None:
        raise InputError(f"{resume_from} holds no optimiser state, so {job.label} cannot be resumed from it")
    for entry in job.folder.iterdir():
        if entry.is_dir() and entry.name != "checkpoints":
            shutil.rmtree(entry)
        elif entry.is_file() and entry.name not in _KEEP_FILES:
            entry.unlink()
    best = folder.checkpoint_path("best")
    start = _starting_weights(folder)
    periodic = {path for _, path in folder.periodic_checkpoints()} if keep_epochs else set()
    for path in sorted((job.folder / "checkpoints").glob("*.safetensors")) if resume_from else []:
        if path in (resume_from, start):
            continue
        if (path == best and _position(best) != _position(resume_from)) or path in periodic:
            _weights_only(path)                      # another point of training: its weights stay
        else:
            path.unlink()
    if resume_from is None:
        log.warning("%s: no checkpoint yet; resumed, it starts again from its first epoch", job.label)
    share_run_folder(job.folder, unfinished=True)
    after = folder_bytes(job.folder)
    log.info("shipped unfinished %s: %.1f MB -> %.1f MB (resumes from %s)", job.folder, before / 1e6, after / 1e6,
             resume_from.name if resume_from else "the start")
    return before, after


def ship_unfinished_jobs(jobs: Sequence[Job], *, keep_epochs_of: set[tuple[str, int]] = frozenset()
                         ) -> list[tuple[Job, int, int]]:
    """:func:`ship_unfinished` on every started, unfinished job (finished and new ones are left
    alone), keeping the periodic checkpoints of the ``(preset, seed)`` runs ``keep_epochs_of``
    names; returns ``(job, bytes before, bytes after)`` of each."""
    return [(job, *ship_unfinished(job, keep_epochs=(job.preset, job.seed) in keep_epochs_of))
            for job in jobs if job_state(job) == "interrupted"]


def run_progress(job: Job) -> dict | None:
    """Where a started, unfinished run stands, from its ``config.json`` and ``metrics.jsonl``, so
    that a report can say how far it got and what its epochs cost on each machine (the reason a
    run is still unfinished, e.g. ``learned-content-mini`` on two CPU cores).

    Returns:
        None for a finished or never-started job; else ``{"epochs_done": last whole epoch (0 before
        the first), "epochs": the run's planned epochs, "test_accuracy": after the last whole epoch
        (fraction) or None, "segments": [{"epochs": [first, last], "machine": dict or None,
        "precision": str or None, "seconds_per_epoch": median training + evaluation seconds}, ...]}``,
        in epoch order (a segment per machine and precision). The
        test accuracy is the newest evaluated one (a run evaluating every k epochs has none in between).

    Raises:
        InputError: the folder holds another run (from :func:`~attncnn.reproduce.running.jobs.job_state`).
    """
    if job_state(job) != "interrupted":
        return None
    run = RunFolder(job.folder, mode="read")
    records = [r for r in run.read_metrics() if isinstance(r.get("epoch"), int)]
    evaluated = [r for r in records if "test_accuracy" in r]
    config = run.read_config()
    segments = machine_segments(records, precision=config.get("precision"))
    for segment in segments:
        first, last = segment["epochs"]
        seconds = [r.get("seconds", 0.0) + r.get("eval_seconds", 0.0) for r in records if first <= r["epoch"] <= last]
        segment["seconds_per_epoch"] = statistics.median(seconds)
    return {"epochs_done": records[-1]["epoch"] if records else 0, "epochs": config.get("epochs"),
            "test_accuracy": evaluated[-1]["test_accuracy"] if evaluated else None, "segments": segments}


def progress_text(progress: dict) -> str:
    """``"epoch 18 of 60, test acc. 61.54 %; <machine>, bf16 (epochs 1-5): 94 s/epoch; ..."`` for a report."""
    text = f"epoch {progress['epochs_done']} of {progress['epochs']}"
    if progress["test_accuracy"] is not None:
        text += f", test acc. {100 * progress['test_accuracy']:.2f} %"
    for segment in progress["segments"]:
        text += f"; {segment_text(segment)}: {segment['seconds_per_epoch']:.0f} s/epoch"
    return text
