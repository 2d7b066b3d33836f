"""Mixed precision: under bf16 autocast every attention layer computes its scores and softmax in
float32 and only the value products in bf16; without autocast nothing changed (bit for bit).

On the ``device`` of tests/conftest.py, under that device's bf16 autocast; the bit-for-bit check
against the old formulas is a CPU fact and stays on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from attncnn.layers import (ATTENTION_KINDS, ContentAttention, GatedPositionalAttention, LearnedRelativeAttention,
                            PositionalAttention, QuadraticAttention, build_attention, relative_offsets)
from attncnn.layers.relative import table_rows as _table_rows

H, W, D, NH, B = 5, 7, 16, 3, 2
U_BF16 = 2.0 ** -8          # unit roundoff of bfloat16 (8 significant bits)


def _layer(kind: str, device="cpu", **kwargs):
    torch.manual_seed(0)
    extra = {"max_size": max(H, W)} if kind.startswith("learned") else {}
    layer = build_attention(kind, D, NH, **extra, **kwargs).eval()
    if isinstance(layer, QuadraticAttention):
        with torch.no_grad():        # Gaussians inside the grid, sharp enough to be non-trivial
            layer.centers.copy_(torch.tensor([[0.0, 1.0], [-1.3, 0.4], [2.0, -2.5]]))
            layer.spreads.mul_(1.3)
    return layer.to(device)


def _input(scale: float = 1.0, device="cpu") -> torch.Tensor:
    """Drawn on the CPU (the same numbers on every device), then moved."""
    return (scale * torch.randn(B, H, W, D, generator=torch.Generator().manual_seed(1))).to(device)


def _bf16(device):
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def _content_probability_bound(layer: ContentAttention, x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Largest |p_bf16 - p_fp32| that bf16 queries, keys, tables and score products allow, per entry.

    First-order rounding analysis with u = 2^-8: x, the weights and biases are rounded to bf16
    (u each), q and k are rounded outputs (u), so |dq| <= 3u |x||W_q| + ...; the score products
    accumulate in float32 and are rounded to bf16 (u; once more for the 1/sqrt(D_h) scale or
    the positional sum). Adding up: |d score| <= E = 8u * S with S the same scores computed
    from |x| and |parameters| (an upper bound of every term). Then for p' = softmax(s + e),
    |e| <= E: |p'_i - p_i| <= p_i (exp(E_i + log sum_j p_j exp(E_j)) - 1).
    """
    magnitude = copy.deepcopy(layer).double()
    with torch.no_grad():
        for p in magnitude.parameters():
            p.abs_()
        if isinstance(layer, GatedPositionalAttention):
            return _gpsa_probability_bound(layer, magnitude, x, probs)
        err = 8 * U_BF16 * magnitude.input_scores(x.double().abs())           # (B, N_h, N, N)
    p = probs.double()
    lse = torch.logsumexp(torch.log(p.clamp_min(1e-300)) + err, dim=-1, keepdim=True)
    return p * torch.expm1(err + lse) + 1e-6


def _gpsa_probability_bound(layer, magnitude, x, probs):
    """GPSA: the positional maps are computed in float32 with autocast off (no error); the content
    softmax moves as above, by the rounding of the content scores; the gate mixes the two."""
    with torch.no_grad():
        err = 8 * U_BF16 * magnitude.score_terms(x.double().abs())[0]
        content = torch.softmax(copy.deepcopy(layer).double().score_terms(x.double())[0], dim=-1)
    lse = torch.logsumexp(torch.log(content.clamp_min(1e-300)) + err, dim=-1, keepdim=True)
    gate = layer.gates().detach().double()[:, None, None]
    return (1 - gate) * content * torch.expm1(err + lse) + 1e-6


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_probabilities_are_float32_and_match_the_float32_layer(kind, device):
    layer, x = _layer(kind, device), _input(0.5, device)
    with torch.no_grad():
        _, reference = layer(x, return_attention=True)
        with _bf16(device):
            _, probs = layer(x, return_attention=True)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)), rtol=0, atol=1e-6)
    if layer.position_only:
        # scores come from float32 parameters with autocast off: the very same numbers
        assert torch.equal(probs, reference)
    else:
        bound = _content_probability_bound(layer, x, reference)
        assert bound.max() < 0.2                   # the bound says something at this scale
        assert ((probs - reference).abs() <= bound).all()


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("head_dim", [None, 6])
@pytest.mark.parametrize("separable", [False, True])
def test_outputs_are_close_to_float32_and_gradients_reach_every_parameter(kind, head_dim, separable, device):
    """Outputs within 2 % of max|output|: about five bf16 roundings (u = 0.4 %) of x, the maps, the
    weights and the products; measured 0.3-0.55 % (CPU)."""
    layer, x = _layer(kind, device, head_dim=head_dim), _input(device=device)
    if separable and "separable" in layer.impls:
        layer.impl = "separable"
    with torch.no_grad():
        reference = layer(x)
        with _bf16(device):
            out = layer(x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.float() - reference).abs().max() <= 2e-2 * reference.abs().max()
    layer.train()                                  # attn_drop = 0: the fast path is still taken
    with _bf16(device):
        loss = layer(x.clone().requires_grad_()).float().square().mean()
    loss.backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_separable_and_dense_paths_agree_under_autocast(device):
    layer, x = _layer("quadratic", device), _input(device=device)
    with torch.no_grad(), _bf16(device):
        layer.impl = "separable"
        separable = layer(x).float()
        layer.impl = "dense"
        dense = layer(x).float()
    assert (separable - dense).abs().max() <= 2e-2 * dense.abs().max()


