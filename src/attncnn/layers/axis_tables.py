"""Learned row/column relative tables read by per-head key vectors: the positional term that
``learned`` and ``learned-content-9ffaa`` share.

Each axis has a table of ``2*max_size - 1`` rows, one per shift (:func:`~attncnn.layers.relative.table_rows`):
``row_embeddings`` for delta_1 = key row - query row, ``col_embeddings`` for delta_2. Head h
scores ``w_row^(h) . e_row(delta_1) + w_col^(h) . e_col(delta_2)`` (paper eq. 8, term 4), not scaled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .conv_init import axis_coefficients, table_features
from .relative import table_rows

#: the first table columns a convolutional init writes (d^2, d, 1) into
_INIT_COLUMNS = 3


def check_table_width(width: int) -> None:
    """Raises InputError when tables ``width`` columns wide cannot take the convolutional init."""
    if width < _INIT_COLUMNS:
        raise InputError(f"init='conv' writes (d^2, d, 1) into 3 columns of the learned tables, but their width "
                         f"is {width}; set table_dim >= 3")


class AxisTables:
    """Mixin of an attention layer (before its base class): the tables ``row_embeddings``,
    ``col_embeddings`` ``(2 max_size - 1, table_dim)`` and the bias-free head keys
    ``head_keys_row``, ``head_keys_col`` (``table_dim -> N_h``), made by :meth:`add_axis_tables`."""

    CONFIG_KEYS = ("max_size", "table_dim")

    def add_axis_tables(self, max_size: int, table_dim: int | None) -> None:
        """Make the tables (N(0, 1), PyTorch's default) and head keys; ``table_dim`` None: ``dim``."""
        self.max_size = max_size
        self.table_dim = self.dim if table_dim is None else table_dim
        self.row_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.col_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.head_keys_row = nn.Linear(self.table_dim, self.num_heads, bias=False)
        self.head_keys_col = nn.Linear(self.table_dim, self.num_heads, bias=False)

    @classmethod
    def check_config(cls, kind: str, config) -> None:
        """The base class's checks, and tables at least 3 columns wide for ``init="conv"``.

        Raises:
            InputError: naming the field and the fix.
        """
        super().check_config(kind, config)
        if config.init == "conv":
            check_table_width(config.table_dim or config.dim)

    @torch.no_grad()
    def local_init_tables_(self, shifts: torch.Tensor, alpha: float) -> None:
        """Lemma 2 inside the learned encoding: columns 0-2 of both axis tables become ``(d^2, d, 1)``
        for the shift d on that axis, the other columns 0; the head keys get ``(-alpha, 2 alpha
        Delta_a, -alpha Delta_a^2)`` on those columns (the rest keeps its random values, so the zero
        table columns receive gradients), so the row
        term is ``-alpha (d_1 - Delta_1)^2`` and the column term ``-alpha (d_2 - Delta_2)^2``.

        Raises:
            InputError: tables narrower than 3 columns.
        """
        check_table_width(self.table_dim)
        for axis, (table, keys) in enumerate(((self.row_embeddings, self.head_keys_row),
                                              (self.col_embeddings, self.head_keys_col))):
            table.weight.zero_()
            table.weight[:, :_INIT_COLUMNS] = table_features(self.max_size, table.weight)
            keys.weight[:, :_INIT_COLUMNS] = axis_coefficients(shifts[:, axis], alpha)

    def table_scores(self, height: int, width: int,
                     dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column terms ``row[h, i, k] = w_row^(h) . e_row(k - i)`` ``(N_h, H, H)`` and
        ``col[h, j, l] = w_col^(h) . e_col(l - j)`` ``(N_h, W, W)``, computed in ``dtype`` (None:
        the parameters' dtype, the products' under autocast).

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        # Look up the table row of every (query, key) shift on each axis, then score it per head.
        e_row = table_rows(self.row_embeddings, height, self.max_size, "height")     # (H, H, E)
        e_col = table_rows(self.col_embeddings, width, self.max_size, "width")       # (W, W, E)
        keys_row, keys_col = self.head_keys_row.weight, self.head_keys_col.weight
        if dtype is not None:
            e_row, e_col, keys_row, keys_col = (t.to(dtype) for t in (e_row, e_col, keys_row, keys_col))
        row = F.linear(e_row, keys_row)                                                 # (H, H, N_h)
        col = F.linear(e_col, keys_col)                                                 # (W, W, N_h)
        return row.permute(2, 0, 1), col.permute(2, 0, 1)

    def grid_term(self, height: int, width: int) -> torch.Tensor:
        """The positional term of every pair, ``(N_h, H*W, H*W)`` (queries on dim -2, keys on
        dim -1, row-major), the same for every image: ``row[h, i, k] + col[h, j, l]`` of
        :meth:`axis_scores`.

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        row, col = self.axis_scores(height, width)
        scores = row[:, :, None, :, None] + col[:, None, :, None, :]                    # (N_h, H, W, H, W)
        n = height * width
        return scores.reshape(self.num_heads, n, n)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_size={self.max_size}, table_dim={self.table_dim}"
