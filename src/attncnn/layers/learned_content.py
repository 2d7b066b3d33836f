"""Content + learned relative attention in the q.r form, the paper's "SA learned emb. + content"
(Table 1, 29.5 M parameters).

Score: ``(q . k + q . r_delta) / sqrt(D_h)`` (paper eq. 8, terms 1-2), with r_delta = [e_row(delta_1);
e_col(delta_2)] from two tables of width ``D_h/2`` (:func:`~attncnn.layers.relative.table_rows`),
read by each query's two halves, and no per-head key vectors: 29,484,282 parameters at the paper's
size, Table 1's 29.5 M. The reference repository (epfml/attention-cnn at 9ffaa30) has another
form instead, ``Learned2DRelativeSelfAttention`` with scores ``w . r_delta + q . k / sqrt(D)``,
``learned-content-9ffaa`` (:mod:`~attncnn.layers.learned_content_9ffaa`); the q.r form is found in
a fork of it.

Paths: the content family's (:class:`~attncnn.layers.ContentAttention`), ``bilinear``
(:mod:`~attncnn.layers.bilinear`: the queries are never formed) and ``explicit-onehot`` (the q.r
term inside the q.k product, :meth:`LearnedRelativeContentAttention.joint_queries_keys`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .axis_tables import _INIT_COLUMNS
from .content import ContentAttention
from .conv_init import axis_coefficients, table_features
from .relative import axis_offsets, table_rows, table_span

__all__ = ["LearnedRelativeContentAttention"]


def _check_even(width: int) -> None:
    if width % 2:
        raise InputError(f"learned-content attention splits each query in a row half and a column half, so "
                         f"the head width must be even, got {width}; set head_dim (or dim) to an even number")


def _check_init_width(width: int) -> None:
    if width < 2 * _INIT_COLUMNS:
        raise InputError(f"init='conv' writes (d^2, d, 1) into 3 columns of each half of the head width, got "
                         f"{width}; set head_dim (or dim) >= 6")


def _axis_onehot(height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(H*W, H + W)``: token n's row ``n // W`` one-hot in the first ``H`` columns, its column in the rest."""
    token = torch.arange(height * width, device=device)
    return torch.cat([F.one_hot(token // width, height), F.one_hot(token % width, width)], dim=-1).to(dtype)


class LearnedRelativeContentAttention(ContentAttention):
    """Content + learned relative attention in the q.r form, the paper's "SA learned emb. + content"
    (Table 1's 29.5 M; the reference repository's 9ffaa30 form is ``learned-content-9ffaa``).

    Score of head h (paper eq. 8, terms 1-2):
    ``A = (q_h . k_h + q_h[:D_h/2] . e_row(delta_1) + q_h[D_h/2:] . e_col(delta_2)) / sqrt(D_h)``,
    with tables of width ``D_h/2`` per axis and no per-head key vectors; ``row`` is the shift along
    image rows (delta_1 = key row - query row), ``col`` along columns.

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop, impl: see :class:`~attncnn.layers.ContentAttention`.
        max_size: largest grid side supported by the tables (paper: 16).

    Raises:
        InputError: if ``head_dim`` is odd (the query is split in two halves).
    """

    KINDS = ("learned-content",)
    IMPLS = ContentAttention.IMPLS + ("bilinear", "explicit-onehot")
    CONFIG_KEYS = ("max_size",)           # not qk_bias / qk_init_std: its local init writes the query bias
    EXCLUSIVE_KEYS = ()
    has_positional_term = True

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        _check_even(self.head_dim)
        self.max_size = max_size
        half = self.head_dim // 2
        self.row_embeddings = nn.Embedding(2 * max_size - 1, half)
        self.col_embeddings = nn.Embedding(2 * max_size - 1, half)

    @classmethod
    def check_config(cls, kind: str, config) -> None:
        super().check_config(kind, config)
        width = config.dim if config.head_dim is None else config.head_dim
        _check_even(width)
        if config.init == "conv":
            _check_init_width(width)

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """Content attention starts switched off and is learned; the q.r term starts local.

        The query weight is 0 and the query bias of head h is non-zero on 6 coordinates only: on the row
        half ``sqrt(D_h) (-alpha, 2 alpha Delta_1, -alpha Delta_1^2)`` against table columns
        ``(d^2, d, 1)``, likewise on the column half. The key weight rows of those 6 coordinates are set
        to 0, so ``q_h . k_h`` is the same for every key and cancels in the softmax, while
        ``q_h . r_delta / sqrt(D_h) = -alpha |delta - Delta|^2`` exactly. (Leaving the key map untouched
        would not cancel: ``c_h . W_key x_k`` varies with k.)

        Raises:
            InputError: heads too narrow for the 6 coordinates, or a layer without query bias.
        """
        dh, nh = self.head_dim, self.num_heads
        _check_init_width(dh)
        if self.query.bias is None:
            raise InputError("the local init writes the query bias, and this layer has none (qk_bias=False): "
                             "build it with qk_bias=True")
        half = dh // 2
        scale = math.sqrt(dh)                           # the layer divides q . r by sqrt(D_h)
        self.query.weight.zero_()
        self.query.bias.zero_()
        bias = self.query.bias.view(nh, dh)
        key = self.key.weight.view(nh, dh, self.dim)
        for axis, (table, start) in enumerate(((self.row_embeddings, 0), (self.col_embeddings, half))):
            table.weight[:, :_INIT_COLUMNS] = table_features(self.max_size, table.weight)
            bias[:, start:start + _INIT_COLUMNS] = scale * axis_coefficients(shifts[:, axis], alpha)
            key[:, start:start + _INIT_COLUMNS] = 0.0      # q . k is then the same for every key

    def axis_scores(self, q: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query against the table row of every shift, per axis, not yet divided by ``sqrt(D_h)``.

        Args:
            q: queries ``(B, N_h, H*W, D_h)`` from :meth:`queries_keys`.
            height, width: the token grid ``H x W``.

        Returns:
            ``(row, col)``: ``row[b, h, i, k] = q_i[:D_h/2] . e_row(k - row(i))`` ``(B, N_h, H*W, H)``
            and ``col[b, h, i, l] = q_i[D_h/2:] . e_col(l - col(i))`` ``(B, N_h, H*W, W)``; the q.r
            term of query i and key j is ``(row[i, row(j)] + col[i, col(j)]) / sqrt(D_h)``.

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        b, nh, n, dh = q.shape
        half = dh // 2
        q = q.reshape(b, nh, height, width, dh)
        e_row = table_rows(self.row_embeddings, height, self.max_size, "height")   # (H, H, D_h/2)
        e_col = table_rows(self.col_embeddings, width, self.max_size, "width")     # (W, W, D_h/2)
        row = torch.einsum("bhijc,ikc->bhijk", q[..., :half], e_row)                 # (B, N_h, H, W, H)
        col = torch.einsum("bhijc,jlc->bhijl", q[..., half:], e_col)                 # (B, N_h, H, W, W)
        return row.reshape(b, nh, n, height), col.reshape(b, nh, n, width)

    def positional_term(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The q.r term ``(q_h[:D_h/2] . e_row(delta_1) + q_h[D_h/2:] . e_col(delta_2)) / sqrt(D_h)``
        (paper eq. 8, term 2).

        Args:
            q: queries ``(B, N_h, H*W, D_h)`` from :meth:`queries_keys`.
            height, width: the token grid ``H x W``.

        Returns:
            ``(B, N_h, H*W, H*W)``, queries on dim -2, keys on dim -1 (both row-major).

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        b, nh, n, dh = q.shape
        scale = 1.0 / math.sqrt(dh)
        row, col = self.axis_scores(q, height, width)
        # Scaled while they are small, then broadcast-added: one full-size pass.
        scores = (row * scale).reshape(b, nh, n, height, 1) + (col * scale).reshape(b, nh, n, 1, width)
        return scores.reshape(b, nh, n, n)

    def joint_queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys whose one dot product is the whole score, ``1 / sqrt(D_h)`` included.

        ``q' = [q, row, col] / sqrt(D_h)`` (:meth:`axis_scores`) and ``k' = [k, onehot(row(j)),
        onehot(col(j))]``: ``q'_i . k'_j = (q_i . k_j + row[i, row(j)] + col[i, col(j)]) / sqrt(D_h)``,
        the content and q.r terms of paper eq. 8 in one product (``impl="explicit-onehot"``): the q.r
        term enters the score inside the ``q.k`` product's float32 accumulator instead of as a
        ``(B, N_h, N, N)`` tensor written and read, for ``H + W`` more columns in the product.

        Returns:
            ``(q', k')``, each ``(B, N_h, H*W, D_h + H + W)`` and contiguous, in the products' dtype.

        Raises:
            InputError: wrong rank or channel count, or a grid larger than ``max_size``.
        """
        _, h, w = self.check_input(x)
        q, k = self.queries_keys(x, query_scale=1.0 / math.sqrt(self.head_dim))
        row, col = self.axis_scores(q, h, w)
        dtype = row.dtype                                   # the products' dtype (bf16 under autocast)
        onehot = _axis_onehot(h, w, x.device, dtype)                                    # (N, H+W)
        joint_q = torch.cat([q.to(dtype), row, col], dim=-1)
        joint_k = torch.cat([k.to(dtype), onehot.expand(*k.shape[:2], *onehot.shape)], dim=-1)
        return joint_q, joint_k

    # -- the bilinear path's positional columns (ContentAttention.bilinear_scores) -------------

    def positional_vectors(self, height: int, width: int) -> torch.Tensor:
        """The table rows the queries meet, ``(N_h, D_h, (2H-1) + (2W-1))``: for every row shift the row
        table's entry on the query's first half, then every column shift's on the second half.

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        e_row = table_span(self.row_embeddings, height, self.max_size, "height").T     # (D_h/2, 2H-1)
        e_col = table_span(self.col_embeddings, width, self.max_size, "width").T       # (D_h/2, 2W-1)
        vectors = torch.cat([torch.cat([e_row, torch.zeros_like(e_col)], dim=1),
                             torch.cat([torch.zeros_like(e_row), e_col], dim=1)], dim=0)   # (D_h, S)
        return vectors.expand(self.num_heads, *vectors.shape)

    def positional_queries(self, products: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, ...]:
        """From each query's products with every shift's table row, ``(B, N_h, N, (2H-1) + (2W-1))``,
        the ``H`` of its row's keys and the ``W`` of its column's: :meth:`axis_scores`, scaled."""
        b, nh, n, _ = products.shape
        by_row, by_col = products.split([2 * height - 1, 2 * width - 1], dim=-1)
        # token i = (r, c) meets key row k at shift k - r: column k - r + H - 1 of by_row
        row_index = (axis_offsets(height, products.device) + height - 1).repeat_interleave(width, dim=0)   # (N, H)
        col_index = (axis_offsets(width, products.device) + width - 1).repeat(height, 1)                   # (N, W)
        return (torch.gather(by_row, -1, row_index.expand(b, nh, n, height)),
                torch.gather(by_col, -1, col_index.expand(b, nh, n, width)))

    def positional_keys(self, height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Every key's one-hot row and column, ``(N, H + W)`` (as :meth:`joint_queries_keys`)."""
        return _axis_onehot(height, width, device, dtype)

    def path(self, height: int = 0, width: int = 0) -> str:
        """The path :meth:`forward` takes without probabilities on an ``height x width`` grid (0: the
        tables' largest, ``max_size``): the mode's ``impl``, with ``"auto"`` resolved, for heads as wide
        as the model, to ``"bilinear"`` where folding the query map saves at least a quarter of the
        query and key maps' multiply-adds, ``D >= 2 (S + 1)`` with ``S = (2H - 1) + (2W - 1)`` table
        rows met, else ``"explicit-onehot"``; for narrower heads ``"sdpa"``
        (``benchmarks/results/attention-paths.md``)."""
        if self.mode_impl != "auto":
            return self.mode_impl
        if self.value_in is not None:
            return "sdpa"
        shifts = 2 * (height or self.max_size) - 1 + 2 * (width or self.max_size) - 1
        return "bilinear" if self.dim >= 2 * (shifts + 1) else "explicit-onehot"

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer (as :meth:`ContentAttention.forward <attncnn.layers.ContentAttention.forward>`),
        with one more path: ``"explicit-onehot"`` (``explicit-half`` with its scores from
        :meth:`joint_queries_keys`).

        Raises:
            InputError: wrong rank or channel count.
        """
        b, h, w = self.check_input(x)
        path = "explicit" if return_attention else self.path(h, w)
        if path != "explicit-onehot":
            return super().forward(x, return_attention)
        q, k = self.joint_queries_keys(x)
        nh, n, width = q.shape[1], q.shape[2], q.shape[3]
        flat = (b * nh, n, width)
        scores = torch.bmm(q.view(flat), k.view(flat).transpose(1, 2))      # already scaled through q
        return self.mix_scores(scores.view(b, nh, n, n), x, half=True)[0]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_size={self.max_size}"
