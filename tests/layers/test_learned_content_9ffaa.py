"""``learned-content-9ffaa``: the reference repository's content + learned relative layer at 9ffaa30.
Every path against a plain per-pair float64 computation of its score, on non-square grids; the
axis convention; the parameters and their count at the paper's size."""

from __future__ import annotations

import math

import pytest
import torch

from attncnn.layers import LearnedContent9ffaaAttention, build_attention, local_init_
from attncnn.models import build_model, count_parameters

KIND = "learned-content-9ffaa"


def _layer(dim=6, heads=2, *, max_size=5, table_dim=5, head_dim=None, **kwargs):
    torch.manual_seed(0)
    layer = build_attention(KIND, dim, heads, max_size=max_size, table_dim=table_dim, head_dim=head_dim, **kwargs)
    return layer.double().eval()


def _plain(layer: LearnedContent9ffaaAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Output ``(B, H, W, D_out)`` and probabilities ``(B, N_h, HW, HW)`` pair by pair, float64:
    score = w_row . e_row(key row - query row) + w_col . e_col(key col - query col) + q . k / sqrt(D)."""
    b, h, w, d = x.shape
    nh, dh, m = layer.num_heads, layer.head_dim, layer.max_size
    wq, bq = layer.query.weight.view(nh, dh, d), layer.query.bias.view(nh, dh)
    wk, bk = layer.key.weight.view(nh, dh, d), layer.key.bias.view(nh, dh)
    e_row, e_col = layer.row_embeddings.weight, layer.col_embeddings.weight
    k_row, k_col = layer.head_keys_row.weight, layer.head_keys_col.weight
    n = h * w
    probs = torch.zeros(b, nh, n, n, dtype=torch.float64)
    out = torch.zeros(b, h, w, layer.out_dim, dtype=torch.float64)
    for img in range(b):
        for i in range(n):
            r, c = divmod(i, w)
            mixed = []
            for head in range(nh):
                q = wq[head] @ x[img, r, c] + bq[head]
                scores = torch.zeros(n, dtype=torch.float64)
                for j in range(n):
                    kr, kc = divmod(j, w)
                    key = wk[head] @ x[img, kr, kc] + bk[head]
                    positional = k_row[head] @ e_row[kr - r + m - 1] + k_col[head] @ e_col[kc - c + m - 1]
                    scores[j] = positional + q @ key / math.sqrt(d)
                p = torch.softmax(scores, dim=0)
                probs[img, head, i] = p
                tokens = x[img].reshape(n, d)
                if layer.value_in is not None:          # a value projection per head
                    tokens = (tokens @ layer.value_in.weight.T + layer.value_in.bias).view(n, nh, dh)[:, head]
                mixed.append(p @ tokens)
            out[img, r, c] = layer.value(torch.cat(mixed))
    return out, probs


@pytest.mark.parametrize("head_dim", [None, 4])
@pytest.mark.parametrize("grid", [(3, 4), (4, 2), (1, 5)])
def test_every_path_is_the_plain_per_pair_computation(grid, head_dim):
    layer = _layer(head_dim=head_dim)
    x = torch.randn(2, *grid, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, expected_probs = _plain(layer, x)
        out, probs = layer(x, return_attention=True)
        torch.testing.assert_close(probs, expected_probs, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        content, positional = layer.score_terms(x)
        torch.testing.assert_close(content + positional, layer.input_scores(x), rtol=1e-13, atol=1e-13)
        for impl in layer.impls:
            layer.impl = impl
            torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12, msg=impl)
    assert layer.path(*grid) in ("explicit-half", "sdpa")
    assert _layer(head_dim=head_dim).path(*grid) == ("explicit-half" if head_dim is None else "sdpa")


def test_row_is_the_shift_along_image_rows_and_col_along_columns():
    """A head whose row table favours shift +1 (the column table flat) puts its mass on the row
    below the query; through the column table, on the column to its right."""
    for table, keys, axis in (("row_embeddings", "head_keys_row", 0), ("col_embeddings", "head_keys_col", 1)):
        layer = _layer(heads=1)
        with torch.no_grad():
            for p in layer.parameters():
                p.zero_()
            getattr(layer, table).weight[1 + layer.max_size - 1, 0] = 30.0     # shift +1 on this axis
            getattr(layer, keys).weight[0, 0] = 1.0
            _, probs = layer(torch.zeros(1, 4, 4, 6, dtype=torch.float64), return_attention=True)
        grid = probs[0, 0, 1 * 4 + 1].view(4, 4)                            # query (1, 1), keys (row, col)
        marginal = grid.sum(dim=1 - axis)                                   # over the other axis
        assert int(marginal.argmax()) == 2 and float(marginal[2]) > 0.999
        torch.testing.assert_close(grid.sum(dim=axis), torch.full((4,), 0.25, dtype=torch.float64))


def test_the_content_term_is_divided_by_the_model_width_not_the_head_width():
    layer = _layer(dim=16, heads=1, head_dim=4, table_dim=3)
    with torch.no_grad():
        for table in (layer.row_embeddings, layer.col_embeddings):
            table.weight.zero_()
        x = torch.randn(1, 2, 3, 16, dtype=torch.float64)
        q, k = layer.queries_keys(x)
        content, positional = layer.score_terms(x)
    assert float(positional.abs().max()) == 0.0
    torch.testing.assert_close(content, q @ k.transpose(-1, -2) / 4.0, rtol=1e-13, atol=1e-13)   # sqrt(16)


def test_the_parameters_are_the_reference_layers_under_our_names():
    with torch.device("meta"):
        layer = build_attention(KIND, 400, 9)
        shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
        assert shapes == {"row_embeddings.weight": (31, 400), "col_embeddings.weight": (31, 400),
                          "head_keys_row.weight": (9, 400), "head_keys_col.weight": (9, 400),
                          "query.weight": (3600, 400), "query.bias": (3600,), "key.weight": (3600, 400),
                          "key.bias": (3600,), "value.weight": (400, 3600), "value.bias": (400,)}
        assert count_parameters(build_model(KIND)) == 29_601_882
        assert count_parameters(build_model("learned-content")) == 29_601_882 - 6 * (2 * 31 * 200 + 2 * 9 * 400)


def test_grids_beyond_the_tables_narrow_tables_for_a_local_init_and_the_bilinear_form_are_refused():
    layer = _layer(max_size=3)
    with pytest.raises(ValueError, match="grid width 4 exceeds the learned table's max_size 3"):
        layer(torch.randn(1, 2, 4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="set table_dim >= 3"):
        local_init_(_layer(heads=9, table_dim=2), alpha=1.0)
    with pytest.raises(ValueError, match="set table_dim >= 3"):
        build_model(f"{KIND}-mini", init="conv", table_dim=2)
    with pytest.raises(ValueError, match="has no bilinear path"):
        layer.bilinear_scores(torch.randn(1, 2, 2, 6, dtype=torch.float64))


def test_the_local_init_makes_content_the_same_for_every_key_and_leaves_the_gaussian_score():
    layer = _layer(heads=9)
    shifts = local_init_(layer, alpha=0.8)
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    with torch.no_grad():
        content, positional = layer.score_terms(x)
    assert torch.equal(content, content[..., :1].expand_as(content))          # cancels in the softmax
    rows, cols = torch.meshgrid(torch.arange(4.0, dtype=torch.float64), torch.arange(5.0, dtype=torch.float64),
                                indexing="ij")
    pos = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1)
    delta = pos[None, :, :] - pos[:, None, :]                                          # (N, N, 2): key - query
    gaussian = -0.8 * (delta[None] - shifts[:, None, None, :]).square().sum(-1)      # (N_h, N, N)
    torch.testing.assert_close(positional[0], gaussian, rtol=1e-12, atol=1e-12)
