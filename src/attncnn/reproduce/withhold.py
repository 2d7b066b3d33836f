"""``attncnn reproduce ... --without-weights``: a study's finished runs shipped without their weights.

A model too large for the clone (``results/`` stays under 300 MB; the paper-width content model's
29.5 M parameters are 59 MB even in bfloat16) ships its records alone (:mod:`attncnn.runs.withheld`).
Before its weights move out of the committed tree, what the report cannot measure again without
them is measured one last time and kept in the run's record: the attention per layer
(:func:`~attncnn.reproduce.reporting.table1.final_layer_metrics`) and the locality of every head
(:func:`~attncnn.reproduce.reporting.locality.run_locality`), as the report computes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..analysis.runs import open_run
from ..errors import InputError
from ..runs import PREDICTIONS_FILE, read_withheld, withhold_weights
from .reporting.results import RunResult
from .reporting.locality import run_locality
from .reporting.table1 import final_layer_metrics
from .running.jobs import Job, job_state, row_of
from .running.ship import share_run_folder
from .studies import Study

__all__ = ["presets_named", "withhold_jobs"]


def presets_named(study: Study, text: str, flag: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, each a preset of ``study``.

    Raises:
        InputError: an empty list, or a name that is not one of the study's presets (they are listed).
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in study.presets]
    if not names or unknown:
        raise InputError(f"{flag} takes presets of {study.name} ({', '.join(study.presets)}), got {text!r}")
    return names


def _withheld_already(job: Job) -> bool:
    return read_withheld(job.folder) is not None and not (job.folder / "checkpoints").exists()


def withholdable(jobs: Sequence[Job], presets: Sequence[str]) -> list[Job]:
    """The finished ``jobs`` of the rows ``presets`` names (a grid's variant rows, e.g.
    ``convit-mini-random``, by their own names) whose weights are still here.

    Raises:
        InputError: a job folder holding another run (from :func:`~attncnn.reproduce.running.jobs.job_state`).
    """
    return [job for job in jobs if row_of(job) in presets and job_state(job) == "finished"
            and not _withheld_already(job)]


def withhold_jobs(study: Study, out: Path, jobs: Sequence[Job], presets: Sequence[str], *,
                  weights_to: str | Path | None = None, data: str | None = None,
                  data_dir: str | None = None, note: str | None = None) -> list[tuple[Job, dict, Path]]:
    """Ship each finished run of ``presets`` without its weights: :func:`attncnn.runs.withhold_weights`
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
