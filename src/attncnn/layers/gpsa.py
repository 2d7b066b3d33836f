"""Gated positional self-attention (GPSA), the attention layer of ConViT (d'Ascoli et al., ICML 2021, sec. 3.1).

Each head h mixes a content map and a positional map *after* their softmaxes:

    content     C_h = softmax_k(q_h . k_h / sqrt(D_h))                       (B, N_h, N, N)
    positional  P_h = softmax_k(v_pos^(h) . r_delta)                         (1, N_h, N, N)
    gated       A_h = ((1 - g_h) C_h + g_h P_h) / sum_k[(1 - g_h) C_h + g_h P_h],   g_h = sigmoid(lambda_h)

with ``delta = key - query`` in tokens (component 0 along the rows) and the fixed encoding
``r_delta = (delta_1, delta_2, delta_1^2 + delta_2^2)`` (ConViT's; paper eq. 9 reordered).
``v_pos`` ``(N_h, 3)`` is learned per head; ``gate_logits`` ``(N_h,)`` is ConViT's ``lambda``, 1 at
initialisation (``g = 0.73``). The renormalisation is ConViT's (it only removes rounding).

Local initialisation (ConViT sec. 3.1, :meth:`GatedPositionalAttention.local_init_`):
``v_pos^(h) = alpha (2 Delta_1^(h), 2 Delta_2^(h), -1)`` gives the positional score
``-alpha |delta - Delta^(h)|^2 + alpha |Delta^(h)|^2``. Without it ``v_pos`` starts like the
weight of ``nn.Linear(3, N_h)``.

Weight decay: ``v_pos`` and ``gate_logits`` are excluded
(:meth:`GatedPositionalAttention.no_weight_decay`), as the reference exempts the quadratic centers
and spreads: decay would pull the maps towards uniform and the gates towards 1/2.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .autocast_rules import autocast_off, matmul_dtype, score_dtype, softmax_in
from .content import QueryKeyAttention
from .mixing import flush_below, mix_per_image, mix_shared
from .relative import relative_offsets

__all__ = ["GatedPositionalAttention", "gpsa_features"]


def gpsa_features(height: int, width: int, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ConViT's relative encoding ``r_delta = (delta_1, delta_2, delta_1^2 + delta_2^2)`` of every
    (query, key) pair: ``(H*W, H*W, 3)``, tokens row-major, in token units (cached offsets)."""
    d = relative_offsets(height, width, device, dtype)                  # (N, N, 2)
    return torch.cat([d, d.square().sum(-1, keepdim=True)], dim=-1)


