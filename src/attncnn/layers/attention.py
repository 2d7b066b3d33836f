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
  whole batch as one large matrix product; content layers use
  :func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GridAttention", "PositionalAttention", "ContentAttention"]


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
    """

    position_only = True

    def attention_scores(self, height: int, width: int) -> torch.Tensor:
        """Pre-softmax scores ``(N_h, H*W, H*W)`` for an ``height x width`` grid."""
        raise NotImplementedError

    def attention_probs(self, height: int, width: int) -> torch.Tensor:
        """Attention probabilities ``(1, N_h, H*W, H*W)``; each row sums to 1 over the keys.

        Probabilities below ``eps(dtype)**2`` (1.4e-14 in float32, 4.9e-32 in float64) are set to
        exactly 0. Gaussian heads give tiny values far from their centre, and their products with
        gradients in the backward matrix products fall into the subnormal range, which CPUs
        process many times slower (measured here: the quadratic layer's backward took 2x the
        learned layer's at equal FLOPs). The change to any output is at most
        ``H*W * eps**2 * max|value|`` (4e-12 relative for a 16x16 grid in float32).
        """
        probs = torch.softmax(self.attention_scores(height, width), dim=-1)
        threshold = torch.finfo(probs.dtype).eps ** 2
        probs = probs.masked_fill(probs < threshold, 0.0)
        return probs.unsqueeze(0)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid.
            return_attention: also return the probabilities ``(1, N_h, H*W, H*W)`` (explicit path).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            ValueError: wrong rank or channel count (the message gives the expected shape).
        """
        b, h, w = self._check_input(x)
        probs = self.attention_probs(h, w)                       # (1, N_h, N, N)
        dropped = self.attn_drop(probs)                          # one mask for the batch
        if return_attention:
            mixed = dropped @ self.head_values(x)                # (B, N_h, N, D_h)
            return self._output(mixed, b, h, w), probs
        return self._output(self._mix_shared(dropped[0], x), b, h, w)

    def _mix_shared(self, probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Fast path: ``probs (N_h, N, N)`` applied to the batch as one matrix product.

        Returns ``(B, N_h, N, D_h)`` like the explicit path.
        """
        b, h, w, d = x.shape
        n, nh = h * w, self.num_heads
        if self.value_in is None:
            # Every head averages the same tokens: stack the heads' maps into one
            # (N_h*N, N) matrix and multiply the (N, B*D) token matrix once.
            tokens = x.reshape(b, n, d).transpose(0, 1).reshape(n, b * d)     # (N, B*D)
            mixed = (probs.reshape(nh * n, n) @ tokens).reshape(nh, n, b, d)  # (N_h, N, B, D)
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
        """
        b, h, w = self._check_input(x)
        if return_attention or self.value_in is None:
            probs = torch.softmax(self.attention_scores(x), dim=-1)
            dropped = self.attn_drop(probs)
            if self.value_in is None:
                # Every head averages the same tokens: stack the heads' maps of each image into one
                # (N_h*N, N) matrix, so the tokens are never copied once per head.
                n, d = h * w, x.shape[-1]
                mixed = torch.bmm(dropped.reshape(b, self.num_heads * n, n), x.reshape(b, n, d))
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
