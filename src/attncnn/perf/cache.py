"""Measured choices cached per machine: one JSON file of typed records in the user's cache folder,
which a failed write never corrupts.

A measured choice (which attention path, whether compiling pays back) holds for one machine, torch
version and thread count and one run shape, not for one run or one data folder, so it is kept
outside both, in :func:`cache_dir`: ``$ATTNCNN_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/attncnn``,
else ``~/.cache/attncnn``, in the file :data:`CACHE_NAME`::

    {"format": 1, "records": [
      {"choice": "attention-path",
       "machine": {"cpu": "AMD EPYC", "cpu_signature": "family 23 ... isa=avx2", "gpu": null,
                   "threads": 2, "torch": "2.13.0", "device": "cpu"},
       "run": {"kind": "quadratic", "dim": 64, "heads": 9, ..., "mode": "train", "paths": [...]},
       "value": "separable", "measured": "2026-11-29"},
      ...]}

A record is found by equality of its typed ``choice``, ``machine``
(:func:`attncnn.perf.machine.machine_record`) and ``run`` fields, never by parsing a string; what a
``run`` holds and what a ``value`` may be is its owner's (:mod:`attncnn.perf.paths`,
:mod:`attncnn.perf.compiling`). The files of earlier versions (``attention-paths.json`` and
``compile-choice.json`` in the data folder, keyed by strings) are not read: their choices are
measured again once.

The file is one any user or tool may edit or damage, so it is read defensively
(:func:`read_records`): a file that is not JSON, not of this format, or a record its owner's check
finds wrong, is left out with one warning naming the file and the problem, and measured again; it
never stops a run. Writes are atomic, and a write that fails is logged, never raised.
"""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path
from typing import Callable

from .._cache_dir import user_cache_dir
from .._io import atomic_write_text

__all__ = ["CACHE_NAME", "FORMAT", "cache_dir", "cache_file", "typed", "read_records", "find_record",
           "write_record"]

log = logging.getLogger(__name__)

#: the file of measured choices in :func:`cache_dir`
CACHE_NAME = "speed-choices.json"
#: the version of the file's layout this code reads and writes
FORMAT = 1
#: ``check(run, value)``: what is wrong with a record of one choice (a phrase), or None
Check = Callable[[dict, object], "str | None"]

#: Cache problems already reported by this process: a run reads the cache several times (training
#: and test-pass paths, compile, then the writes), and one warning per problem is enough.
_reported: set[tuple[str, str]] = set()


def _report(path: Path, problem: str) -> None:
    if (str(path), problem) not in _reported:
        _reported.add((str(path), problem))
        log.warning("%s: %s", path, problem)


def cache_dir() -> Path:
    """The folder of measured choices: the user cache folder (:func:`attncnn._cache_dir.user_cache_dir`:
    ``$ATTNCNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/attncnn``, else ``~/.cache/attncnn``)."""
    return user_cache_dir()


def cache_file() -> Path:
    """The cache of measured choices, :data:`CACHE_NAME` in :func:`cache_dir`."""
    return cache_dir() / CACHE_NAME


def typed(value):
    """``value`` as JSON gives it back (tuples as lists, keys as strings; other objects by ``str``),
    so that a key built here compares equal to one read from the file."""
    return json.loads(json.dumps(value, default=str))


def _structure_problem(record) -> str | None:
    if not isinstance(record, dict):
        return f"a record must be an object, got {record!r}"
    for name, kind in (("choice", str), ("machine", dict), ("run", dict)):
        if not isinstance(record.get(name), kind):
            return f"its {name!r} must be a JSON {'string' if kind is str else 'object'}, got {record.get(name)!r}"
    if "value" not in record:
        return "it has no 'value'"
    return None


def _all_records(path: Path) -> list[dict]:
    """Every structurally sound record of the file (problems reported once each)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        _report(path, f"ignoring the speed-measurement cache, unreadable ({type(err).__name__}: {err}); "
                      "its measurements are taken again and the file rewritten")
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
        what = (f"a JSON {type(data).__name__}" if not isinstance(data, dict) else
                f"format {data.get('format')!r}" if data.get("format") != FORMAT else "no list of records")
        _report(path, f"ignoring the speed-measurement cache: it holds {what}, not format {FORMAT}'s "
                      "{\"format\", \"records\"}; its measurements are taken again and the file rewritten")
        return []
    good = []
    for record in data["records"]:
        problem = _structure_problem(record)
        if problem is None:
            good.append(record)
        else:
            _report(path, f"ignoring a cached record: {problem}; it is measured again and replaced")
    return good


def read_records(choice: str, check: Check, path: Path | None = None) -> list[dict]:
    """The valid records of ``choice`` in the cache (``path``; default :func:`cache_file`).

    Args:
        choice: the kind of record (``"attention-path"``, ``"compile"``).
        check: ``check(run, value)`` says what is wrong with a record of that kind, or None.

    Returns:
        Records ``{"choice", "machine", "run", "value", "measured"}``; ``[]`` for a missing file. A
        file that cannot be read, is not JSON or not of :data:`FORMAT` counts as empty, and a record
        ``check`` rejects is left out, each with one logged warning naming the file and the problem
        (once per process): the choice is measured again and the next write drops the bad record.
    """
    path = path or cache_file()
    good = []
    for record in _all_records(path):
        if record["choice"] != choice:
            continue
        problem = check(record["run"], record["value"])
        if problem is None:
            good.append(record)
        else:
            _report(path, f"ignoring a cached {choice} record of {json.dumps(record['run'], sort_keys=True)}: "
                          f"{problem}; it is measured again and replaced")
    return good


def find_record(choice: str, machine: dict, run: dict, check: Check, path: Path | None = None):
    """The cached value of ``choice`` for this ``machine`` and ``run`` (compared as :func:`typed`
    gives them), or None (see :func:`read_records`)."""
    machine, run = typed(machine), typed(run)
    for record in read_records(choice, check, path):
        if record["machine"] == machine and record["run"] == run:
            return record["value"]
    return None


def write_record(choice: str, machine: dict, run: dict, value, check: Check, path: Path | None = None) -> None:
    """Record ``value`` as the ``choice`` of this ``machine`` and ``run`` (replacing the one there
    was), keeping the other sound records and dropping those of ``choice`` that ``check`` rejects;
    written atomically. A folder that cannot be written costs a measurement next time, nothing
    else: the failure is logged, not raised."""
    path = path or cache_file()
    machine, run = typed(machine), typed(run)
    try:
        kept = [r for r in _all_records(path)
                if r["choice"] != choice or (check(r["run"], r["value"]) is None
                                             and (r["machine"], r["run"]) != (machine, run))]
        new = {"choice": choice, "machine": machine, "run": run, "value": typed(value),
               "measured": datetime.date.today().isoformat()}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"format": FORMAT, "records": [*kept, new]}, indent=1) + "\n")
    except OSError as err:
        log.warning("could not cache a speed measurement in %s: %s", path, err)
