"""``machine.json``: how each machine ran a run, one segment per process run, beside the recipe.

``config.json`` is the recipe, the same wherever the run trains; how a machine ran it goes here.
The training loop (rank 0) writes it: :func:`start_segment` appends a segment when a process starts
or resumes the run, :func:`end_segment` completes it. Each write replaces the file atomically::

    {<the machine of the newest segment: date, cpu, cores, torch_threads, torch, python, device,
      gpu and cuda on a GPU (attncnn.perf.machine_info)>,
     "segments": [{"epochs": [first, last],        # epochs this segment finished (last < first: none)
                   "start": {"epoch": 3, "step": 40},   # where it started: epochs done, steps into the next
                   "machine": {"cpu", "threads", "torch", "device", "gpu"},
                   "device": "cuda:0", "precision": "bf16", "compiled": true,
                   "compile_mode": "default",           # compiled segments only: or "reduce-overhead"
                   "fused_optimizer": false,
                   "deterministic": false,
                   "attention_paths": {"train": [...per layer], "test": [...]},   # attention networks only
                   "ended": "running" | "finished" | "interrupted" | "failed" | "crashed"}, ...]}

A process that stops without completing its segment (SIGKILL, a power cut) leaves it
``"running"``; the next process that resumes the run closes it as ``"crashed"``.

Older files (written by ``attncnn reproduce`` when it finished a run) have segments of ``epochs``,
``machine``, ``precision`` and ``compiled`` only: :func:`read_machine_file`, the one reader, reads
both, its structure checked.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .._io import atomic_write_text

__all__ = ["MACHINE_FILE", "short_machine", "read_machine_file", "start_segment", "end_segment", "run_precision",
           "recorded_precision", "last_segment"]

log = logging.getLogger(__name__)

MACHINE_FILE = "machine.json"


def short_machine(info: dict) -> dict:
    """What identifies the machine of an epoch or a segment, from a :func:`attncnn.perf.machine_info`
    record: CPU model name, torch threads, torch version, device, and the GPU's name on a GPU."""
    out = {"cpu": info.get("cpu"), "threads": info.get("torch_threads"), "torch": info.get("torch"),
           "device": info.get("device")}
    if info.get("gpu"):
        out["gpu"] = info["gpu"]
    return out


def start_segment(folder: str | Path, segment: dict, machine: dict | None) -> None:
    """Append ``segment`` (the keys of the module's description but ``machine`` and ``ended``) to the
    run's ``machine.json``, marked ``"running"``, with ``machine`` (a
    :func:`attncnn.perf.machine_info` record, or None) as the file's top level and the segment's
    ``"machine"``. A damaged file is started afresh. A newest segment still ``"running"`` belongs to a
    process that died (the caller holds the folder's lock): it is closed as ``"crashed"``, its last
    epoch the one ``segment`` starts from; epochs it trained after its last checkpoint are trained
    again by the new segment.

    Raises:
        OSError: the file cannot be written.
    """
    info, segments = _segments(folder)
    if segments and segments[-1].get("ended") == "running":
        first = segments[-1]["epochs"][0]
        kept = (segment.get("start") or {}).get("epoch", segment["epochs"][0] - 1)
        segments[-1] = {**segments[-1], "epochs": [first, max(first - 1, kept)], "ended": "crashed"}
    segments.append({**segment, "machine": None if machine is None else short_machine(machine), "ended": "running"})
    _write(folder, {**(machine or {k: v for k, v in info.items() if k != "segments"}), "segments": segments})


def end_segment(folder: str | Path, last_epoch: int, ended: str) -> None:
    """Complete the newest segment of the run's ``machine.json``: ``last_epoch`` (the epochs done
    when it ended) and how it ended (``"finished"``, ``"interrupted"`` or ``"failed"``). Nothing
    happens where the file has no segment of this process (it was removed or damaged meanwhile).

    Raises:
        OSError: the file cannot be written.
    """
    info, segments = _segments(folder)
    if not segments or segments[-1].get("ended") != "running":
        return
    segments[-1] = {**segments[-1], "epochs": [segments[-1]["epochs"][0], last_epoch], "ended": ended}
    _write(folder, {**info, "segments": segments})


