"""Quadratic ("Gaussian") relative positional attention, paper eq. (9) and its generalisation.

Head h has a center of attention Delta^(h) in R^2 (``centers``, in token units) and a sharpness.
For a query q and key k with relative shift delta = k - q its score is

* isotropic (paper eq. 9, reference ``GaussianSelfAttention``):
  ``A = -alpha^(h) * |delta - Delta^(h)|^2`` with ``alpha = s^2 / 2`` for the learned spread ``s``
  (``spreads``, shape ``(N_h,)``; alpha about 0.5 at initialisation);
* full covariance (the paper's appendix): ``A = -1/2 (delta - Delta)^T Sigma^-1 (delta - Delta)`` with
  ``Sigma^-1 = S S^T`` for a learned ``S`` (``spreads``, shape ``(N_h, 2, 2)``).

These differ from the dot-product form of eq. (9) by a term constant in k, which the softmax
cancels; the squared distance is computed directly because it is better conditioned. The
probabilities are a discrete Gaussian centered on q + Delta^(h), renormalised over the keys inside
the grid (no padding), as in the reference code.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import InputError
from .autocast_rules import score_dtype
from .position_only import PositionalAttention
from .relative import axis_offsets, distinct_offsets

__all__ = ["QuadraticAttention"]


class QuadraticAttention(PositionalAttention):
    """Position-only multi-head attention with the quadratic relative encoding.

    Kinds ``"quadratic"`` (isotropic) and ``"quadratic-generalized"`` (``full_covariance=True``).

    Args:
        dim: token width D.
        num_heads: number of heads N_h (9 in the paper: one per shift of a 3x3 kernel).
        full_covariance: learn a full 2x2 ``Sigma^-1 = S S^T`` per head instead of one alpha.
        center_init_std: std of the center initialisation, per coordinate (reference: 2.0;
            the paper writes N(0, 2 I), i.e. std 1.41).
        spread_init_std: std of the noise on the spread initialisation ``s = 1 + N(0, std^2)``
            or ``S = I + N(0, std^2)`` (reference: 0.01).
        head_dim, out_dim, attn_drop, impl: see :class:`~attncnn.layers.GridAttention` and
            :class:`~attncnn.layers.PositionalAttention` (full covariance: no ``"separable"`` path).

    Parameters ``centers`` ``(N_h, 2)`` (row, column shift) and ``spreads`` (``(N_h,)`` or
    ``(N_h, 2, 2)``) take no weight decay (:meth:`no_weight_decay`), as in the reference optimiser.
    """

    KINDS = ("quadratic", "quadratic-generalized")
    CONFIG_KEYS = ("center_init_std", "spread_init_std")
    has_centers = True

    def __init__(self, dim: int, num_heads: int, *, full_covariance: bool = False,
                 center_init_std: float = 2.0, spread_init_std: float = 0.01, **kwargs) -> None:
        self.full_covariance = full_covariance         # before super(): its impl check reads the kind
        super().__init__(dim, num_heads, **kwargs)
        self.center_init_std = center_init_std
        self.spread_init_std = spread_init_std
        self.centers = nn.Parameter(torch.empty(num_heads, 2))
        shape = (num_heads, 2, 2) if full_covariance else (num_heads,)
        self.spreads = nn.Parameter(torch.empty(shape))
        self.reset_positional_parameters()

    @property
    def kind(self) -> str:
        return "quadratic-generalized" if self.full_covariance else "quadratic"

    @classmethod
    def kind_kwargs(cls, kind: str) -> dict:
        """``quadratic-generalized`` is this class with full-covariance heads."""
        return {"full_covariance": True} if kind == "quadratic-generalized" else {}

    @classmethod
    def separable_kind(cls, kind: str) -> bool:
        """Isotropic heads: ``-alpha |delta - Delta|^2`` is a row term plus a column term."""
        return kind == "quadratic"

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """``centers = shifts``; spreads ``s = sqrt(2 alpha)`` (alpha = s^2/2), or ``S = sqrt(2 alpha) I``
        for full covariance, so that ``Sigma^-1 = 2 alpha I`` gives the same score."""
        self.centers.copy_(shifts)
        spread = math.sqrt(2.0 * alpha)
        if self.full_covariance:
            eye = torch.eye(2, dtype=shifts.dtype, device=shifts.device)
            self.spreads.copy_(spread * eye.expand_as(self.spreads))
        else:
            self.spreads.fill_(spread)

    @torch.no_grad()
    def reset_positional_parameters(self) -> None:
        """Re-draw centers ~ N(0, center_init_std^2) and spreads ~ 1 (or I) + N(0, spread_init_std^2)."""
        self.centers.normal_(0.0, self.center_init_std)
        self.spreads.normal_(0.0, self.spread_init_std)
        if self.full_covariance:
            self.spreads.add_(torch.eye(2, dtype=self.spreads.dtype, device=self.spreads.device))
        else:
            self.spreads.add_(1.0)

    @property
    def alpha(self) -> torch.Tensor:
        """Sharpness alpha^(h) = s^2 / 2, ``(N_h,)`` (isotropic layers only; paper eq. 9)."""
        if self.full_covariance:
            raise AttributeError("alpha is defined for isotropic heads; use inverse_covariance")
        return self.spreads ** 2 / 2

    @property
    def inverse_covariance(self) -> torch.Tensor:
        """Sigma^-1 per head, ``(N_h, 2, 2)`` (isotropic heads: ``2 alpha I``)."""
        if self.full_covariance:
            return self.spreads @ self.spreads.transpose(-1, -2)
        eye = torch.eye(2, dtype=self.spreads.dtype, device=self.spreads.device)
        return (self.spreads ** 2)[:, None, None] * eye

    def no_weight_decay(self) -> set[str]:
        """Names of parameters the optimiser must not decay (reference: centers and spreads)."""
        return {"centers", "spreads"}

    def _score_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``centers`` and ``spreads`` in the score dtype (float16/bfloat16 parameters upcast to float32)."""
        dtype = score_dtype(self.centers.dtype)
        return self.centers.to(dtype), self.spreads.to(dtype)

    def grid_scores(self, height: int, width: int) -> torch.Tensor:
        """Scores ``(N_h, H*W, H*W)``: minus the (Mahalanobis) squared distance of delta to Delta^(h)
        (paper eq. 9, in token units); float32 for float16/bfloat16 parameters."""
        centers, spreads = self._score_parameters()
        # the score depends on the shift alone: computed once per distinct shift, then gathered
        # (S = (2H-1)(2W-1), 961 for 16x16 tokens instead of 65,536 pairs, forward and backward)
        shifts, index = distinct_offsets(height, width, centers.device, centers.dtype)  # (S, 2), (N, N)
        diff = shifts[None] - centers[:, None, :]                                 # (N_h, S, 2)
        if self.full_covariance:
            # (delta-Delta)^T S S^T (delta-Delta) = |S^T (delta-Delta)|^2 = |(delta-Delta) S|^2
            # (as a batch of (2W-1, 2) @ (2, 2) products, like the per-pair formula it replaced:
            # the same kernel, so the same rounding, bit for bit)
            rows = diff.view(diff.shape[0], 2 * height - 1, 2 * width - 1, 2)
            per_shift = -0.5 * (rows @ spreads[:, None]).square().sum(-1).flatten(1)     # (N_h, S)
        else:
            alpha = spreads ** 2 / 2
            per_shift = -alpha[:, None] * diff.square().sum(-1)
        n = height * width
        return per_shift.index_select(1, index.reshape(-1)).view(-1, n, n)

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column terms of isotropic heads (paper eq. 9 split by axis):
        ``row[h, i, k] = -alpha_h (k - i - Delta_h,0)^2`` ``(N_h, H, H)`` and
        ``col[h, j, l] = -alpha_h (l - j - Delta_h,1)^2`` ``(N_h, W, W)``, summing to
        :meth:`grid_scores` for query (i, j) and key (k, l).

        Raises:
            InputError: full-covariance heads (the off-diagonal of Sigma^-1 couples the axes).
        """
        if self.full_covariance:
            raise InputError("full-covariance quadratic heads are not separable (Sigma^-1's off-diagonal "
                             "couples rows and columns); use grid_probs")
        centers, spreads = self._score_parameters()
        alpha = (spreads ** 2 / 2)[:, None, None]                               # (N_h, 1, 1)
        terms = []
        for axis, length in enumerate((height, width)):
            shift = axis_offsets(length, centers.device).to(centers.dtype)        # (L, L): k - i
            terms.append(-alpha * (shift[None] - centers[:, axis, None, None]).square())
        return terms[0], terms[1]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", full_covariance={self.full_covariance}"
