"""Numeric precision of a run: ``fp32``, or ``bf16`` mixed precision (autocast); the values of
``--precision`` and how ``auto`` is resolved on a device.

``bf16`` runs matrix products and convolutions in bfloat16 under :func:`torch.autocast`; the
parameters, the optimizer state, the attention scores and softmax (the layers compute them in
float32 themselves, because CPU autocast does not), LayerNorm (the residual stream stays float32),
the loss and the metric sums stay float32. ``auto`` picks ``bf16`` where the device runs it fast (a
CUDA GPU with bfloat16 support, or a CPU with AVX512-BF16 or AMX), ``fp32`` everywhere else, where
bf16 matrix products run far slower than fp32 (docs/speed.md).

A trained or resumed run is run at :func:`machine_precision`: its own precision, except that a
bf16 run becomes fp32 on a device without fast bf16 unless the user asks for bf16.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from ..errors import InputError
from ..layers.autocast_rules import autocast
from ..runs.config import PRECISIONS
from .machine import cpu_name

__all__ = ["PRECISIONS", "fast_bf16", "slow_bf16_reason", "resolve_precision", "machine_precision",
           "running_at"]

log = logging.getLogger(__name__)

#: oneDNN's instruction-set limits (``ONEDNN_MAX_CPU_ISA``) that leave its bfloat16 kernels on
_BF16_ISAS = frozenset({"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                        "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "DEFAULT", "ALL"})


def _isa_limit() -> str | None:
    """oneDNN's instruction-set limit from the environment when it keeps its bf16 kernels off, else None."""
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip()
    return limit if limit and limit.upper() not in _BF16_ISAS else None


def fast_bf16(device: torch.device) -> bool:
    """True when ``device`` has bfloat16 matrix units: CUDA with bf16 support, or a CPU with
    AVX512-BF16 or AMX tiles that oneDNN may use (an ``ONEDNN_MAX_CPU_ISA`` below
    ``AVX512_CORE_BF16`` keeps its kernels off them)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return _cpu_has_bf16_units() and _isa_limit() is None
    return False


def _cpu_has_bf16_units() -> bool:
    """The CPU has AVX512-BF16 or AMX tiles, whatever oneDNN is allowed to use."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def slow_bf16_reason(device: torch.device) -> str | None:
    """None where :func:`fast_bf16` holds for ``device``; else why bf16 is slow there, in words that
    name the CPU or GPU (for a log line, a skipped benchmark or a skipped test)."""
    if fast_bf16(device):
        return None
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)} has no bfloat16 support"
    if device.type == "cpu" and _isa_limit() is not None and _cpu_has_bf16_units():     # the limit holds them off
        return (f"CPU {cpu_name()}: oneDNN is limited to {_isa_limit()} (ONEDNN_MAX_CPU_ISA), below its bfloat16 "
                "kernels, so bf16 matrix products run far slower than fp32 there")
    if device.type == "cpu":
        return (f"CPU {cpu_name()} has no bfloat16 matrix units (AVX512-BF16 or AMX), so bf16 matrix products "
                "run far slower there than fp32 (about 1 against 100 GFLOP/s on an AVX2-only CPU)")
    return f"device {device} has no known fast bfloat16 path"


def resolve_precision(name: str, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"`` for the ``--precision`` value ``name`` on ``device``.

    Raises:
        InputError: ``name`` not in :data:`PRECISIONS`.
    """
    if name not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    if name == "auto":
        return "bf16" if fast_bf16(device) else "fp32"
    if name == "bf16" and not fast_bf16(device):
        log.warning("bf16 requested on %s, which has no bfloat16 matrix units: it will run, but likely slower "
                    "than fp32", device)
    return name


def machine_precision(stored: str | None, device: torch.device, requested: str | None = None, *,
                      what: str = "the run") -> str:
    """``"fp32"`` or ``"bf16"``: the precision to run a trained or resumed run at on ``device``.

    ``requested`` (an explicit ``--precision``) wins, resolved by :func:`resolve_precision` (``bf16``
    is obeyed, with a warning where it is slow). Without it the run's ``stored`` precision is kept
    (None: ``fp32``), except that ``bf16`` becomes ``fp32`` on a device without fast bf16 (one INFO
    line naming ``what``, the device and how to keep bf16).

    Raises:
        InputError: ``stored`` or ``requested`` not in :data:`PRECISIONS`.
    """
    if requested is not None:
        return resolve_precision(requested, device)
    stored = "fp32" if stored is None else stored
    if stored not in PRECISIONS:
        raise InputError(f"{what} stores precision {stored!r}, not one of {', '.join(PRECISIONS)}; pass --precision "
                         "fp32 or bf16")
    if stored == "bf16":
        reason = slow_bf16_reason(device)
        if reason is not None:
            log.info("%s trained in bf16; running it in fp32 here: %s. Pass --precision bf16 to run it in bf16 "
                     "anyway", what, reason)
            return "fp32"
    return resolve_precision(stored, device)



def running_at(name: str, device: str | torch.device = "cpu") -> contextlib.AbstractContextManager:
    """:func:`autocast` of the ``--precision`` value ``name`` resolved for ``device``."""
    device = torch.device(device)
    return autocast(resolve_precision(name, device), device)