def _write(folder: str | Path, info: dict) -> None:
    atomic_write_text(Path(folder) / MACHINE_FILE, json.dumps(info, indent=1) + "\n")


def _segments(folder: str | Path) -> tuple[dict, list]:
    """``(the run's machine.json, its segments)``; ``({}, [])`` where there is none or it is damaged."""
    info = read_machine_file(folder) or {}
    return info, list(info.get("segments") or [])


def last_segment(folder: str | Path) -> dict | None:
    """The newest segment of the run's ``machine.json`` (None: no file, no segment, or a damaged file)."""
    segments = _segments(folder)[1]
    return segments[-1] if segments else None


def run_precision(folder: str | Path) -> str | None:
    """The precision the run trained at when it started (its first segment's, ``"fp32"`` or
    ``"bf16"``), or None where ``machine.json`` does not say (no file, one written before
    segments recorded it, or a value attncnn does not know: :func:`recorded_precision` gives it)."""
    precision = recorded_precision(folder)
    return precision if precision in ("fp32", "bf16") else None


def recorded_precision(folder: str | Path) -> str | None:
    """The precision the first segment of the run's ``machine.json`` records, as written (``"fp64"``
    from a hand-edited file too), or None where it records none."""
    segments = _segments(folder)[1]
    return segments[0].get("precision") if segments else None


#: (file, problem) that :func:`read_machine_file` has warned about in this process
_WARNED: set[tuple[str, str]] = set()


def read_machine_file(folder: str | Path) -> dict | None:
    """The run's ``machine.json`` (:data:`MACHINE_FILE`), its structure checked: None when the
    folder has none. A file that cannot be read or is not a machine record does not stop its reader:
    one logged warning names the file and the fix (restore it from git, or delete it), once per file,
    problem and process, and the reader gets ``{}``, a record that knows nothing.

    Raises nothing.
    """
    path = Path(folder) / MACHINE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        return _unreadable(path, f"cannot be read ({err})")
    try:
        info = json.loads(text)
    except ValueError as err:
        return _unreadable(path, f"is not JSON ({err})")
    problem = _machine_file_problem(info)
    return _unreadable(path, problem) if problem else info


def _machine_file_problem(info) -> str | None:
    """What makes ``info`` no machine record (see :func:`read_machine_file`), or None."""
    if not isinstance(info, dict):
        return f"holds a JSON {type(info).__name__}, not an object"
    for key in ("cpu", "torch", "gpu"):
        if info.get(key) is not None and not isinstance(info[key], str):
            return f"its {key!r} is not text"
    threads = info.get("torch_threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        return "its 'torch_threads' is not a whole number"
    segments = info.get("segments")
    if segments is None:
        return None
    if not isinstance(segments, list):
        return "its 'segments' is not a list"
    for segment in segments:
        epochs = segment.get("epochs") if isinstance(segment, dict) else None
        if (not isinstance(epochs, list) or len(epochs) != 2
                or not all(isinstance(e, int) and not isinstance(e, bool) for e in epochs)):
            return "its 'segments' are not all {\"epochs\": [first, last], \"machine\": ...}"
        if "machine" not in segment or not isinstance(segment["machine"], (dict, type(None))):
            return "a segment of its 'segments' names no machine object"
        if not isinstance(segment.get("precision"), (str, type(None))):
            return "a segment of its 'segments' has a precision that is not text"
    return None


def _unreadable(path: Path, problem: str) -> dict:
    if (str(path), problem) not in _WARNED:
        _WARNED.add((str(path), problem))
        log.warning("warning: %s: %s; the report is written without it (each epoch's machine from metrics.jsonl "
                    "where recorded, else unknown). Restore the file (from git, where the run is committed) or "
                    "delete it: the training rewrites it only when a run starts, resumes or stops", path, problem)
    return {}
