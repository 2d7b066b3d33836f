"""Speed measurements cached per machine: what a timing depends on, and a JSON file of choices.

A measured choice (which attention path, whether to compile) holds for one machine, torch version
and thread count, not for the run: :mod:`attncnn.training.path_choice` and
:mod:`attncnn.training.compile_choice` key their caches with :func:`machine_key` and keep them in
the data folder as small JSON files that a failed write never corrupts.
"""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path

import torch

from .._io import atomic_write_text

__all__ = ["cpu_name", "machine_key", "read_cache", "write_cache"]

log = logging.getLogger(__name__)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(device: torch.device) -> str:
    """CPU model (or GPU name), threads, torch version and device type: what a timing depends on."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return f"{name} | threads={torch.get_num_threads()} | torch {torch.__version__} | {device.type}"


def read_cache(path: Path) -> dict:
    """The cache at ``path`` as a dict; empty when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(path: Path, key: str, value) -> None:
    """Add ``key: value`` to the cache at ``path`` (atomically). A folder that cannot be written costs
    a re-measurement next time, nothing else: the failure is logged, not raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**read_cache(path), key: value}, indent=1, sort_keys=True) + "\n")
    except OSError as err:
        log.warning("could not cache a speed measurement in %s: %s", path, err)
