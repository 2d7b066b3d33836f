"""The content family: attention maps computed from the input (paper eq. 8, term 1 and more).

:class:`QueryKeyAttention` holds what every content layer shares: queries and keys
``q = x W_qry + b``, ``k = x W_key + b`` split into heads. :class:`ContentAttention` is plain
content attention, softmax of ``q.k / sqrt(D_h)`` plus an optional positional term that
subclasses write in :meth:`ContentAttention.positional_term` (learned relative encodings,
:mod:`~attncnn.layers.learned_content`). GPSA (:mod:`~attncnn.layers.gpsa`) mixes its content
and positional maps after their softmaxes, so it shares the queries and keys only.

Paths (``impl``) of :class:`ContentAttention`'s forward without probabilities:

* ``"explicit"``: the scores ``(B, N_h, N, N)`` materialised, a float32 softmax, the per-image
  product (:func:`~attncnn.layers.mixing.mix_per_image`); the plain formula.
* ``"explicit-half"``: the same, except that under mixed precision the softmax (computed in
  float32) writes its probabilities in bf16: the same forward output (they were rounded to bf16
  before the value product either way), less memory traffic; the backward reads the rounded ones.
* ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` with the positional term
  as ``attn_mask``; ``q.k`` and its softmax run in float32 inside the fused kernel.
* ``"bilinear"``: ``explicit-half`` with its scores through the query-key bilinear form
  (:mod:`~attncnn.layers.bilinear`): queries and keys are never formed.
* ``"auto"``: ``"explicit-half"`` for heads as wide as the model (the paper's ``head_dim = D``),
  else ``"sdpa"`` (there the probabilities are smaller than the per-head vectors a fused kernel
  needs; ``benchmarks/results/attention-paths.md``). Learned relative attention adds
  paths and a rule of its own (:mod:`~attncnn.layers.learned_content`).

Mixed precision (bf16 autocast): queries, keys, ``q.k`` and the value products run in bf16
(float32 accumulation), the explicit scores are rounded to bf16, the softmax computes in float32
(a float32 ``q.k`` would cost several times more for an error of the same order: rounding ``q`` and
``k`` to bf16 already moves the scores as much).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .autocast_rules import matmul_dtype, score_dtype, softmax_in
from .base import GridAttention
from .bilinear import fold_query_map
from .mixing import mix_per_image

__all__ = ["QueryKeyAttention", "ContentAttention"]

#: the bilinear path pads its products' widths to multiples of this many columns (16-byte bf16 rows,
#: what tensor-core kernels read fastest; zero columns add nothing to a dot product)
_ALIGN = 8


def _aligned(vectors: torch.Tensor) -> torch.Tensor:
    """``(N_h, D_h, K)`` vectors with zero vectors appended up to a multiple of :data:`_ALIGN`."""
    pad = -vectors.shape[-1] % _ALIGN
    return torch.cat([vectors, vectors.new_zeros(*vectors.shape[:-1], pad)], dim=-1) if pad else vectors


class QueryKeyAttention(GridAttention):
    """Base of the content family: per-head queries and keys (``query``, ``key``: ``D -> N_h*D_h``).

    Subclasses implement :meth:`input_probs` (and :meth:`input_scores`, :meth:`score_terms`).

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop, impl: as :class:`~attncnn.layers.GridAttention`.
        qk_bias: give ``query`` and ``key`` a bias (PyTorch's and the reference code's default; ConViT: no).
        qk_init_std: draw the ``query`` and ``key`` weights from a normal distribution of this std,
            truncated at +-2 (timm's and ConViT's init, 0.02), biases 0; None: PyTorch's default init.

    Raises:
        InputError: a ``qk_init_std`` that is not positive.
    """

    def __init__(self, dim: int, num_heads: int, *, qk_bias: bool = True, qk_init_std: float | None = None,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.query = nn.Linear(dim, num_heads * self.head_dim, bias=qk_bias)
        self.key = nn.Linear(dim, num_heads * self.head_dim, bias=qk_bias)
        if qk_init_std is not None:
            if not qk_init_std > 0:
                raise InputError(f"qk_init_std must be positive (ConViT: 0.02) or None, got {qk_init_std}")
            with torch.no_grad():
                for linear in (self.query, self.key):
                    nn.init.trunc_normal_(linear.weight, std=qk_init_std, a=-2.0, b=2.0)
                    if linear.bias is not None:
                        linear.bias.zero_()

    def queries_keys(self, x: torch.Tensor, query_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys of every head for the grid ``x (B, H, W, D)``.

        ``q = x W_qry + b_qry`` and ``k = x W_key + b_key`` (paper eq. 8), split into heads.

        Args:
            x: the grid ``(B, H, W, D)``.
            query_scale: multiply the queries by this, applied to ``W_qry`` and ``b_qry`` (a
                ``D x N_h D_h`` product instead of a pass over the queries, forward and backward).

        Returns:
            ``(q, k)``, each ``(B, N_h, H*W, D_h)`` (tokens row-major).
        """
        b, h, w, _ = x.shape
        if query_scale == 1.0:
            q = self.query(x)
        else:
            bias = None if self.query.bias is None else self.query.bias * query_scale
            q = F.linear(x, self.query.weight * query_scale, bias)
        q = q.reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)
        return q, k

    @property
    def content_scale(self) -> float:
        """The factor of the content term, ``1 / sqrt(D_h)``."""
        return 1.0 / math.sqrt(self.head_dim)

    @staticmethod
    def scaled_content(q: torch.Tensor, k: torch.Tensor, onto: torch.Tensor | None = None,
                       scale: float | None = None) -> torch.Tensor:
        """The content scores ``q_h . k_h / sqrt(D_h)`` (paper eq. 8, term 1), added onto ``onto``.

        Args:
            q, k: ``(B, N_h, N, D_h)`` queries and keys (:meth:`queries_keys`).
            onto: a ``(B, N_h, N, N)`` term to add them to (the positional term), or None.
            scale: the factor instead of ``1 / sqrt(D_h)`` (a layer's :attr:`content_scale`), or None.

        Returns:
            ``(B, N_h, N, N)``, in the products' dtype (bf16 under autocast); one ``baddbmm``, so the
            scores are written and rounded once.
        """
        b, nh, n, dh = q.shape
        if onto is None:
            # beta=0: the (expanded, never read) zero only gives the output its shape
            onto, beta = q.new_zeros(()).expand(b * nh, n, n), 0.0
        else:
            onto, beta = onto.reshape(b * nh, n, n), 1.0
        scores = torch.baddbmm(onto, q.reshape(b * nh, n, dh), k.reshape(b * nh, n, dh).transpose(1, 2),
                               beta=beta, alpha=1.0 / math.sqrt(dh) if scale is None else scale)
        return scores.view(b, nh, n, n)

    def input_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities ``(B, N_h, H*W, H*W)`` of the grid ``x``, float32 at least; rows sum to 1."""
        raise NotImplementedError

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`input_probs` (content maps depend on the input)."""
        return self.input_probs(x)


