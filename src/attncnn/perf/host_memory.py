"""Keep freed host memory for reuse, so that large CPU tensors do not page-fault on every step.

glibc's ``malloc`` serves large blocks with ``mmap`` and unmaps them when freed, and trims the top
of its heap; a training step frees and allocates the same large tensors every step, so each step
maps fresh pages that the kernel zero-fills on first touch (``docs/speed.md``).
:func:`reuse_freed_memory` sets ``M_MMAP_MAX = 0`` and ``M_TRIM_THRESHOLD = -1`` ("disables
trimming completely"; a finite threshold is at most 2 GiB, less than a large test pass frees), so
the second step reuses the first step's pages. The numbers computed do not change; the process
keeps its peak resident memory until it exits.

It changes the whole process, so the library never calls it on its own: the ``attncnn``
executable calls it at start-up for the commands that run models on the CPU, and so does the
benchmark harness; a Python caller calls it once, first (docs/python-api.md). :func:`heap_policy`
says which policy is in force. ``ATTNCNN_MALLOC=system`` keeps glibc's defaults. Elsewhere (macOS,
Windows, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

from ..errors import InputError

__all__ = ["reuse_freed_memory", "heap_policy", "ENV_VAR"]

log = logging.getLogger(__name__)

#: Environment variable: ``system`` keeps the C library's own allocation policy.
ENV_VAR = "ATTNCNN_MALLOC"

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: M_TRIM_THRESHOLD's value that disables trimming (mallopt(3))
_NO_TRIM = -1

_state: dict[str, str] = {}


def reuse_freed_memory() -> str:
    """Make glibc keep freed memory for reuse (see the module docstring) for the rest of the process;
    idempotent.

    Returns:
        What was done, for the log: ``"heap"`` (set now or earlier in this process), ``"system"``
        (``ATTNCNN_MALLOC=system``), or ``"unsupported"`` (not glibc, or ``mallopt`` refused a
        setting; nothing is changed then).

    Raises:
        InputError: ``ATTNCNN_MALLOC`` holds something other than ``heap`` or ``system``.
    """
    if "result" in _state:
        return _state["result"]
    choice = os.environ.get(ENV_VAR, "heap").strip().lower() or "heap"
    if choice not in ("heap", "system"):
        raise InputError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected 'heap' (keep freed memory for reuse, the "
                         "default) or 'system' (the C library's own policy)")
    result = choice if choice == "system" else _set_heap_policy()
    _state["result"] = result
    log.debug("host memory: %s", result)
    return result


def heap_policy() -> str:
    """The policy this process runs under, without changing it: what :func:`reuse_freed_memory`
    returned (``"heap"``, ``"system"`` or ``"unsupported"``), or ``"system"`` when it was never called."""
    return _state.get("result", "system")


def _set_heap_policy() -> str:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "unsupported"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "unsupported"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on error; the trim threshold first, so a refusal of the
    # second setting leaves only the harmless first one in place. -1 becomes SIZE_MAX inside glibc:
    # no free top is ever large enough to be trimmed.
    if mallopt(_M_TRIM_THRESHOLD, _NO_TRIM) != 1 or mallopt(_M_MMAP_MAX, 0) != 1:
        return "unsupported"
    return "heap"
