"""Convolutional ("local") initialisation of attention layers: Theorem 1 at step 0.

A layer with N_h = K^2 heads gets one head per tap of a K x K kernel: head ``h = u*K + v`` serves
tap ``(u, v)`` with center ``Delta^(h) = ((u - K//2) d, (v - K//2) d)`` for dilation d, in tokens
(row, column), as :func:`torch.nn.functional.conv2d`'s taps (:func:`kernel_shifts`, which
:mod:`attncnn.theory` uses too).

:func:`local_init_` makes every head's positional score ``-alpha |delta - Delta^(h)|^2`` up to a
constant per query (paper eq. 9, Lemma 2; ConViT's local init, d'Ascoli et al. 2021, sec. 3.1);
each layer class writes its own ``local_init_``, with the shared coefficients of
:func:`axis_coefficients` and :func:`table_features`. :func:`conv_value_init_` writes a kernel into
the folded value matrix (Lemma 1), so that with a large alpha the layer *is* that convolution.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import InputError

if TYPE_CHECKING:
    from .base import GridAttention

__all__ = ["kernel_shifts", "conv_kernel_size", "local_init_", "conv_value_init_", "conv_initialize_",
           "axis_coefficients", "table_features"]


def kernel_shifts(kernel_size: int, dilation: int = 1, spatial_dims: int = 2) -> torch.Tensor:
    """The shifts of a kernel's taps in row-major tap order: ``(K^2, 2)`` (2-D) or ``(K, 2)`` (1-D).

    Tap ``(u, v)`` (row-major index ``u*K + v``, the head that serves it) reads the input at
    ``q + ((u - c) d, (v - c) d)`` with ``c = K // 2``, as :func:`torch.nn.functional.conv2d` does.
    In 1-D the row shift is 0. Units: tokens (pixels). float64, CPU.

    Raises:
        InputError: even or non-positive ``kernel_size``, non-positive ``dilation``.
    """
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise InputError(f"the kernel size must be odd and positive (its taps are centered on the query), "
                         f"got {kernel_size}")
    if dilation < 1:
        raise InputError(f"the dilation must be a positive integer, got {dilation}")
    offsets = (torch.arange(kernel_size, dtype=torch.float64) - kernel_size // 2) * dilation
    if spatial_dims == 1:
        return torch.stack([torch.zeros_like(offsets), offsets], dim=-1)
    rows, cols = torch.meshgrid(offsets, offsets, indexing="ij")
    return torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1)


def conv_kernel_size(num_heads: int, kernel_size: int | None = None) -> int:
    """The kernel size K of a convolutional init with ``num_heads`` heads (one head per tap).

    Args:
        num_heads: N_h.
        kernel_size: K, or None for ``sqrt(N_h)``.

    Raises:
        InputError: ``K^2 != N_h`` or K even (the message says which head counts work).
    """
    k = math.isqrt(num_heads) if kernel_size is None else kernel_size
    if k < 1 or k * k != num_heads or k % 2 == 0:
        if kernel_size is None:
            raise InputError(f"a convolutional init needs one head per tap of an odd K x K kernel (num_heads = K^2: "
                             f"1, 9, 25, ...), got num_heads={num_heads}; set num_heads to 9 (3x3) or 25 (5x5), "
                             "or use init='random'")
        raise InputError(f"a convolutional init needs one head per tap of an odd K x K kernel, got "
                         f"conv_kernel_size={kernel_size} with num_heads={num_heads}; set num_heads = "
                         f"conv_kernel_size^2 (K odd), or conv_kernel_size=None to take K = sqrt(num_heads)")
    return k


def axis_coefficients(centers: torch.Tensor, alpha: float) -> torch.Tensor:
    """``(N_h, 3)`` coefficients against the features ``(d^2, d, 1)`` of one axis whose dot product
    is ``-alpha (d - center)^2`` (Lemma 2 on one axis); ``centers`` ``(N_h,)`` in tokens."""
    return torch.stack([torch.full_like(centers, -alpha), 2 * alpha * centers, -alpha * centers.square()], dim=-1)


def table_features(max_size: int, like: torch.Tensor) -> torch.Tensor:
    """``(2*max_size - 1, 3)`` rows ``(d^2, d, 1)`` for the shifts ``d = -(max_size-1) .. max_size-1``
    of a learned per-axis table, in ``like``'s dtype and device."""
    d = torch.arange(-(max_size - 1), max_size, dtype=like.dtype, device=like.device)
    return torch.stack([d.square(), d, torch.ones_like(d)], dim=-1)


