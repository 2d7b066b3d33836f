"""Learned relative positional attention, position only ("SA learned emb." of Table 1; reference
``Learned2DRelativeSelfAttention``).

The row and column tables and their per-head key vectors are :mod:`~attncnn.layers.axis_tables`'.
Any grid up to ``max_size`` on each axis works; offsets are built for the grid of the call.
"""

from __future__ import annotations

import torch

from .autocast_rules import score_dtype
from .axis_tables import AxisTables
from .position_only import PositionalAttention

__all__ = ["LearnedRelativeAttention"]


class LearnedRelativeAttention(AxisTables, PositionalAttention):
    """Position-only attention with learned row/column relative embeddings ("SA learned emb.").

    Score of head h (paper eq. 8, term 4; reference ``Learned2DRelativeSelfAttention`` without
    content): ``A = w_row^(h) . e_row(delta_1) + w_col^(h) . e_col(delta_2)``, not scaled.
    The per-head key vectors are the rows of the bias-free linear maps ``head_keys_row`` and
    ``head_keys_col`` (``table_dim -> N_h``). Tables start N(0, 1) (PyTorch's default).

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop, impl: see :class:`~attncnn.layers.GridAttention`
            and :class:`~attncnn.layers.PositionalAttention`.
        max_size: largest grid side supported by the tables (paper: 16).
        table_dim: width of each axis table (default ``dim``, the 12.3 M-parameter paper model).
    """

    KINDS = ("learned",)

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16,
                 table_dim: int | None = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.add_axis_tables(max_size, table_dim)

    @classmethod
    def separable_kind(cls, kind: str) -> bool:
        """Scores are a row term plus a column term (paper eq. 8 term 4 with r = [e_row; e_col])."""
        return True

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """Lemma 2 inside the learned encoding (:meth:`~attncnn.layers.axis_tables.AxisTables.local_init_tables_`):
        the row term is exactly ``-alpha (d_1 - Delta_1)^2`` and the column term ``-alpha (d_2 - Delta_2)^2``."""
        self.local_init_tables_(shifts, alpha)

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column terms ``row[h, i, k] = w_row^(h) . e_row(k - i)`` ``(N_h, H, H)`` and
        ``col[h, j, l] = w_col^(h) . e_col(l - j)`` ``(N_h, W, W)``; float32 for half parameters.

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        return self.table_scores(height, width, score_dtype(self.row_embeddings.weight.dtype))

    def grid_scores(self, height: int, width: int) -> torch.Tensor:
        """Scores ``(N_h, H*W, H*W)``; score[h, (i, j), (k, l)] = row[h, i, k] + col[h, j, l]
        (see :meth:`axis_scores`)."""
        return self.grid_term(height, width)
