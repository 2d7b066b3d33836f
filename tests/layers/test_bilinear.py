"""Content attention's impl="bilinear": the scores through the query-key bilinear form, the query
map folded into the vectors the queries meet. (Its outputs and gradients against the explicit path:
tests/layers/test_impl.py; its bf16 error: tests/layers/test_half_softmax.py.)"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attncnn.layers import build_attention
from attncnn.layers.bilinear import fold_query_map


def _layer(kind, dim=8, heads=3, **kwargs):
    torch.manual_seed(0)
    extra = {"max_size": 6} if kind == "learned-content" else {}
    return build_attention(kind, dim, heads, **extra, **kwargs).double()    # random tables, maps and biases


@pytest.mark.parametrize("kind,head_dim,qk_bias", [("content", None, True), ("content", None, False),
                                                   ("content", 6, True), ("content", 6, False),
                                                   ("learned-content", None, True), ("learned-content", 6, True)])
def test_scores_equal_the_formed_queries_and_keys_term_for_term(kind, head_dim, qk_bias, device):
    """Not only up to a per-query constant: the same scores, ``q_i . b_key`` included (with and
    without query and key biases; learned-content always has them, its local init writes the query bias)."""
    layer = _layer(kind, head_dim=head_dim, qk_bias=qk_bias).to(device)
    x = torch.randn(2, 5, 6, 8, dtype=torch.float64).to(device)
    torch.testing.assert_close(layer.bilinear_scores(x), layer.input_scores(x), rtol=1e-12, atol=1e-12)


def test_fold_query_map_is_the_query_map_then_the_products():
    torch.manual_seed(0)
    query = torch.nn.Linear(5, 3 * 4).double()
    vectors = torch.randn(3, 4, 7, dtype=torch.float64)
    x = torch.randn(11, 5, dtype=torch.float64)
    weight, bias = fold_query_map(query, vectors, 0.5)
    q = query(x).view(11, 3, 4)
    expected = 0.5 * torch.einsum("nhc,hck->nhk", q, vectors).reshape(11, 3 * 7)
    torch.testing.assert_close(x @ weight + bias, expected, rtol=1e-12, atol=1e-12)
    nobias = torch.nn.Linear(5, 12, bias=False).double()
    weight, bias = fold_query_map(nobias, vectors, 1.0)
    assert bias is None and weight.shape == (5, 21)


def test_fold_query_map_builds_in_float32_under_autocast():
    query = torch.nn.Linear(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        weight, bias = fold_query_map(query, torch.randn(2, 4, 3), 1.0)
    assert weight.dtype == bias.dtype == torch.float32


def test_a_grid_beyond_the_tables_is_refused_with_the_fix():
    layer = _layer("learned-content", impl="bilinear")
    with pytest.raises(ValueError, match="grid height 7 exceeds the learned table's max_size 6: build the layer "
                                         "with max_size >= 7"):
        layer(torch.randn(1, 7, 3, 8, dtype=torch.float64))


def _up8(n: int) -> int:
    return -(-n // 8) * 8


def _products(layer, x) -> int:
    with FlopCounterMode(display=False) as counter:
        layer(x)
    return counter.get_total_flops() // 2


def test_multiply_adds_are_those_of_the_bilinear_form():
    """Forward multiply-adds counted by torch, against the formula: the fold (once per step), the
    tokens through the folded map, the joint product (K' = D + H + W + 1 with one-hot rows and
    columns), the average of the tokens, the output map; K and K' padded with zero columns to
    multiples of 8."""
    b, h, w, d, nh = 2, 4, 5, 8, 3
    layer = _layer("learned-content", dim=d, heads=nh, impl="bilinear").eval()
    n, s = h * w, 2 * h - 1 + 2 * w - 1
    k = _up8(d + s + 1)                                 # vectors met: W_key's D columns, the shifts, b_key
    joint = _up8(d + h + w + 1)
    expected = (nh * d * d * k + nh * d * k             # fold: weight and bias
                + b * n * d * nh * k                    # tokens through the folded map
                + b * nh * n * n * joint                # joint queries . joint keys
                + b * nh * n * n * d                    # probabilities . tokens
                + b * n * nh * d * d)                   # output map
    assert _products(layer, torch.randn(b, h, w, d, dtype=torch.float64)) == expected


def test_the_paper_width_layer_does_a_fifth_fewer_products_than_the_one_hot_path():
    """At the paper's geometry (width 400, 9 heads as wide as the model, 16 x 16 tokens) the folded
    map replaces the query and key maps' 2 D^2 N_h per token by D (D + 63) N_h (measured here on
    shapes alone: meta tensors)."""
    with torch.device("meta"):
        layer = build_attention("learned-content", 400, 9, impl="bilinear")
        x = torch.empty(100, 16, 16, 400)
        bilinear = _products(layer, x)
        layer.impl = "explicit-onehot"
        onehot = _products(layer, x)
    assert 0.78 < bilinear / onehot < 0.82, bilinear / onehot
