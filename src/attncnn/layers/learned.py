"""Learned relative positional attention with one embedding table per axis (PAPER.md 3.3).

Each axis has a table of ``2*max_size - 1`` rows, one per relative shift ``-(max_size-1) ..
max_size-1`` (shift d -> row d + max_size - 1); ``row_embeddings`` is indexed by the vertical
shift delta_1 = key row - query row and ``col_embeddings`` by the horizontal shift delta_2.
The relative encoding of a pair is r_delta = [e_row(delta_1); e_col(delta_2)].
Any grid up to ``max_size`` on each axis works; offsets are built for the grid of the call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import ContentAttention, PositionalAttention
from .precision import score_dtype
from .relative import axis_offsets

__all__ = ["LearnedRelativeAttention", "LearnedRelativeContentAttention"]


def _table_rows(table: nn.Embedding, length: int, max_size: int, axis: str) -> torch.Tensor:
    """Embeddings of every (query, key) shift along one axis: ``(L, L, E)``."""
    if length > max_size:
        raise ValueError(
            f"grid {axis} {length} exceeds the learned table's max_size {max_size}: "
            f"build the layer with max_size >= {length}")
    index = axis_offsets(length, table.weight.device) + (max_size - 1)   # (L, L)
    return table.weight[index]


class LearnedRelativeAttention(PositionalAttention):
    """Position-only attention with learned row/column relative embeddings ("SA learned emb.").

    Score of head h (paper eq. 8, term 4; reference ``Learned2DRelativeSelfAttention`` without
    content): ``A = w_row^(h) . e_row(delta_1) + w_col^(h) . e_col(delta_2)``, not scaled.
    The per-head key vectors are the rows of the bias-free linear maps ``head_keys_row`` and
    ``head_keys_col`` (``table_dim -> N_h``). Tables start N(0, 1) (PyTorch's default).

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop: see :class:`GridAttention`.
        max_size: largest grid side supported by the tables (paper: 16).
        table_dim: width of each axis table (default ``dim``, the 12.3 M-parameter paper model).
    """

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16,
                 table_dim: int | None = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.max_size = max_size
        self.table_dim = dim if table_dim is None else table_dim
        self.row_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.col_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.head_keys_row = nn.Linear(self.table_dim, num_heads, bias=False)
        self.head_keys_col = nn.Linear(self.table_dim, num_heads, bias=False)

    #: Scores are a row term plus a column term (paper eq. 8 term 4 with r = [e_row; e_col]).
    is_separable = True

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column terms ``row[h, i, k] = w_row^(h) . e_row(k - i)`` ``(N_h, H, H)`` and
        ``col[h, j, l] = w_col^(h) . e_col(l - j)`` ``(N_h, W, W)``; float32 for half parameters.

        Raises:
            ValueError: ``height`` or ``width`` exceeds ``max_size``.
        """
        # Look up the table row of every (query, key) shift on each axis, then score it per head.
        dtype = score_dtype(self.row_embeddings.weight.dtype)
        e_row = _table_rows(self.row_embeddings, height, self.max_size, "height").to(dtype)   # (H, H, E)
        e_col = _table_rows(self.col_embeddings, width, self.max_size, "width").to(dtype)     # (W, W, E)
        row = F.linear(e_row, self.head_keys_row.weight.to(dtype))
        col = F.linear(e_col, self.head_keys_col.weight.to(dtype))
        return row.permute(2, 0, 1), col.permute(2, 0, 1)                 # (N_h, H, H), (N_h, W, W)

    def attention_scores(self, height: int, width: int) -> torch.Tensor:
        """Scores ``(N_h, H*W, H*W)``; score[h, (i, j), (k, l)] = row[h, i, k] + col[h, j, l]
        (see :meth:`axis_scores`)."""
        row, col = self.axis_scores(height, width)
        scores = row[:, :, None, :, None] + col[:, None, :, None, :]       # (N_h, H, W, H, W)
        n = height * width
        return scores.reshape(self.num_heads, n, n)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_size={self.max_size}, table_dim={self.table_dim}"


class LearnedRelativeContentAttention(ContentAttention):
    """Content + learned relative attention, the paper's "SA learned emb. + content" (29.5 M).

    Score of head h (PAPER.md 3.3, later upstream form with the q.r term):
    ``A = (q_h . k_h + q_h[:D_h/2] . e_row(delta_1) + q_h[D_h/2:] . e_col(delta_2)) / sqrt(D_h)``,
    with tables of width ``D_h/2`` per axis and no per-head key vectors.

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop: see :class:`GridAttention`.
        max_size: largest grid side supported by the tables (paper: 16).

    Raises:
        ValueError: if ``head_dim`` is odd (the query is split in two halves).
    """

    has_positional_term = True

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even to split queries between rows and columns, got {self.head_dim}")
        self.max_size = max_size
        half = self.head_dim // 2
        self.row_embeddings = nn.Embedding(2 * max_size - 1, half)
        self.col_embeddings = nn.Embedding(2 * max_size - 1, half)

    def positional_term(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The q.r term ``(q_h[:D_h/2] . e_row(delta_1) + q_h[D_h/2:] . e_col(delta_2)) / sqrt(D_h)``.

        Paper eq. 8, term 2, in the form of PAPER.md 3.3 (r_delta = [e_row(delta_1); e_col(delta_2)],
        no separate key map for positions).

        Args:
            q: queries ``(B, N_h, H*W, D_h)`` from :meth:`queries_keys`.
            height, width: the token grid ``H x W``.

        Returns:
            ``(B, N_h, H*W, H*W)``, queries on dim -2, keys on dim -1 (both row-major).

        Raises:
            ValueError: ``height`` or ``width`` exceeds ``max_size``.
        """
        b, nh, n, dh = q.shape
        half, scale = dh // 2, 1.0 / math.sqrt(dh)
        q = q.reshape(b, nh, height, width, dh)
        e_row = _table_rows(self.row_embeddings, height, self.max_size, "height")   # (H, H, D_h/2)
        e_col = _table_rows(self.col_embeddings, width, self.max_size, "width")     # (W, W, D_h/2)
        # Score each query against the table row of every (query row, key row) shift, per axis:
        # row[b, h, i, j, k] = q[:D_h/2] . e_row(k - i), col[b, h, i, j, l] = q[D_h/2:] . e_col(l - j).
        # Scaled while they are small, then broadcast-added: one full-size pass.
        row = torch.einsum("bhijc,ikc->bhijk", q[..., :half], e_row) * scale        # (B, N_h, H, W, H)
        col = torch.einsum("bhijc,jlc->bhijl", q[..., half:], e_col) * scale        # (B, N_h, H, W, W)
        scores = row.reshape(b, nh, n, height, 1) + col.reshape(b, nh, n, 1, width)  # (B, N_h, N, H, W)
        return scores.reshape(b, nh, n, n)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_size={self.max_size}"
