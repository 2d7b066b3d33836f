"""Speed measurements cached per machine: what a timing depends on, and a JSON file of choices.

A measured choice (which attention path, whether to compile) holds for one machine, torch version
and thread count, not for the run: :mod:`attncnn.training.path_choice` and
:mod:`attncnn.training.compile_choice` key their caches with :func:`machine_key` and keep them in
the data folder as small JSON files that a failed write never corrupts.

A cache is a file any user or tool may edit or damage, so it is read defensively
(:func:`read_cache`): a corrupt file, or an entry its owner's check finds wrong, is dropped with one
warning naming the file and the problem, and measured again; it never stops a run.
"""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path
from typing import Callable

import torch

from .._io import atomic_write_text

__all__ = ["cpu_name", "cpu_signature", "machine_key", "read_cache", "write_cache"]

log = logging.getLogger(__name__)

#: where Linux describes the CPU (a module attribute so that tests can point it at another file)
CPUINFO = Path("/proc/cpuinfo")
#: instruction-set flags that change which kernels run and how fast (x86: AVX2, AVX-512,
#: bfloat16 dot products, AMX tiles; Arm: SVE, bfloat16): CPUs sold under one name differ in them
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "sve", "bf16")
#: /proc/cpuinfo fields that name a CPU generation (x86 family/model/stepping; Arm implementer/part)
_GENERATION_FIELDS = (("cpu family", "family"), ("model", "model"), ("stepping", "stepping"),
                      ("CPU implementer", "implementer"), ("CPU part", "part"), ("CPU variant", "variant"))

#: Cache problems already reported by this process: a run reads a cache several times (training
#: and test-pass paths, then the write), and one warning per problem is enough.
_reported: set[tuple[str, str]] = set()


def _cpuinfo() -> dict[str, str]:
    """The first value of each ``/proc/cpuinfo`` field (``{}`` where the file is missing or unreadable)."""
    fields: dict[str, str] = {}
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_signature() -> str:
    """What tells CPUs of one marketing name apart: the generation fields of ``/proc/cpuinfo`` and
    the instruction-set flags among :data:`_ISA_FLAGS` it has, e.g.
    ``"family 25 model 1 stepping 1 isa=avx2"``; ``""`` where ``/proc/cpuinfo`` is missing."""
    info = _cpuinfo()
    parts = [f"{label} {info[field]}" for field, label in _GENERATION_FIELDS if info.get(field)]
    flags = info.get("flags", info.get("Features"))
    if flags is not None:
        present = set(flags.split())
        parts.append("isa=" + (",".join(f for f in _ISA_FLAGS if f in present) or "none"))
    return " ".join(parts)


def machine_key(device: torch.device) -> str:
    """CPU model and generation (or GPU name), threads, torch version and device type: what a timing
    depends on. The CPU's generation and instruction-set flags are part of it (:func:`cpu_signature`):
    a marketing name such as "AMD EPYC" covers CPUs with and without AVX-512 or bfloat16 units."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        signature = cpu_signature()
        name = f"{cpu_name()} ({signature})" if signature else cpu_name()
    return f"{name} | threads={torch.get_num_threads()} | torch {torch.__version__} | {device.type}"


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
