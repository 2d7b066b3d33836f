"""Multi-head self-attention over a token grid: the shared base and plain content attention.

Every layer here maps a channels-last grid ``(B, H, W, D)`` to ``(B, H, W, D_out)``. Each of the
N_h heads averages value vectors of width ``head_dim`` with its own attention map; the N_h
averages are concatenated and mapped by one linear layer ``value`` of shape
``N_h*head_dim -> D_out``. With the paper's default ``head_dim = D`` (PAPER.md 2.3) there is no
projection before the average: each head averages the tokens themselves and ``value`` holds
the folded matrices ``W^(h) = W_val^(h) W_out`` of Lemma 1 (head h owns input columns
``h*D:(h+1)*D``). With ``head_dim != D`` a projection ``value_in: D -> N_h*head_dim`` comes first.

Two paths compute the same output (tests check they agree):
- the explicit path (``return_attention=True``) materialises the probabilities
  ``(B or 1, N_h, H*W, H*W)`` (queries on dim -2, keys on dim -1) and returns them;
- the fast path: position-only layers apply their input-independent probabilities to the
  whole batch as one large matrix product, or, for separable heads (isotropic quadratic,
  learned position-only) on large enough grids, a row factor and a column factor
  (:mod:`attncnn.layers.separable`); content layers use
  :func:`torch.nn.functional.scaled_dot_product_attention`.

Mixed precision (:mod:`attncnn.layers.precision`): under autocast or with half-precision
inputs, scores and softmax run in float32 and only the value products in the low precision.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .precision import autocast_off, matmul_dtype, score_dtype
from .separable import flush_below, separable_mix

__all__ = ["GridAttention", "PositionalAttention", "ContentAttention", "dense_attention"]


class GridAttention(nn.Module):
    """Base class: input checks, value vectors, and the folded value/output matrix.

    Args:
        dim: token width D of the input grid.
        num_heads: number of heads N_h.
        head_dim: width D_h of each head's value vectors (default D, as in the paper).
        out_dim: output width D_out (default D).
        attn_drop: dropout probability on the attention probabilities (paper: 0.1).
    """

    #: True when the attention probabilities do not depend on the input.
    position_only: bool = False

    def __init__(self, dim: int, num_heads: int, *, head_dim: int | None = None,
                 out_dim: int | None = None, attn_drop: float = 0.0) -> None:
        super().__init__()
        if dim < 1 or num_heads < 1:
            raise ValueError(f"dim and num_heads must be positive, got dim={dim}, num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim if head_dim is None else head_dim
        self.out_dim = dim if out_dim is None else out_dim
        if self.head_dim < 1 or self.out_dim < 1:
            raise ValueError(f"head_dim and out_dim must be positive, got {self.head_dim}, {self.out_dim}")
        self.value_in = None if self.head_dim == dim else nn.Linear(dim, num_heads * self.head_dim)
        self.value = nn.Linear(num_heads * self.head_dim, self.out_dim)
        self.attn_drop = nn.Dropout(attn_drop)

    def _check_input(self, x: torch.Tensor) -> tuple[int, int, int]:
        if x.dim() != 4 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__} expects a channels-last token grid (B, H, W, {self.dim}), "
                f"got shape {tuple(x.shape)}")
        b, h, w, _ = x.shape
        return b, h, w

    def head_values(self, x: torch.Tensor) -> torch.Tensor:
        """Value vectors per head: ``(B, H, W, D) -> (B, N_h, H*W, D_h)``.

        With ``head_dim == dim`` this is a broadcast view of the tokens (no copy).
        """
        b, h, w, d = x.shape
        if self.value_in is None:
            return x.reshape(b, 1, h * w, d).expand(b, self.num_heads, h * w, d)
        v = self.value_in(x).reshape(b, h * w, self.num_heads, self.head_dim)
        return v.transpose(1, 2)

    def _output(self, mixed: torch.Tensor, b: int, h: int, w: int) -> torch.Tensor:
        """``(B, N_h, H*W, D_h)`` head averages -> ``(B, H, W, D_out)`` through ``value``."""
        mixed = mixed.transpose(1, 2).reshape(b, h * w, self.num_heads * self.head_dim)
        return self.value(mixed).reshape(b, h, w, self.out_dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, out_dim={self.out_dim}"


class PositionalAttention(GridAttention):
    """Base class of position-only attention (quadratic and learned-position layers).

    Subclasses implement :meth:`attention_scores`; probabilities do not depend on the input,
    so they are computed once per forward, shared by the batch, and never expanded over it.
    Dropout on them therefore uses one mask for the whole batch, which is what the reference
    code does for these layers (PAPER.md 2.3).

    Separable subclasses (:attr:`is_separable`: a head's score is a row term plus a column term)
    also implement :meth:`axis_scores`; their forward then applies the two factors of
    :meth:`axis_probs` instead of the dense map (:func:`~attncnn.layers.separable.separable_mix`).

    Mixed precision: scores and softmax are computed with autocast off, in float32 at least
    (float16/bfloat16 parameters are upcast); only the products with the values run in
    autocast's dtype.
    """

    position_only = True
    #: Separable fast path: None picks by grid size (see :meth:`takes_separable_path`), True takes
    #: it whenever it is exact, False never (A/B benchmarks, checks). Set it on an instance.
    separable_path: bool | None = None

    @property
    def is_separable(self) -> bool:
        """True when every head's score is ``row[h, i, k] + col[h, j, l]`` (see :meth:`axis_scores`)."""
        return False

    def attention_scores(self, height: int, width: int) -> torch.Tensor:
        """Pre-softmax scores ``(N_h, H*W, H*W)`` for an ``height x width`` grid."""
        raise NotImplementedError

    def axis_scores(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column score terms ``(N_h, H, H)`` and ``(N_h, W, W)`` of a separable layer:
        ``attention_scores[h, (i, j), (k, l)] == row[h, i, k] + col[h, j, l]``.

        Raises:
            ValueError: the layer is not separable (:attr:`is_separable` is False).
        """
        raise ValueError(f"{type(self).__name__} is not separable: its scores couple rows and columns; "
                         "use attention_probs")

    def _score_context(self):
        """Autocast off on the parameters' device: scores and softmax run in float32 or wider."""
        return autocast_off(self.value.weight.device)

    def attention_probs(self, height: int, width: int) -> torch.Tensor:
        """Attention probabilities ``(1, N_h, H*W, H*W)``; each row sums to 1 over the keys.

        Computed with autocast off, in float32 at least (float64 for float64 parameters), and
        returned in that dtype; the forward casts them to the product dtype afterwards.

        Probabilities below ``eps(dtype)**2`` of that float32/float64 dtype (1.4e-14 in float32,
        4.9e-32 in float64) are set to exactly 0. Gaussian heads give tiny values far from their
        centre, and their products with gradients in the backward matrix products fall into the
        subnormal range, which CPUs process many times slower (measured here: the quadratic
        layer's backward took 2x the learned layer's at equal FLOPs). The change to any output is
        at most ``H*W * eps**2 * max|value|`` (4e-12 relative for a 16x16 grid in float32).
        Under bf16 autocast the threshold stays float32's: bfloat16 has float32's exponent range
        and CPU bf16 GEMMs accumulate in float32, so the same values keep the products normal,
        whereas bfloat16's own ``eps**2`` (6.1e-5) would drop up to ``H*W * 6.1e-5`` (1.6 % at
        16x16) of a row's mass. (float16 products: values below 6.1e-5 become float16 subnormals
        in the cast, which GPUs process at full speed and CPU GEMMs widen to normal float32.)
        """
        with self._score_context():
            probs = torch.softmax(self.attention_scores(height, width), dim=-1)
        threshold = torch.finfo(probs.dtype).eps ** 2
        return flush_below(probs, threshold).unsqueeze(0)

    def axis_probs(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The two factors of a separable layer's probabilities (paper eq. 9 / eq. 8 term 4):
        ``probs[h, (i, j), (k, l)] = row[h, i, k] * col[h, j, l]``.

        Returns:
            ``(row, col)``: ``(N_h, H, H)`` and ``(N_h, W, W)``, softmaxes of :meth:`axis_scores`
            over the key axis (dim -1), in float32 at least (autocast off, as
            :meth:`attention_probs`). Entries below ``eps(dtype)`` (1.2e-7 in float32, 2.2e-16 in
            float64) are set to 0, so each row sums to 1 within ``H * eps`` (``W * eps``).

        Why ``eps`` and not the dense path's ``eps**2``: in the backward of the two products a
        gradient meets a row factor times a column factor (``dL/dv = rows^T (cols^T g)``), so the
        smallest products are ``t**2 * |g|`` for a threshold ``t``; ``t = eps`` keeps them at
        ``eps**2 * |g|``, as normal as the dense path's. The outputs move by at most
        ``(H + W) * eps * max|value|`` (3.8e-6 relative for 16x16 in float32, below the rounding
        of a float32 sum over 256 keys; 7e-15 in float64). Measured without the flush (alpha = 2,
        16x16, width 64, 81 subnormal factor entries): no slowdown on this AMD EPYC (679 vs
        660 ms per training step, within noise), unlike the dense map's softmax backward; the
        flush is kept because it costs two masks on ``(N_h, L, L)`` tensors and gives the dense
        path's guarantee on CPUs that do slow down on subnormal operands.

        Raises:
            ValueError: the layer is not separable, or the grid is too large for its tables.
        """
        if not self.is_separable:
            self.axis_scores(height, width)          # raises the explanation
        with self._score_context():
            row, col = self.axis_scores(height, width)
            row, col = torch.softmax(row, dim=-1), torch.softmax(col, dim=-1)
        threshold = torch.finfo(row.dtype).eps
        return flush_below(row, threshold), flush_below(col, threshold)

    def takes_separable_path(self, height: int, width: int, return_attention: bool = False) -> bool:
        """Whether :meth:`forward` applies :meth:`axis_probs` (True) or the dense map (False).

        The separable path is exact, so it needs: a separable layer, no probabilities to return,
        and no dropout on the map (a dropout mask on ``(N, N)`` entries does not factor), i.e.
        eval mode or ``attn_drop.p == 0``. Then :attr:`separable_path` decides: True always
        takes it, False never, None (default) takes it when the grid is large enough to gain,
        ``H*W >= 6 (H + W)`` (the dense/separable multiply-add ratio; 12x12 and larger squares).

        Why 6: the separable products are memory-bound (K = H or W; two extra passes over the
        ``N_h x B x N x D_h`` intermediate) where the dense one is compute-bound (K = N). Measured
        on one layer (width 64, 9 heads, batch 100; 1 thread, CPU time, medians of 9 A/B-alternated
        runs on a shared 2-core AVX512-BF16 machine), separable time / dense time for the forward
        and the training step: 4x4 (ratio 2) 2.7 / 2.2 in float32, 1.7 / 1.9 under bf16 autocast;
        8x8 (ratio 4) 1.6 / 1.3 and 1.05 / 1.3; 12x12 (ratio 6) 0.74 / 0.97 and 0.73 / 0.78.
        16x16 (ratio 8): see :meth:`forward`.
        """
        dropout = self.training and self.attn_drop.p > 0
        if not self.is_separable or return_attention or dropout or self.separable_path is False:
            return False
        return self.separable_path is True or height * width >= 6 * (height + width)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid.
            return_attention: also return the probabilities ``(1, N_h, H*W, H*W)`` (explicit
                path), float32 under autocast (float64 for a float64 layer).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            ValueError: wrong rank or channel count (the message gives the expected shape).

        Paths: separable when :meth:`takes_separable_path` says so, else the dense map as one
        batch-shared product. At 16x16 tokens and batch 100 (wall time, 2 threads, medians of 7
        A/B-alternated runs, shared 2-core AVX512-BF16 machine, load 3-4), dense time / separable
        time, forward and training step: paper layer (width 400, 9 heads) quadratic 1.11 / 1.19
        in float32 and 1.17 / 1.11 under bf16 autocast, learned 1.14 / 1.24 and 1.12 / 1.15;
        6-layer width-64 quadratic model 1.04 / 1.27 and 1.40 / 1.37. At width 400 the output map
        ``value`` (N_h*D -> D) costs more than the dense average itself, which caps the gain.
        """
        b, h, w = self._check_input(x)
        dtype = matmul_dtype(x)
        if self.takes_separable_path(h, w, return_attention):
            rows, cols = self.axis_probs(h, w)                   # (N_h, H, H), (N_h, W, W)
            values = x if self.value_in is None else self.value_in(x).reshape(b, h, w, self.num_heads, -1)
            return self.value(separable_mix(rows, cols, values, dtype))
        probs = self.attention_probs(h, w)                       # (1, N_h, N, N)
        dropped = self.attn_drop(probs).to(dtype)                # one mask for the batch
        if return_attention:
            mixed = dropped @ self.head_values(x)                # (B, N_h, N, D_h)
            return self._output(mixed, b, h, w), probs
        return self._output(self._mix_shared(dropped[0], x), b, h, w)

    def _mix_shared(self, probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Dense fast path: ``probs (N_h, N, N)`` applied to the batch as one matrix product.

        Returns ``(B, N_h, N, D_h)`` like the explicit path.
        """
        b, h, w, d = x.shape
        n, nh = h * w, self.num_heads
        if self.value_in is None:
            # Every head averages the same tokens: stack the heads' maps into one
            # (N_h*N, N) matrix and multiply the (N, B*D) token matrix once. The copy that
            # puts tokens first also casts them to the product dtype (one pass, not two).
            tokens = x.reshape(b, n, d).transpose(0, 1).to(dtype=probs.dtype, memory_format=torch.contiguous_format)
            mixed = (probs.reshape(nh * n, n) @ tokens.reshape(n, b * d)).reshape(nh, n, b, d)  # (N_h, N, B, D)
        else:
            v = self.value_in(x).reshape(b, n, nh, self.head_dim)
            v = v.permute(2, 1, 0, 3).reshape(nh, n, b * self.head_dim)       # (N_h, N, B*D_h)
            mixed = torch.bmm(probs, v).reshape(nh, n, b, self.head_dim)      # (N_h, N, B, D_h)
        return mixed.permute(2, 0, 1, 3)                                       # (B, N_h, N, D_h)


class ContentAttention(GridAttention):
    """Plain content-based multi-head attention, no positional information (for ablations).

    Scores ``q_h . k_h / sqrt(D_h)`` with ``q = x W_qry + b``, ``k = x W_key + b``
    (paper eq. 8, term 1 only). With mean pooling this model sees a bag of tokens.

    Subclasses add a positional term by overriding :meth:`positional_term` (and setting
    :attr:`has_positional_term`); :meth:`score_terms` gives both terms to the analysis tools.

    Args: as :class:`GridAttention`.
    """

    #: True when :meth:`positional_term` returns a tensor (False: plain content attention).
    has_positional_term: bool = False
    #: Under mixed precision, the explicit path's softmax writes its probabilities in the value
    #: products' dtype (bf16) instead of float32 (it still computes max, exp and sum in float32, and
    #: the probabilities were rounded to bf16 before the value product either way, so the forward
    #: output is the same; the backward reads the bf16-rounded probabilities). Measured on
    #: learned-content-mini's layer (batch 100, 9 heads of width 64, 16x16 tokens, 2 cores, bf16
    #: autocast, forward + backward): 1.48 s vs 2.10 s with the float32 softmax, identical outputs;
    #: ``benchmarks/half_softmax.py`` measures the whole training step. False restores float32.
    #: ``return_attention=True`` always returns float32 probabilities.
    half_softmax: bool = True

    def __init__(self, dim: int, num_heads: int, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.query = nn.Linear(dim, num_heads * self.head_dim)
        self.key = nn.Linear(dim, num_heads * self.head_dim)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys of every head for the grid ``x (B, H, W, D)``.

        ``q = x W_qry + b_qry`` and ``k = x W_key + b_key`` (paper eq. 8), split into heads.

        Returns:
            ``(q, k)``, each ``(B, N_h, H*W, D_h)`` (tokens row-major).
        """
        b, h, w, _ = x.shape
        q = self.query(x).reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)
        return q, k

    def positional_term(self, q: torch.Tensor, height: int, width: int) -> torch.Tensor | None:
        """The positional score term, already divided by ``sqrt(D_h)``, or None when there is none.

        The single place where a subclass writes its positional term (paper eq. 8, term 2 for
        learned relative encodings). Both paths use it: the explicit path adds ``q.k / sqrt(D_h)``
        onto it, the fast path passes it to the fused kernel as ``attn_mask``.

        Args:
            q: queries ``(B, N_h, H*W, D_h)`` from :meth:`queries_keys`.
            height, width: the token grid ``H x W``.

        Returns:
            ``(B, N_h, H*W, H*W)`` (queries on dim -2, keys on dim -1); None here (plain content
            attention has no positional term, :attr:`has_positional_term` is False).
        """
        return None

    def score_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The two pre-softmax terms of the grid ``x (B, H, W, D)``, each already scaled.

        Returns:
            ``(content, positional)``: ``content = q_h . k_h / sqrt(D_h)`` ``(B, N_h, H*W, H*W)``
            (paper eq. 8, term 1) and the :meth:`positional_term` ``(B, N_h, H*W, H*W)`` or None.
            Their sum is :meth:`attention_scores` (up to float rounding).

        Raises:
            ValueError: wrong rank or channel count.
        """
        _, h, w = self._check_input(x)
        q, k = self.queries_keys(x)
        return self._add_content(None, q, k), self.positional_term(q, h, w)

    def attention_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax scores ``(B, N_h, H*W, H*W)`` for the grid ``x (B, H, W, D)``: the sum of
        :meth:`score_terms`, built in one pass over the full-size scores.

        Raises:
            ValueError: wrong rank or channel count.
        """
        _, h, w = self._check_input(x)
        q, k = self.queries_keys(x)
        return self._add_content(self.positional_term(q, h, w), q, k)

    def _add_content(self, positional: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``positional + q.k / sqrt(D_h)`` ``(B, N_h, N, N)`` (just the content term when None)."""
        b, nh, n, dh = q.shape
        scale = 1.0 / math.sqrt(dh)
        if positional is None:
            return (q @ k.transpose(-2, -1)) * scale
        # One pass over the (B, N_h, N, N) scores: the matrix product adds q.k / sqrt(D_h) onto
        # the positional term (baddbmm), instead of scaling and adding full-size tensors apart
        # (measured: those extra passes cost as much as the reference's dense einsums saved).
        scores = torch.baddbmm(positional.reshape(b * nh, n, n), q.reshape(b * nh, n, dh),
                               k.reshape(b * nh, n, dh).transpose(1, 2), alpha=scale)
        return scores.view(b, nh, n, n)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer; see :meth:`PositionalAttention.forward` (probabilities are ``(B, N_h, N, N)``).

        Which path is fast was measured on the paper's configuration (N = 256 tokens, heads as
        wide as the model, D_h = 400; 2 CPU cores, benchmarks/compare.py): there the probabilities
        ``(B, N_h, N, N)`` are smaller than the per-head vectors ``(B, N_h, N, D_h)`` a fused kernel
        would need (CPU flash attention also requires equal query and value widths), and fused
        :func:`~torch.nn.functional.scaled_dot_product_attention` with the positional term as a
        bias was both slower and larger than materialising the scores. So with ``head_dim == dim``
        both paths compute the scores explicitly; with a value projection (``head_dim != dim``,
        the usual narrow heads) the fast path is SDPA with the positional term as ``attn_mask``.

        Mixed precision (bf16 autocast): queries, keys and the ``q.k`` product run in bf16
        (float32 accumulation), the explicit scores are rounded to bf16 (by the product, and once
        more by the ``1/sqrt(D_h)`` scale or the positional sum), and the softmax runs in float32
        (the returned probabilities are float32); the value products run in bf16. Computing
        ``q.k`` in float32 instead would cost about 3x the bf16 product (measured on the paper's
        shapes, 2 cores with AVX512-BF16: 150-190 ms vs 53-65 ms for 20 images) for an error of
        the same order: on random ``q, k`` with scores up to 43, rounding ``q`` and ``k`` to bf16
        moved scores by up to 0.11 and rounding the product by 0.19 more. The SDPA path computes
        ``q.k`` and its softmax in float32 inside the fused kernel (checked: its error is the
        output's rounding); autocast hands it the positional term in bf16.
        """
        b, h, w = self._check_input(x)
        if return_attention or self.value_in is None:
            scores = self.attention_scores(x)                     # (B, N_h, N, N), bf16 under autocast
            dtype = matmul_dtype(x)
            if return_attention or not self.half_softmax or scores.dtype != dtype:
                probs = torch.softmax(scores, dim=-1, dtype=score_dtype(scores.dtype))   # float32 at least
            else:
                # The probabilities meet the values in bf16 anyway: the softmax kernel computes in
                # float32 and writes bf16 directly, so no float32 copy of the (B, N_h, N, N) map is
                # made, cast and kept for the backward (see half_softmax).
                probs = torch.softmax(scores, dim=-1)
            dropped = self.attn_drop(probs).to(dtype)
            if self.value_in is None:
                # Every head averages the same tokens: stack the heads' maps of each image into one
                # (N_h*N, N) matrix, so the tokens are never copied once per head.
                n, d = h * w, x.shape[-1]
                mixed = torch.bmm(dropped.reshape(b, self.num_heads * n, n), x.reshape(b, n, d).to(dtype))
                mixed = mixed.view(b, self.num_heads, n, d)
            else:
                mixed = dropped @ self.head_values(x)
            out = self._output(mixed, b, h, w)
            return (out, probs) if return_attention else out
        q, k = self.queries_keys(x)
        mixed = F.scaled_dot_product_attention(
            q, k, self.head_values(x), attn_mask=self.positional_term(q, h, w),
            dropout_p=self.attn_drop.p if self.training else 0.0, scale=1.0 / math.sqrt(self.head_dim))
        return self._output(mixed, b, h, w)


@contextlib.contextmanager
def dense_attention(model: nn.Module) -> Iterator[None]:
    """While the block runs, every position-only layer of ``model`` takes the dense path
    (``separable_path = False``); the previous settings come back afterwards.

    The separable path computes the same outputs with fewer multiply-adds; counts of a model's
    operations meant to be compared with the paper (Table 1's MACs, "model FLOP/s") are of the
    dense (HW x HW) average, so they are taken under this context.
    """
    layers = [m for m in model.modules() if isinstance(m, PositionalAttention)]
    saved = [layer.separable_path for layer in layers]
    for layer in layers:
        layer.separable_path = False
    try:
        yield
    finally:
        for layer, value in zip(layers, saved):
            layer.separable_path = value
