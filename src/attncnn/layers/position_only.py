"""The position-only family: attention maps that depend on the grid size alone.

Quadratic (:mod:`~attncnn.layers.quadratic`) and learned position-only
(:mod:`~attncnn.layers.learned`) layers implement :meth:`PositionalAttention.grid_scores`;
their probabilities are computed once per forward and shared by the batch, so dropout on them uses
one mask for the whole batch, as the reference code does for these layers.

Paths (``impl``): ``"dense"`` applies the ``(N_h, N, N)`` map as one batch-shared product
(:func:`~attncnn.layers.mixing.mix_shared`); ``"folded"`` (heads as wide as the model) applies
the output map to the tokens first (:func:`~attncnn.layers.mixing.folded_mix`); ``"separable"``
(every head scores a row term plus a column term) applies a row factor and a column factor
(:func:`~attncnn.layers.mixing.separable_mix`); ``"auto"`` takes the separable path on grids
with ``H W >= 6 (H + W)`` (``benchmarks/results/attention-paths.md``).

Mixed precision (:mod:`~attncnn.layers.autocast_rules`): scores and softmax are computed with
autocast off, in float32 at least; only the products with the values run in autocast's dtype.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from .autocast_rules import autocast_off, matmul_dtype
from .base import GridAttention
from .mixing import flush_below, folded_mix, mix_explicit, mix_shared, separable_mix

__all__ = ["PositionalAttention"]


class PositionalAttention(GridAttention):
    """Base class of position-only attention (see the module docstring).

    Subclasses implement :meth:`grid_scores`; separable ones (:attr:`is_separable`) also
    implement :meth:`axis_scores`.

    Args: as :class:`~attncnn.layers.GridAttention`; ``impl`` is one of ``"auto"``, ``"dense"``,
    ``"folded"`` (heads as wide as the model) and, for separable layers, ``"separable"``.

    Raises:
        InputError: an ``impl`` the layer does not have (``"folded"`` with ``head_dim != dim``).
    """

    IMPLS = ("auto", "dense", "separable", "folded")
    position_only = True
    has_positional_term = True

    @classmethod
    def impls_of(cls, kind: str) -> tuple[str, ...]:
        return cls.IMPLS if cls.separable_kind(kind) else ("auto", "dense", "folded")

    @property
    def impls(self) -> tuple[str, ...]:
        """As :meth:`impls_of`, less ``"folded"`` when heads are narrower than the model (it folds
        the output map into each head's values, which needs ``head_dim == dim``)."""
        impls = type(self).impls_of(self.kind)
        return impls if self.value_in is None else tuple(i for i in impls if i != "folded")

    @classmethod
    def check_config(cls, kind: str, config) -> None:
        """The base checks, and ``impl="folded"`` only with heads as wide as the model.

        Raises:
            InputError: naming the field and the fix.
        """
        super().check_config(kind, config)
        folded = "folded" in (config.impl, getattr(config, "eval_impl", None))
        if folded and config.head_dim not in (None, config.dim):
            raise InputError(f"impl='folded' needs heads as wide as the model (head_dim = dim = {config.dim}), "
                             f"got head_dim={config.head_dim}; use impl='dense' or leave head_dim unset")

    @classmethod
    def separable_kind(cls, kind: str) -> bool:
        """True when every layer of ``kind`` has separable heads (see :attr:`is_separable`)."""
        return False

    @property
    def is_separable(self) -> bool:
        """True when every head's score is ``row[h, i, k] + col[h, j, l]`` (see :meth:`axis_scores`)."""
        return type(self).separable_kind(self.kind)

    def grid_scores(self, height: int, width: int) -> torch.Tensor:
        """Pre-softmax scores ``(N_h, H*W, H*W)`` for an ``height x width`` grid."""
        raise NotImplementedError

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column score terms ``(N_h, H, H)`` and ``(N_h, W, W)`` of a separable layer:
        ``grid_scores[h, (i, j), (k, l)] == row[h, i, k] + col[h, j, l]``.

        Raises:
            InputError: the layer is not separable (:attr:`is_separable` is False).
        """
        raise InputError(f"{type(self).__name__} is not separable: its scores couple rows and columns; "
                         "use grid_probs")

    def _score_context(self):
        """Autocast off on the parameters' device: scores and softmax run in float32 or wider."""
        return autocast_off(self.value.weight.device)

    def grid_probs(self, height: int, width: int) -> torch.Tensor:
        """Attention probabilities ``(1, N_h, H*W, H*W)``; each row sums to 1 over the keys.

        Computed with autocast off, in float32 at least (float64 for float64 parameters), and returned
        in that dtype. Probabilities below ``eps(dtype)**2`` of that dtype are set to exactly 0, so that
        the backward products stay out of the subnormal range (slow on CPUs); any output moves by at most
        ``H*W * eps**2 * max|value|``. Under bf16 autocast the threshold stays float32's (bfloat16 has
        float32's exponent range; its own ``eps**2`` would drop a visible share of a row's mass).
        """
        with self._score_context():
            probs = torch.softmax(self.grid_scores(height, width), dim=-1)
        threshold = torch.finfo(probs.dtype).eps ** 2
        return flush_below(probs, threshold).unsqueeze(0)

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`grid_probs` of the grid of ``x (B, H, W, D)``: ``(1, N_h, H*W, H*W)``."""
        _, h, w = self.check_input(x)
        return self.grid_probs(h, w)

    def axis_probs(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The two factors of a separable layer's probabilities (paper eq. 9 / eq. 8 term 4):
        ``probs[h, (i, j), (k, l)] = row[h, i, k] * col[h, j, l]``.

        Returns:
            ``(row, col)``: ``(N_h, H, H)`` and ``(N_h, W, W)``, softmaxes of :meth:`axis_scores`
            over the key axis (dim -1), in float32 at least (autocast off, as :meth:`grid_probs`).
            Entries below ``eps(dtype)`` are set to 0 (so their products stay at ``eps**2`` or more,
            as the dense path's), so each row sums to 1 within ``H * eps`` (``W * eps``).

        Raises:
            InputError: the layer is not separable, or the grid is too large for its tables.
        """
        if not self.is_separable:
            self.axis_scores(height, width)          # raises the explanation
        with self._score_context():
            row, col = self.axis_scores(height, width)
            row, col = torch.softmax(row, dim=-1), torch.softmax(col, dim=-1)
        threshold = torch.finfo(row.dtype).eps
        return flush_below(row, threshold), flush_below(col, threshold)

    def factored_probs(self, height: int, width: int) -> torch.Tensor:
        """The ``(N_h, H*W, H*W)`` map the folded path uses: for separable layers the outer product of
        :meth:`axis_probs` (exact since the softmax factors, paper eq. 9; rows sum to 1 within
        ``(H + W) eps``), else :meth:`grid_probs`. Float32 at least."""
        if not self.is_separable:
            return self.grid_probs(height, width)[0]
        rows, cols = self.axis_probs(height, width)                          # (N_h, H, H), (N_h, W, W)
        n = height * width
        return (rows[:, :, None, :, None] * cols[:, None, :, None, :]).reshape(-1, n, n)

    def path(self, height: int, width: int) -> str:
        """The path :meth:`forward` takes without probabilities: ``"separable"``, ``"dense"`` or
        ``"folded"``.

        ``"folded"`` is taken only when asked for. The separable path needs a separable layer and no
        dropout on the map (eval mode or ``attn_drop.p == 0``); then ``"separable"`` takes it, ``"dense"``
        never, ``"auto"`` when ``H*W >= 6 (H + W)`` (the dense/separable multiply-add ratio).
        """
        impl = self.mode_impl
        if impl == "folded":
            return "folded"
        dropout = self.training and self.attn_drop.p > 0
        if not self.is_separable or dropout or impl == "dense":
            return "dense"
        if impl == "separable" or height * width >= 6 * (height + width):
            return "separable"
        return "dense"

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid.
            return_attention: also return the probabilities ``(1, N_h, H*W, H*W)`` (explicit
                path, the plain product), float32 under autocast (float64 for a float64 layer).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            InputError: wrong rank or channel count (the message gives the expected shape).
        """
        b, h, w = self.check_input(x)
        dtype = matmul_dtype(x)
        if not return_attention and self.path(h, w) == "separable":
            rows, cols = self.axis_probs(h, w)                   # (N_h, H, H), (N_h, W, W)
            values = x if self.value_in is None else self.value_in(x).reshape(b, h, w, self.num_heads, -1)
            return self.value(separable_mix(rows, cols, values, dtype))
        if not return_attention and self.path(h, w) == "folded":
            dropped = self.attn_drop(self.factored_probs(h, w)).to(dtype)      # one mask for the batch
            return folded_mix(dropped, x, self.value.weight, self.value.bias, dtype)
        probs = self.grid_probs(h, w)                            # (1, N_h, N, N)
        dropped = self.attn_drop(probs).to(dtype)                # one mask for the batch
        if return_attention:
            mixed = mix_explicit(dropped, x, self.projected_values(x))       # (B, N_h, N, D_h)
            return self.output(mixed, b, h, w), probs
        return self.output(mix_shared(dropped[0], x, self.projected_values(x)), b, h, w)
