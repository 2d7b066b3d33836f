"""Which dtype attention computes in under mixed precision (autocast or half-precision tensors).

The softmax computes in at least float32; the products that mix value vectors run in the dtype
autocast chooses. Content attention's ``"explicit-half"`` path lets the softmax write its
probabilities in that dtype; position-only maps stay float32. The helpers here tell whether
autocast is on for a device and in which dtype, so that layers cast once, explicitly.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["autocast", "autocast_dtype", "autocast_off", "matmul_dtype", "score_dtype", "softmax_in"]

_HALF = (torch.float16, torch.bfloat16)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast gives matrix products on ``device``, or None when autocast is off there
    (or ``device`` is a type autocast does not know, such as ``meta``)."""
    kind = device.type
    try:
        if torch.is_autocast_enabled(kind):
            return torch.get_autocast_dtype(kind)
        return None
    except RuntimeError:                 # "unknown device type for autocast" (meta, ...)
        return None
    except TypeError:                    # torch < 2.4: no device_type argument
        if kind == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
        if kind == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        return None


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """A context that turns autocast off on ``device`` (a no-op context when it is off already), around
    position-only scores and softmaxes: small, batch-independent, so float32 costs little there,
    whereas autocast would run their matrix products in bf16."""
    if autocast_dtype(device) is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matrix products with ``x`` run in: autocast's dtype when autocast is on for ``x``'s
    device and would cast ``x`` (float32 or half inputs; autocast leaves float64 alone), else ``x.dtype``."""
    lower = autocast_dtype(x.device)
    if lower is not None and x.dtype in (torch.float32, *_HALF):
        return lower
    return x.dtype


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and softmax run in for parameters or products of ``dtype``: float32 for
    float16/bfloat16, else ``dtype`` unchanged (float32 stays float32, float64 stays float64)."""
    return torch.float32 if dtype in _HALF else dtype


def softmax_in(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax over the last dimension of ``scores`` (any shape), returned in ``dtype``, the dtype
    the value products run in (:func:`matmul_dtype`).

    Scores already in ``dtype`` go through one softmax that computes in float32 and writes ``dtype``
    directly, with autocast off around it (CUDA's autocast would write float32), so no float32 copy of
    the map is kept for the backward (the ``explicit-half`` paths). Other scores take a softmax in
    :func:`score_dtype`, then one cast.
    """
    if scores.dtype == dtype:
        # Autocast off: CUDA's autocast runs softmax in float32 and would write float32 probabilities
        # (and keep them for the backward); a bf16 input computes in float32 all the same.
        with autocast_off(scores.device):
            return torch.softmax(scores, dim=-1)
    return torch.softmax(scores, dim=-1, dtype=score_dtype(scores.dtype)).to(dtype)


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
