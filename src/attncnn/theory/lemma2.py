"""Lemma 2 in numbers: how far a finite-alpha quadratic head is from one-hot, and what that costs.

A quadratic head centered exactly on an integer shift Delta gives key ``k = q + delta`` the weight
``exp(-alpha |delta - Delta|^2)``; the target (delta = Delta) has weight 1, every other key lies on
the integer lattice at squared distance ``n_1^2 + n_2^2 >= 1`` from it (dilation does not change
this). Over the infinite lattice the weights sum to ``theta(alpha)^D`` with
``theta(alpha) = sum_{n in Z} exp(-alpha n^2)`` (D = 2 for images, 1 for sequences), so the
attention mass off the target is

    m(alpha) = 1 - theta(alpha)^(-D)  ~  2 D exp(-alpha)  as alpha -> infinity.

On a finite grid (padded or not) fewer keys compete, so ``m(alpha)`` bounds the off-target mass of
every query. Output error of head h at query q (the layer's flush of tiny probabilities to 0 only
removes off-target mass and keeps the bound):

    |sum_k p_k X_k W^(h) - X_t W^(h)| = |sum_{k != t} p_k (X_k - X_t) W^(h)| <= m(alpha) * 2 M_h,
    M_h = max_k ||X_k W^(h)||_inf   (max over the tokens of the attended grid and output channels),

and summing over heads, ``max |attention - conv| <= 2 m(alpha) sum_h M_h`` (from Lemma 2). The
bound falls like ``exp(-alpha)``; it ignores floating-point rounding, which dominates once
``m(alpha)`` is below the dtype's resolution (see :func:`~attncnn.theory.default_alpha`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InputError
from .construct import AttentionConv2d, kernel_shifts
from .extract import folded_value_matrices

__all__ = ["Lemma2Bound", "lattice_theta_tail", "off_target_mass", "lemma2_bound"]


def lattice_theta_tail(alpha: float) -> float:
    """``theta(alpha) - 1 = 2 sum_{n >= 1} exp(-alpha n^2)`` (float64, summed until negligible).

    Raises:
        InputError: ``alpha <= 0`` (the sum diverges) or not finite.
    """
    if not alpha > 0 or not math.isfinite(alpha):
        raise InputError(f"alpha must be positive and finite, got {alpha}")
    total, n = 0.0, 1
    while True:
        term = math.exp(-alpha * n * n)
        total += term
        if term <= total * 1e-17 or term == 0.0:
            return 2.0 * total
        n += 1


def off_target_mass(alpha: float, spatial_dims: int = 2) -> float:
    """Upper bound on the attention mass off a head's target key, ``m(alpha) = 1 - theta^-D`` (Lemma 2).

    Exact for a query whose neighbourhood is the whole lattice (interior of a large grid);
    larger than the true mass near a grid edge. Computed without cancellation:
    ``m = s (2 + s) / (1 + s)^2`` (D = 2) or ``s / (1 + s)`` (D = 1) with ``s = theta - 1``.

    Args:
        alpha: sharpness (inverse squared token distance), > 0.
        spatial_dims: 2 (images) or 1 (sequences).

    Returns:
        m in [0, 1).

    Raises:
        InputError: bad ``alpha`` or ``spatial_dims``.
    """
    s = lattice_theta_tail(alpha)
    if spatial_dims == 2:
        return s * (2.0 + s) / (1.0 + s) ** 2
    if spatial_dims == 1:
        return s / (1.0 + s)
    raise InputError(f"spatial_dims must be 1 or 2, got {spatial_dims}")


@dataclass
class Lemma2Bound:
    """Lemma 2 for one layer and one input.

    Attributes:
        alpha: per-head sharpness used (list, one per head).
        off_target_mass: per-head ``m(alpha)`` (list).
        head_scale: per-head ``M_h = max_k ||X_k W^(h)||_inf`` (output units).
        output_bound: ``2 sum_h m_h M_h``, a bound on ``max |attention - conv|`` (output units).
    """

    alpha: list[float]
    off_target_mass: list[float]
    head_scale: list[float]
    output_bound: float

    @property
    def max_off_target_mass(self) -> float:
        return max(self.off_target_mass)


@torch.no_grad()
def lemma2_bound(module: AttentionConv2d, x: torch.Tensor) -> Lemma2Bound:
    """Bound the output error of a convolution-emulating layer with finite alpha (Lemma 2), for a
    layer whose heads' centers sit exactly on their kernel shifts, as
    :func:`~attncnn.theory.attention_from_conv2d` builds them.

    Args:
        module: an :class:`~attncnn.theory.AttentionConv2d` or ``AttentionConv1d``.
        x: its input, ``(B, H, W, C_in)`` or ``(B, T, C_in)``.

    Returns:
        :class:`Lemma2Bound`; ``output_bound`` bounds ``max |module(x) - conv(x)|`` over every
        batch item, position and reproduced channel (``module.exact_channels``), up to
        floating-point rounding.

    Raises:
        InputError: bad alpha (see :func:`off_target_mass`), input width, or a head whose center
            is not its kernel shift.
    """
    if x.shape[-1] != module.in_channels:
        raise InputError(f"expected {module.in_channels} input channels, got shape {tuple(x.shape)}")
    shifts = kernel_shifts(module.kernel_size, module.dilation, spatial_dims=module.spatial_dims)
    centers = module.attention.centers.detach()
    if centers.shape != shifts.shape or not torch.equal(centers.to(shifts), shifts):
        raise InputError("Lemma 2's bound holds for heads centered on their kernel shifts, as attention_from_conv2d "
                         "builds them; this layer's centers have moved (e.g. trained): measure its error instead")
    alphas = module.alpha.detach().double().cpu().tolist()
    masses = [off_target_mass(a, module.spatial_dims) for a in alphas]
    w = folded_value_matrices(module.attention).to(x.dtype)                   # (N_h, C_in, C_out)
    # Zero padding tokens give X_k W = 0, which never raises the maximum (the construction sets
    # the value projection's bias to 0, so values stay linear in the tokens).
    tokens = x.reshape(-1, x.shape[-1])
    scales = [(tokens @ w[h]).abs().max().item() for h in range(w.shape[0])]
    bound = 2.0 * sum(m * s for m, s in zip(masses, scales))
    return Lemma2Bound(alphas, masses, scales, bound)
