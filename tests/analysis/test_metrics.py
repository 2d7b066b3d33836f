"""Per-head metrics against hand-computed values for synthetic heads; grid distance; degenerate heads."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from attncnn.analysis import (degenerate_heads, epoch_metrics, flatten_metrics, grid_distance, head_statistics,
                              kernel_grids, model_metrics, optimal_assignment)
from attncnn.layers import QuadraticAttention
from attncnn.models import build_model

SMALL = {"num_layers": 2, "num_heads": 4, "dim": 16, "mlp_dim": 16, "pooling": 4, "max_size": 8}


def one_hot_head(height, width, shift):
    """(N, N) map: each query attends to query + shift, clamped to the grid (the nearest border pixel)."""
    n = height * width
    probs = torch.zeros(n, n, dtype=torch.float64)
    for q in range(n):
        r, c = divmod(q, width)
        kr = min(max(r + shift[0], 0), height - 1)
        kc = min(max(c + shift[1], 0), width - 1)
        probs[q, kr * width + kc] = 1.0
    return probs


def test_one_hot_head_at_shift_0_1_has_distance_1_and_peak_1():
    probs = torch.stack([one_hot_head(4, 4, (0, 1)), one_hot_head(4, 4, (2, -1))])[None]   # (1, 2, 16, 16)
    inner = head_statistics(probs, 4, 4, margin=1)
    assert inner["distance"][0] == pytest.approx(1.0)
    assert inner["peak"].tolist() == pytest.approx([1.0, 1.0])
    assert inner["entropy"].tolist() == pytest.approx([0.0, 0.0])
    assert inner["shift"][0].tolist() == pytest.approx([0.0, 1.0])
    # All queries: the 4 queries of the last column can only attend to themselves.
    every = head_statistics(probs, 4, 4)
    assert every["distance"][0] == pytest.approx(12 / 16)
    # Head 2 at (2, -1) on the 4x4 grid, by hand: rows 0-1 reach it (dist sqrt5) except column 0 (dist 2);
    # rows 2-3 are clamped to row 3.
    expected = []
    for r, c in itertools.product(range(4), range(4)):
        kr, kc = min(r + 2, 3), max(c - 1, 0)
        expected.append(math.hypot(kr - r, kc - c))
    assert every["distance"][1] == pytest.approx(sum(expected) / 16)


def test_uniform_head_and_batches():
    n = 9
    uniform = torch.full((2, 1, n, n), 1.0 / n)
    stats = head_statistics(uniform, 3, 3)
    assert stats["entropy"][0] == pytest.approx(math.log(n))
    assert stats["peak"][0] == pytest.approx(1 / n)
    assert stats["shift"][0].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="margin"):
        head_statistics(uniform, 3, 3, margin=2)
    with pytest.raises(ValueError, match="expected probabilities"):
        head_statistics(uniform, 4, 4)


def test_sharp_quadratic_heads_measure_their_shift():
    layer = QuadraticAttention(8, 2)
    with torch.no_grad():
        layer.centers.copy_(torch.tensor([[0.0, 1.0], [-1.0, -1.0]]))
        layer.spreads.fill_(math.sqrt(2 * 50.0))          # alpha = 50: one-hot up to e^-50
    stats = head_statistics(layer.grid_probs(6, 6), 6, 6, margin=1)
    assert stats["distance"].tolist() == pytest.approx([1.0, math.sqrt(2)], abs=1e-9)
    assert stats["peak"].tolist() == pytest.approx([1.0, 1.0], abs=1e-9)


def test_optimal_assignment_matches_brute_force():
    rng = random.Random(0)
    for _ in range(100):
        n = rng.randint(1, 5)
        m = rng.randint(n, 6)
        cost = [[rng.random() for _ in range(m)] for _ in range(n)]
        cols = optimal_assignment(cost)
        assert len(set(cols)) == n
        best = min(sum(cost[i][p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))
        assert sum(cost[i][cols[i]] for i in range(n)) == pytest.approx(best)
    with pytest.raises(ValueError, match="n <= m"):
        optimal_assignment([[1.0], [2.0]])
    with pytest.raises(ValueError, match="NaN or infinite"):
        optimal_assignment([[1.0, float("nan")]])


def test_grid_distance_is_zero_for_a_permuted_grid_and_ignores_extra_heads():
    grid = kernel_grids(3)[0]
    assert sorted(map(tuple, grid.tolist())) == [(r, c) for r in (-1, 0, 1) for c in (-1, 0, 1)]
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    centers = torch.cat([grid[perm], torch.tensor([[7.0, 7.0]])])       # 10 heads: K = 3
    result = grid_distance(centers)
    assert result["kernel_size"] == 3 and result["distance"] == pytest.approx(0.0, abs=1e-12)
    assigned = {h: (r, c) for h, r, c in result["assignment"]}
    assert 9 not in assigned and all(tuple(grid[perm[h]].tolist()) == assigned[h] for h in range(9))
    shifted = grid_distance(grid + torch.tensor([0.0, 0.5]))
    assert shifted["distance"] == pytest.approx(0.5)
    # Even K: a 2x2 block of shifts containing the query, any of the four placements.
    assert grid_distance(torch.tensor([[0.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [-1.0, 1.0]]))["distance"] == 0.0
    with pytest.raises(ValueError):
        grid_distance(torch.zeros(3, 2), kernel_size=2)


def test_degenerate_heads_follow_the_reference_thresholds():
    iso = QuadraticAttention(8, 3)
    with torch.no_grad():
        iso.spreads.copy_(torch.tensor([1.0, 1e-3, 3e-3]))               # s^2 = 1, 1e-6, 9e-6
    assert degenerate_heads(iso).tolist() == [False, True, True]
    assert degenerate_heads(iso, min_eigenvalue=5e-6).tolist() == [False, True, False]
    full = QuadraticAttention(8, 4, full_covariance=True)
    with torch.no_grad():
        full.spreads.copy_(torch.stack([torch.eye(2), torch.diag(torch.tensor([1.0, 0.01])),   # k = 1e4
                                        torch.diag(torch.tensor([1.0, 0.05])),                  # k = 400
                                        1e-3 * torch.eye(2)]))                                  # eig 1e-6
    assert degenerate_heads(full).tolist() == [False, True, False, True]
    assert degenerate_heads(full, condition_number=100).tolist() == [False, True, True, True]


def test_model_metrics_report_quadratic_parameters():
    model = build_model("demo", dim=16, mlp_dim=16, num_heads=9)
    with torch.no_grad():
        model.blocks[0].attention.centers.copy_(kernel_grids(3)[0])
        model.blocks[0].attention.spreads[2] = 1e-4
    result = model_metrics(model)
    layer = result["layers"][0]
    assert result["grid"] == [8, 8] and layer["grid_distance"] == pytest.approx(0.0, abs=1e-12)
    assert layer["degenerate_heads"] == 1 and layer["heads"][2]["degenerate"]
    assert layer["heads"][4]["center"] == [0.0, 0.0]
    assert layer["heads"][0]["alpha"] == pytest.approx(float(model.blocks[0].attention.alpha[0].detach()))


def test_epoch_metrics_is_flat_cheap_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = build_model("quadratic", **SMALL).train()
    state = torch.get_rng_state()
    flat = epoch_metrics(model)
    assert torch.equal(state, torch.get_rng_state()) and model.training
    assert flat == flatten_metrics(model_metrics(model))
    assert all(isinstance(v, float) for v in flat.values())
    for key in ("attn/layer1/head3/distance", "attn/layer2/grid_distance", "attn/layer1/head1/alpha",
                "attn/layer2/head4/center_row", "attn/layer1/degenerate_heads"):
        assert key in flat, key
    assert "attn/layer1/head1/distance" in epoch_metrics(build_model("learned", **SMALL))
    generalized = build_model("quadratic-generalized", **SMALL)
    full = epoch_metrics(generalized)
    assert "attn/layer1/head1/eigenvalue_max" in full
    # the whole Sigma^-1 of every head, so that the head can be redrawn from metrics.jsonl alone
    inv = generalized.blocks[1].attention.inverse_covariance.detach().double()[2]
    assert [full[f"attn/layer2/head3/inverse_covariance_{k}"] for k in ("rr", "rc", "cc")] == \
        pytest.approx([float(inv[0, 0]), float(inv[0, 1]), float(inv[1, 1])])
    assert epoch_metrics(build_model("learned-content", **SMALL)) == {}
    assert epoch_metrics(build_model("resnet18")) == {}


def test_content_metrics_average_per_image_statistics():
    torch.manual_seed(0)
    model = build_model("learned-content", **SMALL).eval()
    images = torch.randn(3, 3, 32, 32)
    result = model_metrics(model, images, batch_size=2)
    with torch.no_grad():
        x = model.tokens(images)
        probs = model.blocks[0].attention(x, return_attention=True)[1]
    expected = head_statistics(probs, 8, 8)
    assert [h["distance"] for h in result["layers"][0]["heads"]] == pytest.approx(expected["distance"].tolist())
    assert result["images"] == 3
    with pytest.raises(ValueError, match="need test images"):
        model_metrics(model)


@pytest.mark.parametrize("kernel", [3, 5])
def test_grid_distance_is_zero_for_a_layer_built_from_a_convolution(kernel):
    construct = pytest.importorskip("attncnn.theory.construct")
    conv = torch.nn.Conv2d(3, 4, kernel, padding=kernel // 2)
    layer = construct.attention_from_conv2d(conv).attention
    result = grid_distance(layer.centers.detach())
    assert result["kernel_size"] == kernel and result["distance"] == pytest.approx(0.0, abs=1e-9)