def test_half_precision_parameters_still_score_in_float32(device):
    """A layer converted to bf16 (no autocast) upcasts its positional parameters for the scores."""
    for kind in ("quadratic", "quadratic-generalized", "learned"):
        layer = _layer(kind, device)
        reference = layer.grid_probs(H, W)
        probs = layer.to(torch.bfloat16).grid_probs(H, W)
        assert probs.dtype == torch.float32
        # parameters rounded to bf16 move the scores by ~2^-8 relative: maps agree to a few %
        assert (probs - reference).abs().max() < 0.05
        out = layer(_input(device=device).to(torch.bfloat16))
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


# ---- float32 without autocast: the change must not move a bit ----------------------------------

def _old_scores(layer, h, w):
    """The pre-change score formulas, copied verbatim (plain float32, no dtype handling)."""
    if isinstance(layer, QuadraticAttention):
        delta = relative_offsets(h, w, layer.centers.device, layer.centers.dtype)
        diff = delta[None] - layer.centers[:, None, None, :]
        if layer.full_covariance:
            proj = diff @ layer.spreads[:, None]
            return -0.5 * proj.square().sum(-1)
        return -layer.alpha[:, None, None] * diff.square().sum(-1)
    row = layer.head_keys_row(_table_rows(layer.row_embeddings, h, layer.max_size, "height"))
    col = layer.head_keys_col(_table_rows(layer.col_embeddings, w, layer.max_size, "width"))
    row, col = row.permute(2, 0, 1), col.permute(2, 0, 1)
    return (row[:, :, None, :, None] + col[:, None, :, None, :]).reshape(layer.num_heads, h * w, h * w)


def _old_forward(layer, x):
    """The pre-change dense forward: (output of the fast path, explicit output, probabilities)."""
    b, h, w, d = x.shape
    n = h * w
    if layer.position_only:
        probs = torch.softmax(_old_scores(layer, h, w), dim=-1)
        probs = probs.masked_fill(probs < torch.finfo(probs.dtype).eps ** 2, 0.0).unsqueeze(0)
        explicit = layer.output(probs @ layer.head_values(x), b, h, w)
        if layer.value_in is None:
            tokens = x.reshape(b, n, d).transpose(0, 1).reshape(n, b * d)
            mixed = (probs[0].reshape(NH * n, n) @ tokens).reshape(NH, n, b, d)
        else:
            v = layer.value_in(x).reshape(b, n, NH, layer.head_dim).permute(2, 1, 0, 3).reshape(NH, n, -1)
            mixed = torch.bmm(probs[0], v).reshape(NH, n, b, layer.head_dim)
        return layer.output(mixed.permute(2, 0, 1, 3), b, h, w), explicit, probs
    probs = torch.softmax(layer.input_scores(x), dim=-1)
    if layer.value_in is None:
        mixed = torch.bmm(probs.reshape(b, NH * n, n), x.reshape(b, n, d)).view(b, NH, n, d)
    else:
        mixed = probs @ layer.head_values(x)
    explicit = layer.output(mixed, b, h, w)
    return explicit, explicit, probs


@pytest.mark.cpu_only("bit-identity with the old formulas was established on the CPU's kernels; another "
                      "device's kernels may order the same sums differently")
# GPSA and learned-content-9ffaa came after the change
@pytest.mark.parametrize("kind", [k for k in ATTENTION_KINDS if k not in ("gpsa", "learned-content-9ffaa")])
@pytest.mark.parametrize("head_dim", [None, 6])
def test_float32_dense_path_is_bit_identical_to_the_old_formulas(kind, head_dim):
    layer, x = _layer(kind, head_dim=head_dim), _input()
    if isinstance(layer, PositionalAttention):
        layer.impl = "dense"
    elif kind == "learned-content" and head_dim is None:
        layer.impl = "explicit-half"        # auto takes explicit-onehot, a later path that rounds differently
    with torch.no_grad():
        old_fast, old_explicit, old_probs = _old_forward(layer, x)
        explicit, probs = layer(x, return_attention=True)
        fast = layer(x)
    assert torch.equal(probs, old_probs) and torch.equal(explicit, old_explicit)
    if kind in ("content", "learned-content") and head_dim is not None:
        torch.testing.assert_close(fast, explicit)      # narrow heads take a newer fast path: equal, not bit-identical
    else:
        assert torch.equal(fast, old_fast)
    if isinstance(layer, PositionalAttention):
        assert torch.equal(layer.grid_scores(H, W), _old_scores(layer, H, W))


def test_learned_scores_check_the_table_size_in_every_dtype(device):
    layer = LearnedRelativeAttention(D, 2, max_size=4).to(device, torch.bfloat16)
    with pytest.raises(ValueError, match="max_size >= 5"):
        layer.axis_scores(5, 3)
    assert torch.isfinite(layer.grid_probs(4, 3)).all()
