"""Issue 26's presets: the DeiT-style baseline and GPSA set up as ConViT sets it up. Models are built
on the CPU (the same initial weights everywhere) and computed on the ``device`` of tests/conftest.py."""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import space_to_depth
from attncnn.models import build_model

D, MLP, LAYERS, HEADS, CLASSES = 72, 144, 6, 9, 10


def _linear(i, o, bias=True):
    return i * o + (o if bias else 0)


def _block_without_attention():
    return _linear(D, D) + 2 * D + _linear(D, MLP) + _linear(MLP, D) + 2 * D


def _outer():
    return _linear(12, D) + _linear(D, CLASSES)                 # 2x2x3 tokens -> D, D -> classes


def test_deit_mini_parameter_count():
    attention = 4 * _linear(D, D)                                 # value_in (72 -> 9 x 8), value, query, key
    pos_embed = 16 * 16 * D
    expected = _outer() + LAYERS * (_block_without_attention() + attention) + pos_embed
    assert expected == 305_218
    assert sum(p.numel() for p in build_model("deit-mini").parameters()) == expected


def test_convit_mini_parameter_count():
    attention = 2 * _linear(D, D) + 2 * _linear(D, D, bias=False) + HEADS * 3 + HEADS   # + v_pos, gates
    expected = _outer() + LAYERS * (_block_without_attention() + attention)
    assert expected == 286_138
    assert sum(p.numel() for p in build_model("convit-mini").parameters()) == expected


def test_convit_mini_starts_as_convit_does(device):
    torch.manual_seed(0)
    model = build_model("convit-mini").to(device)
    qk = []
    for block in model.blocks:
        layer = block.attention
        assert layer.query.bias is None and layer.key.bias is None
        assert torch.equal(layer.value_in.weight, torch.eye(D, device=device)) and not layer.value_in.bias.any()
        qk.append(torch.cat([layer.query.weight.flatten(), layer.key.weight.flatten()]))
        # local init: head h's positional map peaks at the h-th shift of the 3x3 kernel
        probs = layer.positional_probs(16, 16)[0]                      # (N_h, N, N)
        center = 8 * 16 + 8
        peaks = probs[:, center].argmax(-1)
        shifts = [(int(p) // 16 - 8, int(p) % 16 - 8) for p in peaks]
        assert shifts == [(u, v) for u in (-1, 0, 1) for v in (-1, 0, 1)]
    std = float(torch.cat(qk).detach().std())
    assert 0.019 < std < 0.021                                      # ~62,000 draws of N(0, 0.02^2)


def test_the_deit_position_embedding_breaks_the_bag_of_tokens(device):
    """Plain content attention with mean pooling ignores where a patch is; the learned absolute
    position embedding is what lets the DeiT-style model see it."""
    torch.manual_seed(0)
    model = build_model("deit-mini").eval().to(device)
    images = torch.randn(2, 3, 32, 32).to(device)
    # swap two 2x2 patches (token (0, 0) and token (5, 9)): the same bag of tokens in other places
    swapped = images.clone()
    swapped[..., 0:2, 0:2], swapped[..., 10:12, 18:20] = images[..., 10:12, 18:20], images[..., 0:2, 0:2]
    with torch.no_grad():
        assert not torch.allclose(model(images), model(swapped), atol=1e-6)
        model.pos_embed.zero_()
        torch.testing.assert_close(model(images), model(swapped), rtol=1e-5, atol=1e-6)
    assert "pos_embed" in model.no_weight_decay()
    assert model.pos_embed.shape == (1, 16, 16, D)
    tokens = space_to_depth(images.permute(0, 2, 3, 1), 2)
    assert tokens.shape[1:3] == model.pos_embed.shape[1:3]


def test_a_learned_position_embedding_refuses_other_image_sizes():
    model = build_model("deit-mini")
    with pytest.raises(ValueError, match=r"learned position embedding is for 32x32 images, got 24x24; build the "
                                         r"model for them \(model option image_size=24; --set image_size=24"):
        model(torch.randn(1, 3, 24, 24))
    with pytest.raises(ValueError, match=r"got 24x32; resize them \(an absolute"):
        model(torch.randn(1, 3, 24, 32))
    assert build_model("deit-mini", image_size=24)(torch.randn(1, 3, 24, 24)).shape == (1, 10)
    with pytest.raises(ValueError, match="image_size divisible by the pooling width 2"):
        build_model("deit-mini", image_size=31)
    with pytest.raises(ValueError, match="pos_embed must be one of none, learned"):
        build_model("deit-mini", pos_embed="sinusoidal")


@pytest.mark.parametrize("option", [{"qk_bias": False}, {"qk_init_std": 0.02}])
def test_query_key_options_belong_to_the_content_kinds(option):
    with pytest.raises(ValueError, match=f"{next(iter(option))} applies to attention='content' or 'gpsa' only"):
        build_model("quadratic-mini", **option)
