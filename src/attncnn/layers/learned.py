"""Learned relative positional attention, position only ("SA learned emb." of Table 1; reference
``Learned2DRelativeSelfAttention``).

Each axis has a table of ``2*max_size - 1`` rows, one per relative shift ``-(max_size-1) ..
max_size-1`` (:func:`~attncnn.layers.relative.table_rows`); ``row_embeddings`` is indexed by the
vertical shift delta_1 = key row - query row and ``col_embeddings`` by the horizontal shift
delta_2. The relative encoding of a pair is r_delta = [e_row(delta_1); e_col(delta_2)].
Any grid up to ``max_size`` on each axis works; offsets are built for the grid of the call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .autocast_rules import score_dtype
from .conv_init import axis_coefficients, table_features
from .position_only import PositionalAttention
from .relative import table_rows

__all__ = ["LearnedRelativeAttention"]

#: the first table columns a convolutional init writes (d^2, d, 1) into
_INIT_COLUMNS = 3


def _check_table_width(width: int) -> None:
    if width < _INIT_COLUMNS:
        raise InputError(f"init='conv' writes (d^2, d, 1) into 3 columns of the learned tables, but their width "
                         f"is {width}; set table_dim >= 3")


class LearnedRelativeAttention(PositionalAttention):
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
    CONFIG_KEYS = ("max_size", "table_dim")

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16,
                 table_dim: int | None = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.max_size = max_size
        self.table_dim = dim if table_dim is None else table_dim
        self.row_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.col_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.head_keys_row = nn.Linear(self.table_dim, num_heads, bias=False)
        self.head_keys_col = nn.Linear(self.table_dim, num_heads, bias=False)

    @classmethod
    def separable_kind(cls, kind: str) -> bool:
        """Scores are a row term plus a column term (paper eq. 8 term 4 with r = [e_row; e_col])."""
        return True

    @classmethod
    def check_config(cls, kind: str, config) -> None:
        super().check_config(kind, config)
        if config.init == "conv":
            _check_table_width(config.table_dim or config.dim)

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """Lemma 2 inside the learned encoding: columns 0-2 of both axis tables become ``(d^2, d, 1)``
        for the shift d on that axis, the other columns 0; the head keys get ``(-alpha, 2 alpha
        Delta_a, -alpha Delta_a^2)`` on those columns for axis a (the rest keeps its random values,
        so the zero table columns receive gradients): the row term is exactly ``-alpha (d_1 -
        Delta_1)^2`` and the column term ``-alpha (d_2 - Delta_2)^2``."""
        _check_table_width(self.table_dim)
        for axis, (table, keys) in enumerate(((self.row_embeddings, self.head_keys_row),
                                              (self.col_embeddings, self.head_keys_col))):
            table.weight.zero_()
            table.weight[:, :_INIT_COLUMNS] = table_features(self.max_size, table.weight)
            keys.weight[:, :_INIT_COLUMNS] = axis_coefficients(shifts[:, axis], alpha)

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column terms ``row[h, i, k] = w_row^(h) . e_row(k - i)`` ``(N_h, H, H)`` and
        ``col[h, j, l] = w_col^(h) . e_col(l - j)`` ``(N_h, W, W)``; float32 for half parameters.

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        # Look up the table row of every (query, key) shift on each axis, then score it per head.
        dtype = score_dtype(self.row_embeddings.weight.dtype)
        e_row = table_rows(self.row_embeddings, height, self.max_size, "height").to(dtype)   # (H, H, E)
        e_col = table_rows(self.col_embeddings, width, self.max_size, "width").to(dtype)     # (W, W, E)
        row = F.linear(e_row, self.head_keys_row.weight.to(dtype))
        col = F.linear(e_col, self.head_keys_col.weight.to(dtype))
        return row.permute(2, 0, 1), col.permute(2, 0, 1)                 # (N_h, H, H), (N_h, W, W)

    def grid_scores(self, height: int, width: int) -> torch.Tensor:
        """Scores ``(N_h, H*W, H*W)``; score[h, (i, j), (k, l)] = row[h, i, k] + col[h, j, l]
        (see :meth:`axis_scores`)."""
        row, col = self.axis_scores(height, width)
        scores = row[:, :, None, :, None] + col[:, None, :, None, :]       # (N_h, H, W, H, W)
        n = height * width
        return scores.reshape(self.num_heads, n, n)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_size={self.max_size}, table_dim={self.table_dim}"