class ContentAttention(QueryKeyAttention):
    """Plain content-based multi-head attention, no positional information (for ablations).

    Scores ``q_h . k_h / sqrt(D_h)`` (paper eq. 8, term 1 only): with mean pooling this model sees a
    bag of tokens. Subclasses add a positional term by
    overriding :meth:`positional_term` (and setting :attr:`has_positional_term`); :meth:`score_terms`
    gives both terms to the analysis tools.

    Args: as :class:`~attncnn.layers.GridAttention`; ``impl`` is one of ``"auto"``,
    ``"explicit"``, ``"explicit-half"``, ``"sdpa"`` (module docstring).
    """

    KINDS = ("content",)
    CONFIG_KEYS = ("qk_bias", "qk_init_std")
    EXCLUSIVE_KEYS = ("qk_bias", "qk_init_std")
    IMPLS = ("auto", "explicit", "explicit-half", "sdpa")

    def positional_term(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor | None:
        """The positional score term, already divided by ``sqrt(D_h)``, or None when there is none.

        Where a subclass writes its positional term (paper eq. 8, term 2): the explicit path adds
        ``q.k / sqrt(D_h)`` onto it, the fused path passes it as ``attn_mask``.

        Args:
            q: queries ``(B, N_h, H*W, D_h)`` from :meth:`queries_keys`.
            height, width: the token grid ``H x W``.

        Returns:
            ``(B, N_h, H*W, H*W)`` (queries on dim -2, keys on dim -1); None here (plain content
            attention has no positional term, :attr:`has_positional_term` is False).
        """
        return None

    def sdpa_mask(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor | None:
        """The fused path's ``attn_mask``: :meth:`positional_term` here."""
        return self.positional_term(q, height, width)

    def score_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The two pre-softmax terms of the grid ``x (B, H, W, D)``, each already scaled.

        Returns:
            ``(content, positional)``: ``content = q_h . k_h / sqrt(D_h)`` ``(B, N_h, H*W, H*W)``
            (paper eq. 8, term 1) and the :meth:`positional_term` ``(B, N_h, H*W, H*W)`` or None.
            Their sum is :meth:`input_scores` (up to float rounding).

        Raises:
            InputError: wrong rank or channel count.
        """
        _, h, w = self.check_input(x)
        q, k = self.queries_keys(x)
        return self.scaled_content(q, k, scale=self.content_scale), self.positional_term(q, h, w)

    def input_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax scores ``(B, N_h, H*W, H*W)`` for the grid ``x (B, H, W, D)``: the sum of
        :meth:`score_terms`, built in one pass over the full-size scores.

        Raises:
            InputError: wrong rank or channel count.
        """
        _, h, w = self.check_input(x)
        q, k = self.queries_keys(x)
        return self.scaled_content(q, k, self.positional_term(q, h, w), self.content_scale)

    def input_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of :meth:`input_scores` over the keys, ``(B, N_h, H*W, H*W)``, float32 at least.

        Raises:
            InputError: wrong rank or channel count.
        """
        scores = self.input_scores(x)
        return torch.softmax(scores, dim=-1, dtype=score_dtype(scores.dtype))

    def path(self, height: int = 0, width: int = 0) -> str:
        """The path :meth:`forward` takes without probabilities: the mode's ``impl``
        (:attr:`mode_impl`), with ``"auto"`` resolved (module docstring; the grid size does not matter)."""
        if self.mode_impl != "auto":
            return self.mode_impl
        return "explicit-half" if self.value_in is None else "sdpa"

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid.
            return_attention: also return the probabilities ``(B, N_h, H*W, H*W)`` (explicit path,
                float32 under autocast).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            InputError: wrong rank or channel count (the message gives the expected shape).
        """
        b, h, w = self.check_input(x)
        path = "explicit" if return_attention else self.path(h, w)
        if path == "sdpa":
            q, k = self.queries_keys(x)
            mixed = F.scaled_dot_product_attention(
                q, k, self.head_values(x), attn_mask=self.sdpa_mask(q, h, w),
                dropout_p=self.attn_drop.p if self.training else 0.0, scale=self.content_scale)
            return self.output(mixed, b, h, w)
        if path == "bilinear":
            return self.mix_scores(self.bilinear_scores(x), x, half=True)[0]
        scores = self.input_scores(x)                             # (B, N_h, N, N), bf16 under autocast
        out, probs = self.mix_scores(scores, x, half=path != "explicit")
        return (out, probs) if return_attention else out

    # -- the bilinear path ------------------------------------------------------------------

    def positional_vectors(self, height: int, width: int) -> torch.Tensor | None:
        """The vectors the queries meet in :meth:`positional_term`, ``(N_h, D_h, S)``, or None (none
        here); with :meth:`positional_queries` and :meth:`positional_keys`, the bilinear path's."""
        return None

    def positional_queries(self, products: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, ...]:
        """Each query's columns of the joint product from its ``(B, N_h, N, S)`` products with
        :meth:`positional_vectors` (already scaled): ``(B, N_h, N, P)`` tensors, P columns in all."""
        return ()

    def positional_keys(self, height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Every key's ``P`` columns of the joint product ``(N, P)``, such that the joint product of
        :meth:`positional_queries` and these is :meth:`positional_term`; None here."""
        return None

    def bilinear_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax scores ``(B, N_h, H*W, H*W)`` of the grid ``x (B, H, W, D)`` through the
        query-key bilinear form ``x_i W_qry W_key^T x_j^T`` (paper eq. 8): :meth:`input_scores` up
        to rounding, as the product of :meth:`bilinear_queries_keys`.

        Raises:
            InputError: wrong rank or channel count (or, for a positional term, a grid its tables
                do not cover).
        """
        b, n = x.shape[0], x.shape[1] * x.shape[2]
        joint_q, joint_k = self.bilinear_queries_keys(x)
        scores = torch.bmm(joint_q.view(b, -1, joint_q.shape[-1]), joint_k.transpose(1, 2))
        return scores.view(b, self.num_heads, n, n)

    def bilinear_queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint queries and keys whose one dot product is the whole score, ``1 / sqrt(D_h)`` included.

        One product maps the tokens to every head's products with ``[W_key | positional vectors |
        b_key]`` (:func:`~attncnn.layers.bilinear.fold_query_map`); the joint queries ``[x W_qry^T
        W_key, positional columns, q . b_key] / sqrt(D_h)`` meet the joint keys ``[x_j, positional
        key columns, 1]``, the same for every head.

        Returns:
            ``(joint_q (B, N_h, H*W, K'), joint_k (B, H*W, K'))``, contiguous, in the products' dtype
            (bf16 under autocast), ``K'`` padded with zero columns to a multiple of 8.

        Raises:
            InputError: wrong rank or channel count (or, for a positional term, a grid its tables
                do not cover).
        """
        b, h, w = self.check_input(x)
        n, nh, d = h * w, self.num_heads, self.dim
        blocks = [self.key.weight.view(nh, self.head_dim, d)]        # q . (W_key x_j): meet W_key's columns
        positional = self.positional_vectors(h, w)
        if positional is not None:
            blocks.append(positional)
        if self.key.bias is not None:
            blocks.append(self.key.bias.view(nh, self.head_dim, 1))    # q . b_key, the same for every key
        vectors = _aligned(torch.cat(blocks, dim=-1))
        weight, bias = fold_query_map(self.query, vectors, 1.0 / math.sqrt(self.head_dim))
        flat = x.reshape(b * n, d)
        products = flat @ weight if bias is None else torch.addmm(bias, flat, weight)   # bf16 under autocast
        products = products.view(b, n, nh, -1).transpose(1, 2)                          # (B, N_h, N, K)
        # one split, not slices: its backward writes the gradient once (each slice's would fill a
        # zero tensor of the products' size and add it to the others')
        sizes = [d, *([positional.shape[-1]] if positional is not None else []),
                 *([1] if self.key.bias is not None else [])]
        parts = products.split(sizes + [vectors.shape[-1] - sum(sizes)], dim=-1)
        queries, keys = [parts[0]], [x.reshape(b, n, d).to(products.dtype)]
        if positional is not None:
            queries += self.positional_queries(parts[1], h, w)
            columns = self.positional_keys(h, w, x.device, products.dtype)
            keys.append(columns.expand(b, *columns.shape))
        if self.key.bias is not None:
            queries.append(parts[len(sizes) - 1])
            keys.append(products.new_ones(()).expand(b, n, 1))
        pad = -sum(q.shape[-1] for q in queries) % _ALIGN
        if pad:
            queries.append(products.new_zeros(()).expand(b, nh, n, pad))
            keys.append(products.new_zeros(()).expand(b, n, pad))
        return torch.cat(queries, dim=-1), torch.cat(keys, dim=-1)

    def mix_scores(self, scores: torch.Tensor, x: torch.Tensor, *, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The explicit paths after the scores: softmax over the keys, dropout, the per-image
        average of the values, the output map.

        Args:
            scores: ``(B, N_h, H*W, H*W)`` pre-softmax scores of the grid ``x (B, H, W, D)``.
            half: write the probabilities in the value products' dtype (``explicit-half``); False:
                float32 at least (``explicit``).

        Returns:
            ``(output (B, H, W, D_out), probs (B, N_h, H*W, H*W))``.
        """
        b, h, w, _ = x.shape
        dtype = matmul_dtype(x)
        if half:
            probs = softmax_in(scores, dtype)       # written in the products' dtype
        else:
            probs = torch.softmax(scores, dim=-1, dtype=score_dtype(scores.dtype))   # float32 at least
        dropped = self.attn_drop(probs).to(dtype)
        return self.output(mix_per_image(dropped, x, self.projected_values(x)), b, h, w), probs
