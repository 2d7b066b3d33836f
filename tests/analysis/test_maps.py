"""Attention maps come from each layer's real input, through hooks that leave no trace."""

from __future__ import annotations

import pytest
import torch

from attncnn.analysis import (attention_layers, attention_maps, attention_maps_by_kind, layer_values, position_maps,
                              record_attention)
from attncnn.models import build_model

SMALL = {"num_layers": 3, "num_heads": 4, "dim": 16, "mlp_dim": 16, "pooling": 4, "max_size": 8}


def _manual_probs(model, images):
    """Block by block: each attention layer's probabilities on that block's own input."""
    out = []
    with torch.no_grad():
        x = model.tokens(images)
        for block in model.blocks:
            out.append(block.attention(x, return_attention=True)[1])
            x = block(x)
    return out


@pytest.mark.parametrize("preset", ["learned-content", "learned-content-9ffaa", "quadratic", "learned"])
def test_maps_equal_each_layers_explicit_path_on_its_real_input(preset):
    torch.manual_seed(0)
    model = build_model(preset, **SMALL).eval()
    images = torch.randn(3, 3, 32, 32)
    maps = attention_maps(model, images, batch_size=2)
    expected = _manual_probs(model, images)
    assert len(maps) == 3
    for m, e in zip(maps, expected):
        assert (m.height, m.width) == (8, 8)
        if m.position_only:
            assert m.probs.shape == (1, 4, 64, 64)
        torch.testing.assert_close(m.probs, e.expand_as(m.probs) if m.position_only else e)


def test_deeper_layers_do_not_see_the_embeddings_convit23():
    torch.manual_seed(0)
    model = build_model("learned-content", **SMALL).eval()
    images = torch.randn(2, 3, 32, 32)
    maps = attention_maps(model, images)
    with torch.no_grad():
        refed = model.blocks[1].attention(model.tokens(images), return_attention=True)[1]
    assert not torch.allclose(maps[1].probs, refed, atol=1e-4)


def test_average_and_query_subset():
    torch.manual_seed(0)
    model = build_model("learned-content", **SMALL)
    images = torch.randn(4, 3, 32, 32)
    full = attention_maps(model, images)
    mean = attention_maps(model, images, average=True, batch_size=3)
    some = attention_maps(model, images, queries=[0, 27])
    for f, m, s in zip(full, mean, some):
        torch.testing.assert_close(m.probs, f.probs.mean(0, keepdim=True))
        torch.testing.assert_close(s.probs, f.probs[:, :, [0, 27]])
        assert s.queries == [0, 27]
    assert model.training                      # mode restored


def test_hooks_are_removed_even_after_an_error():
    model = build_model("quadratic", **SMALL)

    def boom(index, layer, x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        with record_attention(model, boom):
            model(torch.randn(1, 3, 32, 32))
    assert all(not layer._forward_pre_hooks for layer in attention_layers(model))


def test_position_maps_without_images_and_errors():
    model = build_model("quadratic", **SMALL)
    maps = position_maps(model)                 # 32x32 images -> 8x8 tokens
    assert maps[0].probs.shape == (1, 4, 64, 64)
    torch.testing.assert_close(maps[2].probs, model.blocks[2].attention.grid_probs(8, 8).detach())
    assert position_maps(model, (5, 6))[0].probs.shape == (1, 4, 30, 30)
    with pytest.raises(ValueError, match="depends on the input"):
        position_maps(build_model("learned-content", **SMALL))
    with pytest.raises(ValueError, match="no self-attention"):
        attention_maps(build_model("resnet18"), torch.randn(1, 3, 32, 32))


def test_score_kinds_add_up_to_the_probabilities():
    torch.manual_seed(0)
    model = build_model("learned-content", **SMALL).eval()
    layer = model.blocks[0].attention
    x = torch.randn(2, 8, 8, 16)
    with torch.no_grad():
        scores = layer_values(layer, x, "scores")
        torch.testing.assert_close(scores, layer_values(layer, x, "content") + layer_values(layer, x, "positional"))
        torch.testing.assert_close(torch.softmax(scores, -1), layer_values(layer, x, "probs"))
    with pytest.raises(ValueError, match="no content scores"):
        layer_values(build_model("learned", **SMALL).blocks[0].attention, x, "content")
    with pytest.raises(ValueError, match="unknown attention value kind"):
        layer_values(layer, x, "nope")


@pytest.mark.parametrize("preset", ["learned-content", "learned-content-9ffaa", "quadratic"])
def test_several_kinds_in_one_pass_equal_one_kind_at_a_time(preset):
    torch.manual_seed(0)
    model = build_model(preset, **SMALL).eval()
    images = torch.randn(3, 3, 32, 32)
    kinds = ["content", "positional", "probs"] if preset.startswith("learned-content") else ["probs", "scores"]
    for average in (False, True):
        together = attention_maps_by_kind(model, images, kinds, average=average, queries=[1, 9], batch_size=2)
        assert list(together) == kinds
        for kind in kinds:
            alone = attention_maps(model, images, kind=kind, average=average, queries=[1, 9], batch_size=2)
            for a, b in zip(together[kind], alone):
                assert (a.layer, a.height, a.width, a.position_only, a.queries) == (
                    b.layer, b.height, b.width, b.position_only, b.queries)
                torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=0)


def test_the_probabilities_are_probs_and_the_old_name_warns():
    from attncnn.analysis import LayerMaps
    maps = LayerMaps(0, torch.full((1, 2, 4, 4), 0.25), 2, 2, True)
    with pytest.warns(DeprecationWarning, match="use .probs"):
        assert maps.values is maps.probs
