"""Gated positional self-attention (GPSA), the attention layer of ConViT (d'Ascoli et al., ICML 2021, sec. 3.1).

Each head h mixes a content map and a positional map *after* their softmaxes:

    content     C_h = softmax_k(q_h . k_h / sqrt(D_h))                       (B, N_h, N, N)
    positional  P_h = softmax_k(v_pos^(h) . r_delta)                         (1, N_h, N, N)
    gated       A_h = ((1 - g_h) C_h + g_h P_h) / sum_k[(1 - g_h) C_h + g_h P_h],   g_h = sigmoid(lambda_h)

with ``q = x W_qry + b``, ``k = x W_key + b`` split into heads of width D_h, the shift
``delta = key - query`` in tokens (component 0 along the rows), and the fixed relative encoding
``r_delta = (delta_1, delta_2, delta_1^2 + delta_2^2)`` (ConViT's; the quadratic encoding of
paper eq. 9 with its components reordered). ``v_pos^(h)`` (``v_pos``, ``(N_h, 3)``) is learned per
head; ``lambda_h`` (``gate_logits``, ``(N_h,)``) is ConViT's gating parameter, 1 at
initialisation (``g = 0.73``). The renormalisation is ConViT's; both maps already sum to 1, so it
only removes rounding.

Local ("convolutional") initialisation (ConViT sec. 3.1, :func:`attncnn.layers.conv_init.local_init_`):
``v_pos^(h) = alpha (2 Delta_1^(h), 2 Delta_2^(h), -1)`` gives the positional score
``-alpha |delta - Delta^(h)|^2 + alpha |Delta^(h)|^2``, a discrete Gaussian around the head's shift.
Without it ``v_pos`` starts like the weight of ``nn.Linear(3, N_h)`` (uniform in +-1/sqrt(3)).

Weight decay: ``v_pos`` and ``gate_logits`` are excluded (:meth:`GatedPositionalAttention.no_weight_decay`),
by the project's rule for positional parameters (the reference code exempts the quadratic centres
and spreads, PAPER.md 4): decay would pull ``v_pos`` to 0, i.e. every positional map towards
uniform, and the gates towards 1/2, which is a prior on the geometry rather than a size penalty.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import GridAttention
from .precision import autocast_off, matmul_dtype, score_dtype
from .relative import relative_offsets
from .separable import flush_below

__all__ = ["GatedPositionalAttention", "gpsa_features"]


def gpsa_features(height: int, width: int, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ConViT's relative encoding ``r_delta = (delta_1, delta_2, delta_1^2 + delta_2^2)`` of every
    (query, key) pair: ``(H*W, H*W, 3)``, tokens row-major, in token units (cached offsets)."""
    d = relative_offsets(height, width, device, dtype)                  # (N, N, 2)
    return torch.cat([d, d.square().sum(-1, keepdim=True)], dim=-1)


