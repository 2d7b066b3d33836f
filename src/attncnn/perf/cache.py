"""Measured choices cached per machine: a small JSON file of ``key: value`` entries that a failed
write never corrupts.

A measured choice (which attention path, whether to compile) holds for one machine, torch version
and thread count, not for the run: :mod:`attncnn.perf.paths` and :mod:`attncnn.perf.compiling` key
their entries with :func:`attncnn.perf.machine.machine_key` and keep the files in the data folder.
A cache is a file any user or tool may edit or damage, so it is read defensively
(:func:`read_cache`): a corrupt file, or an entry its owner's check finds wrong, is dropped with one
warning naming the file and the problem, and measured again; it never stops a run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from .._io import atomic_write_text

__all__ = ["read_cache", "write_cache"]

log = logging.getLogger(__name__)

#: Cache problems already reported by this process: a run reads a cache several times (training
#: and test-pass paths, then the write), and one warning per problem is enough.
_reported: set[tuple[str, str]] = set()


def _report(path: Path, problem: str) -> None:
    if (str(path), problem) not in _reported:
        _reported.add((str(path), problem))
        log.warning("%s: %s", path, problem)


def read_cache(path: Path, check: Callable[[str, object], str | None] | None = None) -> dict:
    """The valid entries of the cache at ``path``, as a dict.

    Args:
        path: the JSON file (an object of ``key: value`` entries).
        check: ``check(key, value)`` says what is wrong with an entry (a phrase), or None for a
            good one; None takes every entry.

    Returns:
        ``{}`` for a missing file. A file that cannot be read, is not JSON or not a JSON object is
        taken as empty, and an entry ``check`` rejects is left out, each with one logged warning
        naming the file and the problem (once per process): the choice is measured again and the
        next write replaces the bad entries.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        _report(path, f"ignoring the speed-measurement cache, unreadable ({type(err).__name__}: {err}); "
                      "its measurements are taken again and the file rewritten")
        return {}
    if not isinstance(data, dict):
        _report(path, f"ignoring the speed-measurement cache: it holds a JSON {type(data).__name__}, not an "
                      "object; its measurements are taken again and the file rewritten")
        return {}
    if check is None:
        return data
    good = {}
    for key, value in data.items():
        problem = check(key, value)
        if problem is None:
            good[key] = value
        else:
            _report(path, f"ignoring the cached entry {key!r}: {problem}; it is measured again and replaced")
    return good


def write_cache(path: Path, key: str, value, check: Callable[[str, object], str | None] | None = None) -> None:
    """Add ``key: value`` to the cache at ``path`` (atomically), keeping the entries ``check`` accepts
    (see :func:`read_cache`). A folder that cannot be written costs a re-measurement next time,
    nothing else: the failure is logged, not raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**read_cache(path, check), key: value}, indent=1, sort_keys=True) + "\n")
    except OSError as err:
        log.warning("could not cache a speed measurement in %s: %s", path, err)
