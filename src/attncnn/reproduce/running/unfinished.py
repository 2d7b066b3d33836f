"""How far a started, unfinished run of a study got, for its report: epochs done, the newest test
accuracy, and what its epochs cost on each machine (the reason a run is still unfinished, e.g.
``learned-content-mini`` on two CPU cores). Such a run may have travelled between machines (the
repository's ``tools/ship.py`` readies it for committing); the same ``attncnn reproduce`` resumes it.
"""

from __future__ import annotations

import statistics

from ...runs import RunFolder
from .jobs import Job, job_state
from .machines import machine_segments, read_machine_file, report_segments, segment_text

__all__ = ["run_progress", "progress_text"]


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
    # machine.json's stretches of epochs (the loop writes them); older runs' epoch records name their machines
    segments = (report_segments((read_machine_file(job.folder) or {}).get("segments") or [])
                or machine_segments(records, precision=config.get("precision")))
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
