"""Attention rollout against its definition: identity in, identity out; a plain loop of matrix products;
the model's rollout from hooked inputs equal to the rollout of the captured maps."""

from __future__ import annotations

import pytest
import torch

from attncnn.analysis import attention_maps, attention_rollout, model_rollout, position_maps
from attncnn.errors import InputError
from attncnn.models import build_model

SMALL = {"num_layers": 3, "num_heads": 4, "dim": 16, "mlp_dim": 16, "pooling": 4, "max_size": 8}


def _random_probs(batch, heads, n, generator):
    return torch.softmax(torch.randn(batch, heads, n, n, generator=generator, dtype=torch.float64), -1)


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(6).expand(2, 3, 6, 6)
    for rolled in attention_rollout([eye, eye, eye]):
        torch.testing.assert_close(rolled, torch.eye(6).expand(2, 6, 6))


def test_rollout_equals_a_plain_loop_of_matrix_products():
    g = torch.Generator().manual_seed(0)
    layers = [_random_probs(1, 3, 5, g), _random_probs(2, 3, 5, g), _random_probs(1, 3, 5, g)]   # batch 1 broadcasts
    rolled = attention_rollout(layers)
    for b in range(2):
        product = torch.eye(5, dtype=torch.float64)
        for layer, got in zip(layers, rolled):
            probs = layer[min(b, layer.shape[0] - 1)]
            mixed = torch.zeros(5, 5, dtype=torch.float64)
            for q in range(5):
                for k in range(5):
                    mixed[q, k] = 0.5 * sum(probs[h, q, k] for h in range(3)) / 3 + 0.5 * (q == k)
            product = mixed @ product
            torch.testing.assert_close(got[min(b, got.shape[0] - 1)].double(), product, rtol=1e-5, atol=1e-6)
    assert [r.shape for r in rolled] == [(1, 5, 5), (2, 5, 5), (2, 5, 5)]
    assert rolled[-1].sum(-1).flatten().tolist() == pytest.approx([1.0] * 10)


def test_rollout_errors():
    with pytest.raises(InputError, match="at least one"):
        attention_rollout([])
    with pytest.raises(InputError, match="every query"):
        attention_rollout([torch.ones(1, 1, 2, 4) / 4])
    with pytest.raises(InputError, match="different token counts"):
        attention_rollout([torch.eye(4)[None, None], torch.eye(9)[None, None]])


def test_model_rollout_of_a_content_model_equals_the_rollout_of_its_maps():
    torch.manual_seed(0)
    model = build_model("learned-content", **SMALL).eval()
    images = torch.randn(3, 3, 32, 32)
    expected = attention_rollout(attention_maps(model, images))
    got = model_rollout(model, images, batch_size=2)
    for m, e in zip(got, expected):
        assert m.probs.shape == (3, 1, 64, 64) and not m.position_only
        torch.testing.assert_close(m.probs[:, 0], e, rtol=1e-4, atol=1e-6)
    averaged = model_rollout(model, images, average=True, batch_size=2)
    torch.testing.assert_close(averaged[-1].probs[:, 0], expected[-1].mean(0, keepdim=True), rtol=1e-4, atol=1e-6)


def test_model_rollout_of_a_position_only_model_needs_no_images():
    model = build_model("quadratic", **SMALL).eval()
    expected = attention_rollout(position_maps(model, (8, 8)))
    without = model_rollout(model, grid_size=(8, 8))
    with_images = model_rollout(model, torch.randn(2, 3, 32, 32))
    for a, b, e in zip(without, with_images, expected):
        assert a.probs.shape == b.probs.shape == (1, 1, 64, 64)
        torch.testing.assert_close(a.probs[:, 0], e)
        torch.testing.assert_close(b.probs[:, 0], e)
    with pytest.raises(InputError, match="needs images"):
        model_rollout(build_model("learned-content", **SMALL))
