"""Space-to-depth pooling and the cached relative-position tensors, built on the ``device`` of
tests/conftest.py (inputs drawn on the CPU, then moved)."""

import pytest
import torch

from attncnn.layers import axis_offsets, depth_to_space, quadratic_features, relative_offsets, space_to_depth
from attncnn.layers.relative import distinct_offsets


def test_space_to_depth_round_trip_and_layout(device):
    x = torch.randn(2, 32, 32, 3).to(device)
    y = space_to_depth(x, 2)
    assert y.shape == (2, 16, 16, 12)
    assert torch.equal(depth_to_space(y, 2), x)
    # token [i, j] holds x[2i + a, 2j + b, c] at channel (2a + b)*3 + c
    for i, j, a, b, c in [(0, 0, 0, 0, 0), (3, 5, 1, 0, 2), (15, 15, 1, 1, 1), (7, 2, 0, 1, 0)]:
        assert y[1, i, j, (2 * a + b) * 3 + c] == x[1, 2 * i + a, 2 * j + b, c]


def test_space_to_depth_non_square_and_size_4(device):
    x = torch.randn(1, 8, 12, 5).to(device)
    y = space_to_depth(x, 4)
    assert y.shape == (1, 2, 3, 80)
    assert torch.equal(depth_to_space(y, 4), x)


@pytest.mark.parametrize("shape", [(1, 31, 32, 3), (1, 32, 29, 3)])
def test_space_to_depth_rejects_indivisible(shape):
    with pytest.raises(ValueError, match="not divisible by the pooling width 2"):
        space_to_depth(torch.zeros(shape), 2)


def test_space_to_depth_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"\(B, H, W, C\)"):
        space_to_depth(torch.zeros(3, 32, 32), 2)


@pytest.mark.parametrize("h,w", [(3, 5), (1, 7), (4, 1), (6, 6)])
def test_relative_offsets_non_square(h, w, device):
    d = relative_offsets(h, w, device)
    assert d.shape == (h * w, h * w, 2) and d.device == device
    d = d.cpu()
    for q in range(h * w):
        for k in range(h * w):
            assert d[q, k, 0] == k // w - q // w
            assert d[q, k, 1] == k % w - q % w


def test_quadratic_features_match_eq9(device):
    d = relative_offsets(3, 4, device)
    r = quadratic_features(3, 4, device)
    assert torch.equal(r[..., 0], d.square().sum(-1))
    assert torch.equal(r[..., 1:], d)
    g = quadratic_features(3, 4, device, generalized=True)
    assert torch.equal(g[..., 4], d[..., 0] * d[..., 1])


@pytest.mark.parametrize("h,w", [(1, 1), (3, 5), (16, 16), (7, 2)])
def test_distinct_offsets_index_every_pair_to_its_own_shift(h, w, device):
    shifts, index = distinct_offsets(h, w, device)
    assert shifts.shape == ((2 * h - 1) * (2 * w - 1), 2) and index.shape == (h * w, h * w)
    assert torch.equal(shifts[index], relative_offsets(h, w, device))
    assert len(set(map(tuple, shifts.tolist()))) == shifts.shape[0]              # each shift once
    assert set(index.unique().tolist()) == set(range(shifts.shape[0]))          # and each one used


def test_axis_offsets(device):
    assert axis_offsets(3, device).tolist() == [[0, 1, 2], [-1, 0, 1], [-2, -1, 0]]


def test_offsets_cached_under_inference_mode_still_work_with_autograd(device):
    relative_offsets.cache_clear()
    with torch.inference_mode():
        relative_offsets(5, 5, device)
    centers = torch.zeros(2, device=device, requires_grad=True)
    loss = ((relative_offsets(5, 5, device) - centers) ** 2).sum()
    loss.backward()
    assert centers.grad is not None
