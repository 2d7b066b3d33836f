"""Content + learned relative attention in the reference repository's form at commit 9ffaa30
(``Learned2DRelativeSelfAttention`` with ``use_attention_data=True``, ``models/bert.py``).

Score of head h for the query at ``(i, j)`` and the key at ``(k, l)`` (``delta = key - query``):

    ``A = w_row^(h) . e_row(k - i) + w_col^(h) . e_col(l - j) + q_h . k_h / sqrt(D)``

paper eq. 8, terms 1 and 4 (r_delta = [e_row(delta_1); e_col(delta_2)] read by a per-head key
vector, the same for every query), where the content term is divided by the model width ``D``
(the reference's ``hidden_size``; its heads are always ``D`` wide, so that this is ``sqrt(D_h)``
there) and the positional term is not scaled. The tables are ``table_dim`` wide per axis
(default ``D``, the reference's ``position_encoding_size = hidden_size``: 400 at the paper's size).
At the paper's size (6 layers, width 400, 9 heads, 2x2 space-to-depth on CIFAR-10) the network has
29,601,882 parameters, 117,600 more than :class:`~attncnn.layers.LearnedRelativeContentAttention`
(``learned-content``, the q.r form whose 29,484,282 match Table 1's 29.5 M).

What differs from the reference's code, not its function: ``row_*`` here is the shift along
image rows (delta_1), ``col_*`` along image columns (delta_2); the reference names them the other
way round (its ``row_embeddings``/``head_keys_row`` score the shift along image columns), which
also limits it to square grids; this layer takes any grid up to ``max_size`` on each axis. Its
forward ignores the reference's ``attention_mask`` argument, as the reference's layer does.

Paths (``impl``): ``explicit`` and ``explicit-half`` (as :class:`~attncnn.layers.ContentAttention`:
the ``(B, N_h, HW, HW)`` scores written, the positional term added in the same product) and
``sdpa`` (the fused kernel with the positional term as a batch-shared ``(1, N_h, HW, HW)``
``attn_mask``); ``auto`` follows the content layers' rule (``explicit-half`` for heads as wide as
the model, else ``sdpa``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .conv_init import axis_coefficients, table_features
from .content import ContentAttention
from .learned import _INIT_COLUMNS, _check_table_width      # the same (d^2, d, 1) columns as `learned`
from .relative import table_rows

__all__ = ["LearnedContent9ffaaAttention"]

class LearnedContent9ffaaAttention(ContentAttention):
    """Content + learned relative attention as the reference repository at 9ffaa30 computes it.

    Score (module docstring): ``w_row^(h) . e_row(delta_1) + w_col^(h) . e_col(delta_2) +
    q_h . k_h / sqrt(D)``. Parameters (``E = table_dim``, ``M = max_size``):

    * ``row_embeddings.weight`` ``(2M - 1, E)``: row ``delta_1 + M - 1`` embeds the shift along
      image rows (key row - query row);
    * ``col_embeddings.weight`` ``(2M - 1, E)``: likewise along image columns;
    * ``head_keys_row.weight``, ``head_keys_col.weight`` ``(N_h, E)``: head h's key vectors
      ``w_row^(h)``, ``w_col^(h)`` (bias-free linear maps ``E -> N_h``);
    * ``query``, ``key``: ``D -> N_h D_h`` with bias (:class:`~attncnn.layers.QueryKeyAttention`);
    * ``value`` (and ``value_in`` when ``head_dim != D``): :class:`~attncnn.layers.GridAttention`.

    Tables start N(0, 1) and the linear maps with PyTorch's default init, as in the reference.

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
    CONFIG_KEYS = ("max_size", "table_dim")     # queries and keys always with bias, as the reference
    EXCLUSIVE_KEYS = ()
    has_positional_term = True

    def __init__(self, dim: int, num_heads: int, *, max_size: int = 16, table_dim: int | None = None,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.max_size = max_size
        self.table_dim = dim if table_dim is None else table_dim
        if self.table_dim < 1 or max_size < 1:
            raise InputError(f"table_dim and max_size must be >= 1, got {self.table_dim}, {max_size}")
        self.row_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.col_embeddings = nn.Embedding(2 * max_size - 1, self.table_dim)
        self.head_keys_row = nn.Linear(self.table_dim, num_heads, bias=False)
        self.head_keys_col = nn.Linear(self.table_dim, num_heads, bias=False)

    @classmethod
    def check_config(cls, kind: str, config) -> None:
        super().check_config(kind, config)
        if config.init == "conv":
            _check_table_width(config.table_dim or config.dim)

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """The content term the same for every key (so that it cancels in the softmax), the
        positional term local (Lemma 2 in the learned encoding).

        The query weight becomes 0 and head h's query bias the first unit vector ``e_0``, and the
        key weight's row of that coordinate 0 in every head: then ``q_h . k_h = b_key[h, 0]`` for
        every key. (A zero query would cancel the content term too, but the key map would get no
        gradient at the first step; this way every parameter learns from the start.) The tables
        and head keys are set as :meth:`LearnedRelativeAttention.local_init_
        <attncnn.layers.LearnedRelativeAttention.local_init_>` sets them: columns 0-2 of both
        tables ``(d^2, d, 1)``, the others 0; head keys ``(-alpha, 2 alpha Delta_a, -alpha
        Delta_a^2)`` on those columns. The score is then ``-alpha |delta - Delta_h|^2`` plus a
        constant per head.

        Raises:
            InputError: tables narrower than 3 columns, or a layer without query bias.
        """
        _check_table_width(self.table_dim)
        if self.query.bias is None:
            raise InputError("the local init writes the query bias, and this layer has none: build it with "
                             "qk_bias=True")
        nh, dh = self.num_heads, self.head_dim
        self.query.weight.zero_()
        self.query.bias.zero_()
        self.query.bias.view(nh, dh)[:, 0] = 1.0
        self.key.weight.view(nh, dh, self.dim)[:, 0] = 0.0
        for axis, (table, keys) in enumerate(((self.row_embeddings, self.head_keys_row),
                                              (self.col_embeddings, self.head_keys_col))):
            table.weight.zero_()
            table.weight[:, :_INIT_COLUMNS] = table_features(self.max_size, table.weight)
            keys.weight[:, :_INIT_COLUMNS] = axis_coefficients(shifts[:, axis], alpha)

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
        e_row = table_rows(self.row_embeddings, height, self.max_size, "height")     # (H, H, E)
        e_col = table_rows(self.col_embeddings, width, self.max_size, "width")       # (W, W, E)
        row = F.linear(e_row, self.head_keys_row.weight)                               # (H, H, N_h)
        col = F.linear(e_col, self.head_keys_col.weight)                               # (W, W, N_h)
        return row.permute(2, 0, 1), col.permute(2, 0, 1)

    def grid_term(self, height: int, width: int) -> torch.Tensor:
        """The positional term of every pair, ``(N_h, H*W, H*W)`` (queries on dim -2, keys on
        dim -1, row-major), the same for every image: ``row[h, i, k] + col[h, j, l]``.

        Raises:
            InputError: ``height`` or ``width`` exceeds ``max_size``.
        """
        row, col = self.axis_scores(height, width)
        scores = row[:, :, None, :, None] + col[:, None, :, None, :]                    # (N_h, H, W, H, W)
        n = height * width
        return scores.reshape(self.num_heads, n, n)

    def positional_term(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """:meth:`grid_term` as a ``(B, N_h, H*W, H*W)`` broadcast view over the batch of ``q``
        (it does not depend on the queries; not scaled, as the reference)."""
        term = self.grid_term(height, width)
        return term.unsqueeze(0).expand(q.shape[0], *term.shape)

    def score_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two pre-softmax terms of the grid ``x (B, H, W, D)``.

        Returns:
            ``(content, positional)``: ``q_h . k_h / sqrt(D)`` ``(B, N_h, H*W, H*W)`` and the
            positional term (:meth:`positional_term`, a broadcast view). Their sum is :meth:`input_scores`.

        Raises:
            InputError: wrong rank or channel count, or a grid larger than ``max_size``.
        """
        _, h, w = self.check_input(x)
        q, k = self.queries_keys(x)
        return self._scores(q, k), self.positional_term(q, h, w)

    def input_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax scores ``(B, N_h, H*W, H*W)`` of the grid ``x``: both terms in one product.

        Raises:
            InputError: wrong rank or channel count, or a grid larger than ``max_size``.
        """
        _, h, w = self.check_input(x)
        q, k = self.queries_keys(x)
        return self._scores(q, k, onto=self.positional_term(q, h, w))

    def _scores(self, q: torch.Tensor, k: torch.Tensor, onto: torch.Tensor | None = None) -> torch.Tensor:
        """``q . k / sqrt(D)`` (+ ``onto``), written once: the factor and the sum are applied to
        the product's accumulator (as :meth:`ContentAttention.scaled_content
        <attncnn.layers.ContentAttention.scaled_content>`, with ``D`` for ``D_h``)."""
        b, nh, n, dh = q.shape
        if onto is None:
            onto, beta = q.new_zeros(()).expand(b * nh, n, n), 0.0
        else:
            onto, beta = onto.reshape(b * nh, n, n), 1.0
        scores = torch.baddbmm(onto, q.reshape(b * nh, n, dh), k.reshape(b * nh, n, dh).transpose(1, 2),
                               beta=beta, alpha=self.content_scale)
        return scores.view(b, nh, n, n)

    def bilinear_queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Not available: the base class's bilinear form scales by ``sqrt(D_h)`` and folds only a
        positional term read by the queries, and this layer's is read by per-head key vectors.

        Raises:
            InputError: always (this kind has no bilinear path).
        """
        raise InputError(f"{self.kind} attention has no bilinear path; choose one of {', '.join(self.impls)}")

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid (``H, W <= max_size``).
            return_attention: also return the probabilities ``(B, N_h, H*W, H*W)`` (explicit path,
                float32 under autocast).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            InputError: wrong rank or channel count, or a grid larger than ``max_size``.
        """
        b, h, w = self.check_input(x)
        path = "explicit" if return_attention else self.path(h, w)
        if path == "sdpa":
            q, k = self.queries_keys(x)
            # one batch-shared bias: the kernel broadcasts it, no (B, N_h, N, N) tensor is formed
            bias = self.grid_term(h, w).to(q.dtype).unsqueeze(0)                       # (1, N_h, N, N)
            mixed = F.scaled_dot_product_attention(
                q, k, self.head_values(x), attn_mask=bias,
                dropout_p=self.attn_drop.p if self.training else 0.0, scale=self.content_scale)
            return self.output(mixed, b, h, w)
        scores = self.input_scores(x)
        out, probs = self.mix_scores(scores, x, half=path != "explicit")
        return (out, probs) if return_attention else out

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_size={self.max_size}, table_dim={self.table_dim}"