@torch.no_grad()
def local_init_(layer: GridAttention, *, alpha: float, dilation: int = 1) -> torch.Tensor:
    """Give head ``h`` of ``layer`` the positional score ``-alpha |delta - Delta^(h)|^2`` (+ a constant
    per query), ``Delta^(h)`` the h-th of :func:`kernel_shifts`.

    Args:
        layer: a quadratic (isotropic or full), learned, learned-content or GPSA layer with
            ``N_h = K^2`` heads, K odd.
        alpha: locality strength (> 0, inverse squared token distance). Peak probability of an
            interior query: 0.16 at alpha 0.5, 0.32 at 1, 0.62 at 2, 0.97 at 5 (one-hot as alpha -> inf).
        dilation: spacing of the shifts in tokens.

    Returns:
        The centers ``(N_h, 2)`` (float64, CPU), row-major taps.

    Raises:
        InputError: a layer without a positional term, ``N_h`` not the square of an odd number,
            alpha not positive and finite, or tables too narrow (learned: ``table_dim < 3``;
            learned-content: ``head_dim < 6``; the layer's own
            :meth:`~attncnn.layers.GridAttention.local_init_` says which).
    """
    if not (alpha > 0 and math.isfinite(alpha)):
        raise InputError(f"locality strength alpha must be positive and finite, got {alpha}")
    kernel = conv_kernel_size(layer.num_heads)
    shifts64 = kernel_shifts(kernel, dilation)
    dtype = layer.value.weight.dtype
    shifts = shifts64.to(device=layer.value.weight.device, dtype=dtype)
    layer.local_init_(shifts, alpha)
    return shifts64


@torch.no_grad()
def conv_value_init_(layer: GridAttention, kernel: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None) -> None:
    """Copy a convolution kernel's taps into the folded value matrix (Lemma 1).

    With heads as wide as the input (``value_in`` is None) head h owns input columns ``h*D:(h+1)*D``
    of ``value``, so ``value.weight[:, h*D:(h+1)*D] = kernel[:, :, u, v]`` for its tap ``(u, v)``
    (``h = u*K + v``) and ``value.bias = bias``. After :func:`local_init_` with a large alpha the layer
    output is ``conv2d(x, kernel, bias, padding=(K//2) d, dilation=d)`` wherever every tap is inside
    the grid (at the border the softmax renormalises over the keys that exist; pad with zero tokens
    and crop to match zero padding). GPSA layers equal it only through their positional part (weight
    ``g_h``); the content part adds ``(1 - g_h)`` of a content average.

    Args:
        layer: an attention layer with ``N_h = K^2`` heads and ``head_dim == dim``.
        kernel: ``(D_out, D, K, K)``; None draws one with :class:`torch.nn.Conv2d`'s default init
            (its bias too, unless ``bias`` is given).
        bias: ``(D_out,)``; None with a given kernel means no bias (0).

    Raises:
        InputError: ``head_dim != dim`` (a value projection: see ``attncnn.theory`` for narrow
            heads), ``N_h`` not the square of an odd K, or a kernel/bias of the wrong shape.
    """
    if layer.value_in is not None:
        raise InputError(f"value_init='conv' needs heads as wide as the input (head_dim == dim == {layer.dim}), "
                         f"got head_dim={layer.head_dim}; set head_dim=None or value_init='random'")
    k = conv_kernel_size(layer.num_heads)
    weight = layer.value.weight
    if kernel is None:
        conv = nn.Conv2d(layer.dim, layer.out_dim, k, device=weight.device, dtype=weight.dtype)
        kernel, bias = conv.weight, (conv.bias if bias is None else bias)
    expected = (layer.out_dim, layer.dim, k, k)
    if tuple(kernel.shape) != expected:
        raise InputError(f"the kernel must have shape (D_out, D, K, K) = {expected}, got {tuple(kernel.shape)}")
    if bias is not None and tuple(bias.shape) != (layer.out_dim,):
        raise InputError(f"the bias must have shape ({layer.out_dim},), got {tuple(bias.shape)}")
    taps = kernel.permute(2, 3, 0, 1).reshape(k * k, layer.out_dim, layer.dim)     # tap u*K+v -> (D_out, D)
    weight.copy_(taps.permute(1, 0, 2).reshape(layer.out_dim, k * k * layer.dim))
    if bias is None:
        layer.value.bias.zero_()
    else:
        layer.value.bias.copy_(bias)


def conv_initialize_(layer: GridAttention, kernel: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     *, alpha: float, dilation: int = 1) -> torch.Tensor:
    """:func:`local_init_` then :func:`conv_value_init_`: the layer becomes the convolution
    ``(kernel, bias, dilation)`` up to Lemma 2's finite-alpha error (exact in floating point for
    ``alpha >= -ln(tiny)``: 87.4 in float32, 708.4 in float64; see ``attncnn.theory.default_alpha``).

    Returns:
        The centers ``(N_h, 2)``, float64. Raises: as the two functions.
    """
    shifts = local_init_(layer, alpha=alpha, dilation=dilation)
    conv_value_init_(layer, kernel, bias)
    return shifts
