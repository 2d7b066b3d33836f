"""``python tools/ship.py ... --without-weights``: a study's finished runs shipped without their weights.

A model too large for the clone (``results/`` stays under 300 MB; the paper-width content model's
29.5 M parameters are 59 MB even in bfloat16) ships its records alone (:mod:`attncnn.runs.withheld`
says what the record holds and how the package's commands read it; :func:`withhold_weights` writes it).
Before its weights move out of the committed tree, what the report cannot measure again without
them is measured one last time and kept in the run's record: the attention per layer
(:func:`~attncnn.reproduce.reporting.table1.final_layer_metrics`) and the locality of every head
(:func:`~attncnn.reproduce.reporting.locality.run_locality`), as the report computes them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from trim import share_run_folder

from attncnn._io import atomic_write_json, file_sha256
from attncnn.analysis.runs import open_run
from attncnn.errors import InputError, MissingFileError
from attncnn.reproduce.reporting.locality import run_locality
from attncnn.reproduce.reporting.results import RunResult
from attncnn.reproduce.reporting.table1 import final_layer_metrics
from attncnn.reproduce.running.runner import Job, job_state, row_of
from attncnn.reproduce.studies import Study
from attncnn.runs import PREDICTIONS_FILE, WITHHELD_FILE, RunFolder, read_metadata, read_withheld
from attncnn.runs.withheld import KEYS

__all__ = ["presets_named", "withholdable", "withhold_jobs", "withhold_weights"]


def presets_named(study: Study, text: str, flag: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, each a preset of ``study``.

    Raises:
        InputError: an empty list, or a name that is not one of the study's presets (they are listed).
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in study.rows]
    if not names or unknown:
        raise InputError(f"{flag} takes presets of {study.name} ({', '.join(study.rows)}), got {text!r}")
    return names


def _withheld_already(job: Job) -> bool:
    return read_withheld(job.folder) is not None and not (job.folder / "checkpoints").exists()


def withholdable(jobs: Sequence[Job], presets: Sequence[str]) -> list[Job]:
    """The finished ``jobs`` of the rows ``presets`` names (a grid's variant rows, e.g.
    ``convit-mini-random``, by their own names) whose weights are still here.

    Raises:
        InputError: a job folder holding another run (from :func:`attncnn.reproduce.running.runner.job_state`).
    """
    return [job for job in jobs if row_of(job) in presets and job_state(job) == "finished"
            and not _withheld_already(job)]


def withhold_jobs(study: Study, out: Path, jobs: Sequence[Job], presets: Sequence[str], *,
                  weights_to: str | Path | None = None, data: str | None = None,
                  data_dir: str | None = None, note: str | None = None) -> list[tuple[Job, dict, Path]]:
    """Ship each finished run of ``presets`` without its weights: :func:`withhold_weights`
    with the command that trains it again and its attention per layer, its ``checkpoints/`` moved to
    ``<weights_to>/<its folder under out>/checkpoints`` (default ``withheld-weights/<study>``). Runs
    already withheld are left as they are.

    Args:
        out: the study's folder (``results/<study>``). data, data_dir: the test images of the
            attention per layer (default: each run's own data set).
        note: where the weights are, when that is not a folder beside the clone (kept in the record
            as ``weights_note``; the commands that refuse the run show it).

    Returns:
        ``(job, record, where the weights went)`` of each run withheld now.

    Raises:
        InputError: a run without its prediction record (checked for every run before any weights move).
    """
    targets = withholdable(jobs, presets)
    unrecorded = [job.folder for job in targets if not (job.folder / PREDICTIONS_FILE).is_file()]
    if unrecorded:
        raise InputError(f"{unrecorded[0]} has no {PREDICTIONS_FILE}: record what its weights predict before they go "
                         f"(attncnn evaluate {unrecorded[0]} --data <its data set> --predictions "
                         f"{unrecorded[0] / PREDICTIONS_FILE}); nothing was withheld")
    base = Path(weights_to or f"withheld-weights/{study.name}")
    done = []
    for job in targets:
        share_run_folder(job.folder)                # the record keeps the checkpoint's metadata: no local paths
        result = RunResult(job, open_run(job.folder))
        layers = final_layer_metrics(result, data=data, data_dir=data_dir)
        epochs = len(result.epoch_records)
        # into a new folder: in this one the run is finished, and the command would find nothing to do
        retrain = (f"attncnn reproduce {study.name} --only {row_of(job)} --seeds {job.seed} --data <its data set> "
                   f"--out <a new folder> ({epochs} epoch{'s' if epochs != 1 else ''}"
                   f"{', cell ' + job.cell if job.cell else ''}: {result.train_seconds / 3600:.2f} h of training and "
                   "testing on the machine machine.json names)")
        target = base / job.folder.relative_to(out) / "checkpoints"
        locality = run_locality(result, data=data, data_dir=data_dir)
        extra = {"final_layers": layers, "locality": locality} | ({"weights_note": note} if note else {})
        record = withhold_weights(job.folder, retrain=retrain, move_to=target, extra=extra)
        done.append((job, record, target))
    return done



def withhold_weights(folder: str | Path, *, retrain: str, move_to: str | Path, extra: dict | None = None) -> dict:
    """Ship the finished run ``folder`` without its weights: write :data:`WITHHELD_FILE` (about
    ``checkpoints/last.safetensors``), then move ``checkpoints/`` to ``move_to`` (nothing is
    deleted: the weights stay on this machine, outside what is committed). A folder already
    withheld is left as it is.

    Args:
        folder: a finished run folder with its ``last`` checkpoint and its prediction record.
        retrain: the command that trains the run again (shown wherever the weights are asked for).
        move_to: the folder ``checkpoints/`` becomes (it must not exist yet; its parents are made).
        extra: more of what the weights gave, kept in the record for reports that cannot measure it
            again (e.g. ``{"final_layers": [...]}``, the attention per layer); its keys must not be
            the record's own.

    Returns:
        The record written (or the one already there).

    Raises:
        InputError: an unfinished run (its checkpoint is needed to resume), or one without a
            prediction record (without the weights nothing could check its accuracy again; the
            message gives the command that records it), an empty ``retrain``, an ``extra`` key
            that is one of the record's own, or a ``move_to`` that exists.
        FileNotFoundError: no ``last`` checkpoint and no record of one.
    """
    folder, move_to = Path(folder), Path(move_to)
    if not retrain.strip():
        raise InputError("say how the withheld weights can be trained again (retrain=...): a run shipped without "
                         "its weights must name the command that makes them")
    clash = sorted(set(extra or {}) & set(KEYS))
    if clash:
        raise InputError(f"extra keys {clash} are the record's own ({', '.join(KEYS)}); name them otherwise")
    existing = read_withheld(folder)
    if existing is not None and not (folder / "checkpoints").exists():
        return existing
    run = RunFolder(folder, mode="read")
    if not run.finished:
        raise InputError(f"{folder} is not finished; only a finished run ships without its weights (an unfinished "
                         "one needs its checkpoint to resume)")
    last = run.checkpoint_path("last")
    if not last.is_file():
        raise MissingFileError(f"{folder} holds no checkpoints/{last.name} to withhold")
    if not (folder / PREDICTIONS_FILE).is_file():
        raise InputError(f"{folder} has no {PREDICTIONS_FILE}: record what its weights predict before withholding "
                         f"them (attncnn evaluate {folder} --data <its data set> --predictions "
                         f"{folder / PREDICTIONS_FILE})")
    if move_to.exists():
        raise InputError(f"{move_to} exists; the weights of {folder} go to a new folder (remove it or name another)")
    metadata = read_metadata(last)
    record = {"file": last.relative_to(folder).as_posix(), "bytes": last.stat().st_size, "sha256": file_sha256(last),
              "weights_dtype": str(metadata.get("weights_dtype") or "float32"), "metadata": metadata,
              "retrain": retrain.strip(), **(extra or {})}
    # the record first: a move cut short leaves both, and the weights still load (the record only
    # speaks where the checkpoint is missing); the same call again finishes the move
    atomic_write_json(folder / WITHHELD_FILE, record)
    move_to.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(folder / "checkpoints"), str(move_to))
    return record