class GatedPositionalAttention(GridAttention):
    """Gated positional self-attention over a token grid (ConViT's GPSA, see the module docstring).

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop: see :class:`~attncnn.layers.GridAttention`
            (``head_dim`` is the width of queries, keys and values; default D, the paper's
            full-width heads). Dropout acts on the gated probabilities, one mask per image.
        gate_init: initial ``lambda_h`` of every head (ConViT: 1).
        freeze_gate: keep ``lambda`` fixed at ``gate_init`` (``requires_grad=False``).

    Parameters: ``query`` and ``key`` (``D -> N_h*D_h``), ``v_pos`` ``(N_h, 3)``, ``gate_logits``
    ``(N_h,)``, and the value/output maps of :class:`GridAttention`.
    """

    has_positional_term = True
    #: Fast path for ``forward`` without probabilities: "sdpa" (fused content attention plus the
    #: batch-shared positional product) or "explicit" (the gated map materialised per image).
    fast_path: str = "sdpa"

    def __init__(self, dim: int, num_heads: int, *, gate_init: float = 1.0, freeze_gate: bool = False,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.query = nn.Linear(dim, num_heads * self.head_dim)
        self.key = nn.Linear(dim, num_heads * self.head_dim)
        self.v_pos = nn.Parameter(torch.empty(num_heads, 3))
        self.gate_logits = nn.Parameter(torch.full((num_heads,), float(gate_init)), requires_grad=not freeze_gate)
        self.reset_positional_parameters()

    @torch.no_grad()
    def reset_positional_parameters(self) -> None:
        """Draw ``v_pos`` uniform in +-1/sqrt(3), as ``nn.Linear(3, N_h)``'s weight (ConViT without local init)."""
        bound = 1.0 / math.sqrt(3.0)
        self.v_pos.uniform_(-bound, bound)

    @property
    def freeze_gate(self) -> bool:
        """True when ``gate_logits`` is not trained."""
        return not self.gate_logits.requires_grad

    def gates(self) -> torch.Tensor:
        """Per-head gate ``g_h = sigmoid(lambda_h)``, ``(N_h,)``: the weight of the positional map
        (1 = purely positional, 0 = purely content)."""
        return torch.sigmoid(self.gate_logits)

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser must not decay: ``v_pos`` and ``gate_logits``."""
        return {"v_pos", "gate_logits"}

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys ``(B, N_h, H*W, D_h)`` of the grid ``x (B, H, W, D)``."""
        b, h, w, _ = x.shape
        q = self.query(x).reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).reshape(b, h * w, self.num_heads, self.head_dim).transpose(1, 2)
        return q, k

    def positional_scores(self, height: int, width: int) -> torch.Tensor:
        """``v_pos^(h) . r_delta`` for every pair: ``(N_h, H*W, H*W)``, float32 at least, autocast off."""
        with autocast_off(self.v_pos.device):
            v_pos = self.v_pos.to(score_dtype(self.v_pos.dtype))
            r = gpsa_features(height, width, v_pos.device, v_pos.dtype)    # (N, N, 3)
            return torch.einsum("qkc,hc->hqk", r, v_pos)

    def positional_probs(self, height: int, width: int) -> torch.Tensor:
        """The positional maps ``P`` ``(1, N_h, H*W, H*W)``, shared by the batch; rows sum to 1.

        Softmax in float32 at least (autocast off); entries below ``eps(dtype)**2`` are set to 0,
        as :meth:`~attncnn.layers.PositionalAttention.attention_probs` does (same reason: keep the
        backward products out of the subnormal range).
        """
        with autocast_off(self.v_pos.device):
            probs = torch.softmax(self.positional_scores(height, width), dim=-1)
        return flush_below(probs, torch.finfo(probs.dtype).eps ** 2).unsqueeze(0)

    def score_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two pre-softmax scores of the grid ``x (B, H, W, D)`` (each has its own softmax).

        Returns:
            ``(content, positional)``: ``q_h . k_h / sqrt(D_h)`` ``(B, N_h, H*W, H*W)`` and
            ``v_pos^(h) . r_delta`` broadcast to ``(B, N_h, H*W, H*W)`` (a view, not a copy).

        Raises:
            ValueError: wrong rank or channel count.
        """
        b, h, w = self._check_input(x)
        q, k = self.queries_keys(x)
        content = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        positional = self.positional_scores(h, w)
        return content, positional.unsqueeze(0).expand(b, *positional.shape)

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """The gated probabilities ``A`` ``(B, N_h, H*W, H*W)`` (module docstring), float32 at least;
        every row sums to 1 over the keys.

        Raises:
            ValueError: wrong rank or channel count.
        """
        content, _ = self.score_terms(x)
        c = torch.softmax(content, dim=-1, dtype=score_dtype(content.dtype))        # (B, N_h, N, N)
        p = self.positional_probs(x.shape[1], x.shape[2]).to(c.dtype)              # (1, N_h, N, N)
        g = self.gates().to(c.dtype)[:, None, None]                                # (N_h, 1, 1)
        mixed = torch.lerp(c, p, g)                                                # (1-g) C + g P
        return mixed / mixed.sum(-1, keepdim=True)

    def attention_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``log A`` ``(B, N_h, H*W, H*W)``: GPSA mixes after the softmaxes, so it has no single
        pre-softmax score; these are the scores whose softmax is :meth:`attention_probs`
        (``-inf`` where a probability is 0). The two real terms are :meth:`score_terms`."""
        return torch.log(self.attention_probs(x))

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid.
            return_attention: also return the gated probabilities ``(B, N_h, H*W, H*W)`` (explicit path).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            ValueError: wrong rank or channel count.

        Paths: with ``return_attention``, dropout in training (one mask on the gated map, which
        does not split between the two parts), or ``fast_path = "explicit"``, the gated map
        ``(B, N_h, N, N)`` is built and applied per image. Otherwise (``fast_path = "sdpa"``,
        default) ``(1 - g) SDPA(q, k, v) + g (P v)`` with P applied to the whole batch at once;
        it skips the renormalisation, a no-op in exact arithmetic. Chosen by measurement (16x16
        tokens, 9 heads, CPU time of one thread, medians of 6, shared 2-core machine; forward /
        training step, explicit vs sdpa, batch 20): width 64 with full-width heads 247 / 97 ms and
        690 / 330 ms; width 64, head_dim 16: 160 / 30 ms and 487 / 93 ms; width 400, head_dim 64:
        281 / 192 ms and 925 / 556 ms; the paper's full-width heads (width 400, batch 10) are
        even: 538 / 500 ms and 1440 / 1500 ms.
        """
        b, h, w = self._check_input(x)
        dropout = self.training and self.attn_drop.p > 0
        if return_attention or dropout or self.fast_path == "explicit":
            probs = self.attention_probs(x)                                        # (B, N_h, N, N)
            dropped = self.attn_drop(probs).to(matmul_dtype(x))
            out = self._output(self._average(dropped, x), b, h, w)
            return (out, probs) if return_attention else out
        return self._output(self._sdpa_mix(x), b, h, w)

    def _average(self, probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-image maps ``probs (B, N_h, N, N)`` applied to the values: ``(B, N_h, N, D_h)``."""
        b, h, w, d = x.shape
        n = h * w
        if self.value_in is None:
            # every head averages the same tokens: one (N_h*N, N) @ (N, D) product per image
            mixed = torch.bmm(probs.reshape(b, self.num_heads * n, n), x.reshape(b, n, d).to(probs.dtype))
            return mixed.view(b, self.num_heads, n, d)
        return probs @ self.head_values(x).to(probs.dtype)

    def _sdpa_mix(self, x: torch.Tensor) -> torch.Tensor:
        """Fast path: ``(1 - g) SDPA(q, k, v) + g (P v)``, ``(B, N_h, N, D_h)``; P is applied to
        the whole batch as one matrix product (never expanded over it)."""
        b, h, w, d = x.shape
        n, nh = h * w, self.num_heads
        dtype = matmul_dtype(x)
        q, k = self.queries_keys(x)
        values = self.head_values(x)                                               # (B, N_h, N, D_h)
        content = F.scaled_dot_product_attention(q, k, values, scale=1.0 / math.sqrt(self.head_dim))
        p = self.positional_probs(h, w)[0].to(dtype)                              # (N_h, N, N)
        if self.value_in is None:
            tokens = x.reshape(b, n, d).transpose(0, 1).to(dtype=dtype, memory_format=torch.contiguous_format)
            positional = (p.reshape(nh * n, n) @ tokens.reshape(n, b * d)).reshape(nh, n, b, d)
        else:
            v = values.to(dtype).permute(1, 2, 0, 3).reshape(nh, n, b * self.head_dim)   # (N_h, N, B*D_h)
            positional = torch.bmm(p, v).reshape(nh, n, b, self.head_dim)
        positional = positional.permute(2, 0, 1, 3)                               # (B, N_h, N, D_h)
        g = self.gates().to(content.dtype)[:, None, None]
        return torch.lerp(content, positional.to(content.dtype), g)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", freeze_gate={self.freeze_gate}"
