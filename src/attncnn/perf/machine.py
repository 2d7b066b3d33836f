"""The machine at hand, described once: for machine.json, epoch records, benchmark files and the device.

:func:`machine_info` is the description every report and benchmark writes (CPU and GPU names,
cores, threads, library versions, date). :func:`resolve_device` turns ``--device`` into a
:class:`torch.device`. :func:`cpu_load` and :func:`busy_cpu` say whether other work shared the CPU
while a dry run timed its steps.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import torch

from ..training.components import resolve_device

__all__ = ["resolve_device", "cpu_name", "device_name", "machine_info", "MACHINE_KEY", "cpu_load",
           "busy_cpu"]

#: the key of an epoch record that names the machine that trained it
MACHINE_KEY = "machine"

#: where Linux describes the CPU (a module attribute so that tests can point it at another file)
CPUINFO = Path("/proc/cpuinfo")


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


def device_name(device: torch.device) -> str:
    """The device's type and its model, e.g. ``"cuda: NVIDIA H200"`` or ``"cpu: AMD EPYC"``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return f"{device.type}: {name}"


def machine_info(device: torch.device) -> dict:
    """CPU/GPU model, core and thread counts, library versions, date."""
    info = {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def cpu_load() -> float | None:
    """The CPU's 1-minute load average (runnable processes, this one included), or None where the
    system does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_cpu(loads: list[float | None], cores: int | None = None) -> str | None:
    """A warning when the CPU was busy with other work while a dry run timed its steps, else None
    (every process sharing the cores slows a step, so such an estimate is too long).

    Args:
        loads: 1-minute load averages sampled before and after the timing (:func:`cpu_load`).
        cores: CPU cores (default: ``os.cpu_count()``).

    Returns:
        The warning's text when the load from other processes (the largest sample less the one
        this process adds) exceeds half the cores.
    """
    cores = cores or os.cpu_count() or 1
    known = [load for load in loads if load is not None]
    if not known or max(known) - 1 <= cores / 2:
        return None
    return (f"warning: the CPU was busy while the steps were timed (load average {max(known):.1f} on {cores} "
            "cores, other processes included); the estimate can be several times the time the runs take "
            "alone. Run the dry run again when the machine is idle.")

