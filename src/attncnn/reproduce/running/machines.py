"""Which machine trained each epoch of a study's run, and which epochs shared the CPU or GPU.

A run of a long study outlives a working session and may be continued on another machine
(``attncnn reproduce ...`` from a fresh clone). The training loop writes ``machine.json`` (a
segment per process run). The epoch records of ``metrics.jsonl`` may also carry, as the committed
runs' records do (written by the repository's own tools, ``tools/gpu_job.py``, and by earlier
versions of ``attncnn reproduce``):

* ``"machine"``: ``{"cpu": model name, "threads": torch threads, "torch": version, "device": ...}``
  (``"gpu"`` too on a GPU) of the process that finished the epoch (an epoch resumed mid-way from a
  checkpoint ran partly on the machine before);
* ``"load_average"``: the system's 5-minute load average when the epoch ended (runnable processes,
  this one's threads included), so that the report can say which epochs shared the CPU;
* ``"device_runs"`` (only from a job that trains several runs at once on one GPU,
  ``tools/gpu_job.py``): how many of the job's runs were training when the epoch began, this
  one included (a job's runs only ever stop, so that is the most that shared the GPU during the
  epoch); the load average cannot say it, since each such run keeps few of the machine's cores busy;
* ``"precision"`` (written by the training loop for every run): ``"fp32"`` or ``"bf16"``, the
  machine's choice for the process that trained the epoch (a bf16 run resumed on a CPU without bf16
  units continues in fp32);
* ``"compiled"`` (written by the training loop since resumed runs may change it): whether a
  ``torch.compile``d step trained the epoch.

:func:`run_segments` gives a run's stretches of epochs per machine, precision and compile setting:
``machine.json``'s (:mod:`attncnn.runs.machine_file`), else those of these records.
:func:`run_progress` says how far a started, unfinished run got: epochs done, the newest test
accuracy, and what its epochs cost on each machine (the reason a run is still unfinished).
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ...perf.machine import MACHINE_KEY
from ...runs import RunFolder
from ...runs.machine_file import MACHINE_FILE, read_machine_file
from .runner import Job, job_state

__all__ = ["MACHINE_FILE", "MACHINE_KEY", "LOAD_KEY", "PRECISION_KEY", "COMPILED_KEY", "DEVICE_RUNS_KEY",
           "machine_segments", "segment_text", "segments_text", "shared_epochs", "read_machine_file",
           "report_segments", "run_segments", "run_progress", "progress_text"]

#: the keys each epoch record gets beside MACHINE_KEY (:mod:`attncnn.perf.machine`)
LOAD_KEY, PRECISION_KEY, COMPILED_KEY = "load_average", "precision", "compiled"
#: the key a GPU job adds: the job's runs training on the device when the epoch began
DEVICE_RUNS_KEY = "device_runs"


def machine_segments(records: Sequence[dict], precision: str | None = None) -> list[dict]:
    """Consecutive epochs trained on the same machine at the same precision and compile setting:
    ``[{"epochs": [first, last], "machine": dict or None (not recorded), "precision": "fp32", "bf16"
    or None (not recorded)}, ...]`` in epoch order, from the records of ``metrics.jsonl``; a segment
    whose epochs recorded their compile setting also has ``"compiled": True or False``.

    Args:
        records: the run's epoch records.
        precision: the precision of records that name none (written before epochs recorded it: the
            run's own from ``config.json``, which such a run never changed on resuming).
    """
    return report_segments([{"epochs": [r["epoch"], r["epoch"]], "machine": r.get(MACHINE_KEY),
                             "precision": r.get(PRECISION_KEY, precision), COMPILED_KEY: r.get(COMPILED_KEY)}
                            for r in records if isinstance(r.get("epoch"), int)])


def segment_text(segment: dict) -> str:
    """``"AMD EPYC, 2 threads, torch 2.13.0+cpu, bf16 (epochs 1-30)"`` for one of :func:`machine_segments`
    (the GPU's name after torch's version on a GPU; the precision only where it was recorded:
    ``machine.json`` files written before say none; ``", compiled"`` after it where the epochs recorded
    a compiled step)."""
    machine, (first, last) = segment["machine"], segment["epochs"]
    text = "machine not recorded"
    if machine:
        threads = machine.get("threads", "?")
        text = (f"{machine.get('cpu', '?')}, {threads} thread{'' if threads == 1 else 's'}, "
                f"torch {machine.get('torch', '?')}" + (f", {machine['gpu']}" if machine.get("gpu") else ""))
    text += (f", {segment['precision']}" if segment.get("precision") else "") + \
        (", compiled" if segment.get(COMPILED_KEY) else "")
    return text + (f" (epoch {first})" if first == last else f" (epochs {first}-{last})")


def segments_text(segments: Sequence[dict]) -> str:
    """``"AMD EPYC, 2 threads, torch 2.13.0, bf16 (epochs 1-30); Intel Xeon, ..., fp32 (epochs 31-60)"``."""
    return "; ".join(segment_text(segment) for segment in segments)


def shared_epochs(records: Sequence[dict]) -> list[int]:
    """Epochs that shared their machine: other runs of a GPU job trained on the same GPU during
    the epoch (:data:`DEVICE_RUNS_KEY` above 1), or the recorded 5-minute load average exceeds the
    run's own torch threads by more than one, i.e. other work shared the CPU (an estimate: the load
    average lags by minutes)."""
    shared = []
    for record in records:
        load, machine = record.get(LOAD_KEY), record.get(MACHINE_KEY) or {}
        threads, runs = machine.get("threads"), record.get(DEVICE_RUNS_KEY)
        busy_cpu = isinstance(load, (int, float)) and isinstance(threads, int) and load > threads + 1
        if busy_cpu or (isinstance(runs, int) and runs > 1):
            shared.append(record["epoch"])
    return shared


def report_segments(segments: Sequence[dict]) -> list[dict]:
    """``machine.json``'s segments (or :func:`machine_segments`' of single epochs) as a report shows
    them: segments that finished no epoch left out, and consecutive ones on the same machine, at the
    same precision and compile setting, joined (a run resumed on the machine that started it is one
    stretch of epochs there)."""
    out: list[dict] = []
    for segment in segments:
        first, last = segment["epochs"]
        if last < first:
            continue
        same = out and all(out[-1].get(k) == segment.get(k) for k in ("machine", "precision", COMPILED_KEY))
        if same and out[-1]["epochs"][1] == first - 1:
            out[-1]["epochs"] = [out[-1]["epochs"][0], last]
            continue
        out.append({"epochs": [first, last], "machine": segment.get("machine"), "precision": segment.get("precision"),
                    **({} if segment.get(COMPILED_KEY) is None else {COMPILED_KEY: segment[COMPILED_KEY]})})
    return out


def run_segments(folder, records: Sequence[dict], precision: str | None = None) -> list[dict]:
    """Which epochs of the run in ``folder`` ran where: its ``machine.json``'s segments
    (:func:`report_segments`), else (no file, none in it, or a malformed one: :func:`read_machine_file`
    warns) those of its epoch ``records`` (:func:`machine_segments`, with ``precision``)."""
    segments = report_segments((read_machine_file(folder) or {}).get("segments") or [])
    return segments or machine_segments(records, precision=precision)


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
        InputError: the folder holds another run (from :func:`~attncnn.reproduce.running.runner.job_state`).
    """
    if job_state(job) != "interrupted":
        return None
    run = RunFolder(job.folder, mode="read")
    records = [r for r in run.read_metrics() if isinstance(r.get("epoch"), int)]
    evaluated = [r for r in records if "test_accuracy" in r]
    config = run.read_config()
    # machine.json's stretches of epochs (the loop writes them); older runs' epoch records name their machines
    segments = run_segments(job.folder, records, precision=config.get("precision"))
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
