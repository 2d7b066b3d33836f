"""Content + learned relative attention in the reference repository's form at commit 9ffaa30
(``Learned2DRelativeSelfAttention`` with ``use_attention_data=True``, ``models/bert.py``).

Score of head h for the query at ``(i, j)`` and the key at ``(k, l)`` (``delta = key - query``):

    ``A = w_row^(h) . e_row(k - i) + w_col^(h) . e_col(l - j) + q_h . k_h / sqrt(D)``

paper eq. 8, terms 1 and 4, where the content term is divided by the model width ``D`` (the
reference's ``hidden_size``; its heads are always ``D`` wide) and the positional term is not scaled.
The tables are ``table_dim`` wide per axis (default ``D``, the reference's
``position_encoding_size = hidden_size``): 29,601,882 parameters at the
paper's size, 117,600 more than ``learned-content`` (the q.r form).

Unlike the reference's code (not its function): ``row_*`` here is the shift along image rows
(delta_1), ``col_*`` along image columns (delta_2); the reference names them the other way round
(its ``row_embeddings``/``head_keys_row`` score the shift along image columns), which also limits
it to square grids; this layer takes any grid up
to ``max_size`` on each axis. Its forward ignores the reference's ``attention_mask`` argument, as
the reference's layer does.

Paths (``impl``): ``explicit``, ``explicit-half`` and ``sdpa`` (the positional term as a
batch-shared ``attn_mask``), as :class:`~attncnn.layers.ContentAttention`, whose ``auto`` rule it follows.
"""

from __future__ import annotations

import math

import torch

from ..errors import InputError
from .axis_tables import AxisTables, check_table_width
from .content import ContentAttention

__all__ = ["LearnedContent9ffaaAttention"]


class LearnedContent9ffaaAttention(AxisTables, ContentAttention):
    """Content + learned relative attention as the reference repository at 9ffaa30 computes it.

    Score (module docstring): ``w_row^(h) . e_row(delta_1) + w_col^(h) . e_col(delta_2) +
    q_h . k_h / sqrt(D)``. Parameters (``E = table_dim``, ``M = max_size``):

    * ``row_embeddings.weight``, ``col_embeddings.weight`` ``(2M - 1, E)``: row ``delta + M - 1``
      embeds the shift along image rows (key row - query row), resp. columns;
    * ``head_keys_row.weight``, ``head_keys_col.weight`` ``(N_h, E)``: head h's key vectors;
    * ``query``, ``key``: ``D -> N_h D_h`` with bias (:class:`~attncnn.layers.QueryKeyAttention`);
    * ``value`` (and ``value_in`` when ``head_dim != D``): :class:`~attncnn.layers.GridAttention`.

    Tables start N(0, 1) and the linear maps with PyTorch's default init, as in the reference. Its
    forward and scores are the content layers', with ``D`` for ``D_h`` in the content term and the
    positional term not scaled; a grid larger than ``max_size`` raises InputError.

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop, impl, eval_impl: see
            :class:`~attncnn.layers.ContentAttention` (the reference has ``head_dim = D`` only).
        max_size: largest grid side the tables cover (reference: ``max_position_embeddings = 16``).
        table_dim: width ``E`` of each axis table (default ``dim``, as the reference).

    Raises:
        InputError: a ``table_dim`` below 1, or the base class's errors.
    """

    KINDS = ("learned-content-9ffaa",)
    IMPLS = ("auto", "explicit", "explicit-half", "sdpa")
    CONFIG_KEYS = AxisTables.CONFIG_KEYS          # queries and keys always with bias, as the reference
    EXCLUSIVE_KEYS = ()
    has_positional_term = True

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16, table_dim: int | None = None,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        table_dim = dim if table_dim is None else table_dim
        if table_dim < 1 or max_size < 1:
            raise InputError(f"table_dim and max_size must be >= 1, got {table_dim}, {max_size}")
        self.add_axis_tables(max_size, table_dim)

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """The content term the same for every key (so that it cancels in the softmax), the
        positional term local (Lemma 2 in the learned encoding).

        The query weight becomes 0, head h's query bias the unit vector ``e_0``, and the key weight's row
        of that coordinate 0: then ``q_h . k_h = b_key[h, 0]`` for every key, while every parameter still
        gets a gradient. The tables and head keys are set as :meth:`LearnedRelativeAttention.local_init_
        <attncnn.layers.LearnedRelativeAttention.local_init_>` sets them, so that the score is
        ``-alpha |delta - Delta_h|^2`` plus a constant per head.

        Raises:
            InputError: tables narrower than 3 columns, or a layer without query bias.
        """
        check_table_width(self.table_dim)
        if self.query.bias is None:
            raise InputError("the local init writes the query bias, and this layer has none: build it with "
                             "qk_bias=True")
        nh, dh = self.num_heads, self.head_dim
        self.query.weight.zero_()
        self.query.bias.zero_()
        self.query.bias.view(nh, dh)[:, 0] = 1.0
        self.key.weight.view(nh, dh, self.dim)[:, 0] = 0.0
        self.local_init_tables_(shifts, alpha)

    @property
    def content_scale(self) -> float:
        """``1 / sqrt(D)``, the factor of the content term (the reference's ``hidden_size``)."""
        return 1.0 / math.sqrt(self.dim)

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The positional term's two parts: ``row[h, i, k] = w_row^(h) . e_row(k - i)`` ``(N_h, H, H)``
        and ``col[h, j, l] = w_col^(h) . e_col(l - j)`` ``(N_h, W, W)``, in the parameters' dtype
        (the products' under autocast).

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        return self.table_scores(height, width)

    def positional_term(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """:meth:`grid_term` as a ``(B, N_h, H*W, H*W)`` broadcast view over the batch of ``q``
        (it does not depend on the queries; not scaled, as the reference)."""
        term = self.grid_term(height, width)
        return term.unsqueeze(0).expand(q.shape[0], *term.shape)

    def sdpa_mask(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """One batch-shared bias ``(1, N_h, H*W, H*W)``: the kernel broadcasts it, no ``(B, N_h, N,
        N)`` tensor is formed."""
        return self.grid_term(height, width).to(q.dtype).unsqueeze(0)

    def bilinear_queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Not available: this layer's positional term is read by per-head key vectors, not the queries.

        Raises:
            InputError: always (this kind has no bilinear path).
        """
        raise InputError(f"{self.kind} attention has no bilinear path; choose one of {', '.join(self.impls)}")