class GatedPositionalAttention(QueryKeyAttention):
    """Gated positional self-attention over a token grid (ConViT's GPSA, see the module docstring).

    Args:
        dim, num_heads, head_dim, out_dim, attn_drop: see :class:`~attncnn.layers.GridAttention`
            (``head_dim`` is the width of queries, keys and values; default D). Dropout acts on the
            gated probabilities, one mask per image.
        gate_init: initial ``lambda_h`` of every head (ConViT: 1).
        freeze_gate: keep ``lambda`` fixed at ``gate_init`` (``requires_grad=False``).
        qk_bias, qk_init_std: see :class:`~attncnn.layers.QueryKeyAttention` (ConViT: no bias, 0.02).
        impl: ``"sdpa"``, ``"explicit-half"``, ``"explicit"`` or ``"auto"`` (``"sdpa"``); see
            :meth:`forward`.

    Parameters: ``query`` and ``key`` (``D -> N_h*D_h``), ``v_pos`` ``(N_h, 3)``, ``gate_logits``
    ``(N_h,)``, and the value/output maps of :class:`~attncnn.layers.GridAttention`.
    """

    KINDS = ("gpsa",)
    CONFIG_KEYS = ("freeze_gate", "qk_bias", "qk_init_std")
    EXCLUSIVE_KEYS = ("freeze_gate", "qk_bias", "qk_init_std")
    IMPLS = ("auto", "explicit", "explicit-half", "sdpa")
    has_positional_term = True
    has_gates = True

    def __init__(self, dim: int, num_heads: int, *, gate_init: float = 1.0, freeze_gate: bool = False,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
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

    @torch.no_grad()
    def local_init_(self, shifts: torch.Tensor, alpha: float) -> None:
        """``v_pos^(h) = alpha (2 Delta_1, 2 Delta_2, -1)`` against ``r = (d_1, d_2, |d|^2)``: the
        positional score ``-alpha |delta - Delta|^2 + alpha |Delta|^2`` (ConViT); gates unchanged.

        When the value projection is square (``N_h * D_h == D``, ConViT's split of the width) it
        becomes the identity with a zero bias, as ConViT's local init sets it: each head then
        averages its own ``D_h`` channels of the tokens. (Full-width heads have no projection; other
        widths keep their random one.)"""
        self.v_pos.copy_(alpha * torch.cat([2 * shifts, -torch.ones_like(shifts[:, :1])], dim=-1))
        if self.value_in is not None and self.value_in.weight.shape[0] == self.value_in.weight.shape[1]:
            self.value_in.weight.copy_(torch.eye(self.dim, dtype=self.value_in.weight.dtype))
            self.value_in.bias.zero_()

    def positional_scores(self, height: int, width: int) -> torch.Tensor:
        """``v_pos^(h) . r_delta`` for every pair: ``(N_h, H*W, H*W)``, float32 at least, autocast off."""
        with autocast_off(self.v_pos.device):
            v_pos = self.v_pos.to(score_dtype(self.v_pos.dtype))
            r = gpsa_features(height, width, v_pos.device, v_pos.dtype)    # (N, N, 3)
            return torch.einsum("qkc,hc->hqk", r, v_pos)

    def positional_probs(self, height: int, width: int) -> torch.Tensor:
        """The positional maps ``P`` ``(1, N_h, H*W, H*W)``, shared by the batch; rows sum to 1.

        Softmax in float32 at least (autocast off); entries below ``eps(dtype)**2`` are set to 0, as
        :meth:`~attncnn.layers.PositionalAttention.grid_probs` does.
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
        b, h, w = self.check_input(x)
        q, k = self.queries_keys(x)
        content = self.scaled_content(q, k)
        positional = self.positional_scores(h, w)
        return content, positional.unsqueeze(0).expand(b, *positional.shape)

    def input_probs(self, x: torch.Tensor) -> torch.Tensor:
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

    def input_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``log A`` ``(B, N_h, H*W, H*W)``: GPSA mixes after the softmaxes, so it has no single
        pre-softmax score; these are the scores whose softmax is :meth:`input_probs`
        (``-inf`` where a probability is 0). The two real terms are :meth:`score_terms`."""
        return torch.log(self.input_probs(x))

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Apply the layer.

        Args:
            x: ``(B, H, W, D)`` token grid.
            return_attention: also return the gated probabilities ``(B, N_h, H*W, H*W)`` (explicit path).

        Returns:
            ``(B, H, W, D_out)``, or ``(output, probs)`` when ``return_attention``.

        Raises:
            ValueError: wrong rank or channel count.

        Paths: with ``return_attention``, dropout in training (one mask on the gated map, which does
        not split between the two parts), or ``impl="explicit"``, the gated map
        ``(B, N_h, N, N)`` is built and applied per image. Otherwise the two parts are applied apart,
        ``(1 - g) (C v) + g (P v)`` (skipping the renormalisation, a no-op in exact arithmetic), with P
        applied to the whole batch at once and ``C v`` through SDPA (``"sdpa"``, ``"auto"``) or written
        out as :class:`~attncnn.layers.ContentAttention`'s ``"explicit-half"``.
        """
        b, h, w = self.check_input(x)
        path = "explicit" if return_attention else self.path(h, w)
        if path == "explicit":
            probs = self.input_probs(x)                                            # (B, N_h, N, N)
            dropped = self.attn_drop(probs).to(matmul_dtype(x))
            out = self.output(mix_per_image(dropped, x, self.projected_values(x)), b, h, w)
            return (out, probs) if return_attention else out
        return self.output(self._split_mix(x, fused=path == "sdpa"), b, h, w)

    def path(self, height: int = 0, width: int = 0) -> str:
        """The path :meth:`forward` takes without probabilities: ``"explicit"`` when the mode's
        ``impl`` (:attr:`mode_impl`) says so or dropout acts in training, ``"explicit-half"`` when
        it says so, else ``"sdpa"`` (the grid size does not matter)."""
        impl = self.mode_impl
        if impl == "explicit" or (self.training and self.attn_drop.p > 0):
            return "explicit"
        return "explicit-half" if impl == "explicit-half" else "sdpa"

    def _split_mix(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        """``(1 - g) (C v) + g (P v)``, ``(B, N_h, N, D_h)``: the content part by SDPA (``fused``) or
        written out (explicit-half); P applied to the whole batch as one product."""
        h, w = x.shape[1], x.shape[2]
        dtype = matmul_dtype(x)
        q, k = self.queries_keys(x)
        values = self.head_values(x)                                               # (B, N_h, N, D_h)
        if fused:
            content = F.scaled_dot_product_attention(q, k, values, scale=1.0 / math.sqrt(self.head_dim))
        else:
            probs = softmax_in(self.scaled_content(q, k), dtype)                   # (B, N_h, N, N)
            content = mix_per_image(probs, x, None if self.value_in is None else values)
        p = self.positional_probs(h, w)[0].to(dtype)                              # (N_h, N, N)
        positional = mix_shared(p, x, None if self.value_in is None else values)  # (B, N_h, N, D_h)
        g = self.gates().to(content.dtype)[:, None, None]
        return torch.lerp(content, positional.to(content.dtype), g)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", freeze_gate={self.freeze_gate}"
