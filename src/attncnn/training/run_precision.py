"""Numeric precision of a run: ``fp32``, or ``bf16`` mixed precision (autocast); the values of
``--precision`` and how ``auto`` is resolved on a device (the analysis commands' flag is
:func:`attncnn.training.options.add_precision_option`).

``bf16`` runs matrix products and convolutions in bfloat16 under :func:`torch.autocast`; the
parameters, the optimizer state, the attention scores and softmax (the layers compute them in
float32 themselves, because CPU autocast does not), LayerNorm (the transformer keeps its residual
stream in float32), the loss and the metric sums stay float32. ``auto`` picks ``bf16`` where the
device runs it fast: a CUDA GPU with bfloat16 support, or a CPU whose oneDNN kernels have
AVX512-BF16 or AMX instructions (measured on the 2-core AMD EPYC development machine: a 2048
matrix product at 112 GFLOP/s in fp32 and 377 GFLOP/s in bf16); ``fp32`` everywhere else.
"""

from __future__ import annotations

import contextlib
import logging

import torch

__all__ = ["PRECISIONS", "fast_bf16", "resolve_precision", "autocast", "running_at"]

log = logging.getLogger(__name__)

#: values of ``--precision``; ``auto`` is resolved to one of the others when a run starts
PRECISIONS = ("auto", "fp32", "bf16")


def fast_bf16(device: torch.device) -> bool:
    """True when ``device`` has bfloat16 matrix units: CUDA with bf16 support, or a CPU with
    AVX512-BF16 or AMX tiles (as oneDNN reports them through ``torch.cpu``)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_precision(name: str, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"`` for the ``--precision`` value ``name`` on ``device``.

    Raises:
        ValueError: ``name`` not in :data:`PRECISIONS`.
    """
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    if name == "auto":
        return "bf16" if fast_bf16(device) else "fp32"
    if name == "bf16" and not fast_bf16(device):
        log.warning("bf16 requested on %s, which has no bfloat16 matrix units: it will run, but likely slower "
                    "than fp32", device)
    return name


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context in which a forward pass runs at ``precision`` (``"fp32"``: no autocast).

    Raises:
        ValueError: ``precision`` is not ``"fp32"`` or ``"bf16"`` (resolve ``"auto"`` first).
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be 'fp32' or 'bf16' here (resolve 'auto' first), got {precision!r}")


def running_at(name: str, device: str | torch.device = "cpu") -> contextlib.AbstractContextManager:
    """:func:`autocast` of the ``--precision`` value ``name`` resolved for ``device``."""
    device = torch.device(device)
    return autocast(resolve_precision(name, device), device)
