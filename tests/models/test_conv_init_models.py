"""Issue 14 at the model level: the init="conv" options, GPSA models, and the new presets' exact
parameter counts (derived by hand, in the style of test_mini_presets.py). The maps and the
convolution equality are computed on the ``device`` of tests/conftest.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attncnn
from attncnn.layers import kernel_shifts
from attncnn.models import build_model, count_parameters, get_preset, preset_model_config

# -- parameter counts ------------------------------------------------------------------------------
HEADS, LAYERS, CLASSES, TOKENS_IN, TABLE_ROWS = 9, 6, 10, 12, 2 * 16 - 1


def transformer(d: int, mlp: int, attention_params: int) -> int:
    """Embedding + classifier + per layer: dense D->D, two LayerNorms, MLP, folded values, attention's own."""
    block = (d * d + d) + 2 * (2 * d) + (d * mlp + mlp) + (mlp * d + d)
    values = HEADS * d * d + d
    return (TOKENS_IN * d + d) + (d * CLASSES + CLASSES) + LAYERS * (block + values + attention_params)


def gpsa(d: int) -> int:
    """q and k (D -> 9 x D with bias: full-width heads), v_pos (3 per head), one gate lambda per head."""
    return 2 * (d * HEADS * d + HEADS * d) + 3 * HEADS + HEADS


def gpsa_narrow(d: int, head_dim: int) -> int:
    """GPSA with heads of width head_dim < D: q, k and the value projection value_in (D -> 9 x head_dim
    with bias), v_pos and gates; the folded output takes 9 x head_dim (not 9 x D) inputs, which the
    difference to transformer()'s full-width ``values`` accounts for."""
    inner = HEADS * head_dim
    return 3 * (d * inner + inner) + 3 * HEADS + HEADS - (HEADS * d * d - inner * d)


COUNTS = {
    "gpsa": transformer(400, 512, gpsa(400)),
    "gpsa-mini": transformer(64, 128, gpsa_narrow(64, 16)),
    "quadratic-conv": transformer(400, 512, HEADS * 2 + HEADS),             # the init adds no parameter
    "learned-conv": transformer(400, 512, 2 * TABLE_ROWS * 400 + 2 * 400 * HEADS),
    "quadratic-conv-mini": transformer(64, 128, HEADS * 2 + HEADS),
    "learned-conv-mini": transformer(64, 128, 2 * TABLE_ROWS * 64 + 2 * 64 * HEADS),
}


@pytest.mark.parametrize("name,count", COUNTS.items())
def test_new_preset_parameter_counts(name, count):
    assert count_parameters(build_model(name)) == count


def test_hand_counts():
    assert COUNTS["gpsa"] == 29_410_098 and COUNTS["gpsa-mini"] == 351_810
    assert COUNTS["quadratic-conv-mini"] == 349_164 and COUNTS["learned-conv-mini"] == 379_722
    # the paper-scale conv variants have their random-init presets' counts (tests/models/test_models.py)
    assert COUNTS["quadratic-conv"] == 12_086_844 and COUNTS["learned-conv"] == 12_278_682


@pytest.mark.parametrize("name", ["gpsa-mini", "quadratic-conv-mini", "learned-conv-mini"])
def test_new_mini_presets_are_the_mini_geometry_and_recipe(name):
    preset, reference = get_preset(name), get_preset("quadratic-mini")
    assert preset.train == reference.train
    assert {k: v for k, v in preset.model.items() if k not in ("attention", "init", "head_dim")} == \
        {k: v for k, v in reference.model.items() if k != "attention"}
    assert preset.model["init"] == "conv"
    assert get_preset("gpsa").train == get_preset("quadratic").train


@pytest.mark.parametrize("name,base", [("quadratic-conv", "quadratic"), ("learned-conv", "learned")])
def test_paper_scale_conv_presets_differ_from_the_papers_only_in_init(name, base):
    preset, reference = get_preset(name), get_preset(base)
    assert preset.train == reference.train and preset.arch == reference.arch
    assert preset.model == {**reference.model, "init": "conv"}


# -- init="conv" in models --------------------------------------------------------------------------

def test_build_model_quadratic_with_conv_init():
    model = attncnn.build_model("quadratic", init="conv")
    for block in model.blocks:
        assert torch.equal(block.attention.centers.detach().double(), kernel_shifts(3))
        assert torch.allclose(block.attention.alpha, torch.ones(9))                  # locality_strength 1.0


def test_learned_and_gpsa_presets_start_with_the_quadratic_presets_maps(device):
    torch.manual_seed(0)
    quadratic = build_model("quadratic-conv-mini", num_layers=2).double().to(device)
    learned = build_model("learned-conv-mini", num_layers=2).double().to(device)
    gpsa = build_model("gpsa-mini", num_layers=2).double().to(device)
    for q, lb, g in zip(quadratic.blocks, learned.blocks, gpsa.blocks):
        # built in float32: the quadratic spread sqrt(2) is rounded there (alpha 1 +- 1e-7), the learned
        # and GPSA coefficients (-1, 2 Delta, -Delta^2) are exact
        expected = q.attention.grid_probs(16, 16)
        torch.testing.assert_close(lb.attention.grid_probs(16, 16), expected, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(g.attention.positional_probs(16, 16), lb.attention.grid_probs(16, 16),
                                   rtol=1e-10, atol=1e-14)
        assert torch.allclose(g.attention.gates(), torch.full((9,), 1 / (1 + math.exp(-1)), dtype=torch.float64,
                                                              device=device))


def test_value_init_conv_makes_each_layer_the_dilated_convolution(device):
    torch.manual_seed(0)
    model = build_model("quadratic-conv-mini", num_layers=1, dim=8, mlp_dim=8, value_init="conv",
                        locality_strength=708.0, conv_dilation=2).double().to(device)
    layer = model.blocks[0].attention
    kernel = layer.value.weight.detach().reshape(8, 3, 3, 8).permute(0, 3, 1, 2)      # (out, in, K, K)
    x = torch.randn(2, 8, 9, 10, dtype=torch.float64).to(device)
    ref = F.conv2d(x, kernel, layer.value.bias.detach(), padding=2, dilation=2).permute(0, 2, 3, 1)
    with torch.no_grad():
        out = layer(F.pad(x.permute(0, 2, 3, 1), (0, 0, 2, 2, 2, 2)))[:, 2:-2, 2:-2]
    assert (out - ref).abs().max() <= 1e-12 * ref.abs().max()


def test_pruned_layers_with_other_head_counts_keep_the_random_init():
    torch.manual_seed(0)
    model = build_model("quadratic-conv-mini", num_layers=2, layer_heads=[9, 4])
    assert torch.equal(model.blocks[0].attention.centers.detach().double(), kernel_shifts(3))
    assert model.blocks[1].attention.num_heads == 4 and model.blocks[1].attention.centers.abs().max() > 0.1


# -- options: validation and the --set path ---------------------------------------------------------

@pytest.mark.parametrize("options,match", [
    ({"init": "convolution"}, "init must be one of random, conv"),
    ({"value_init": "kernel"}, "value_init must be one of random, conv"),
    ({"init": "conv", "num_heads": 4}, "num_heads=4; set num_heads to 9"),
    ({"init": "conv", "num_heads": 16}, "num_heads=16"),
    ({"init": "conv", "conv_kernel_size": 5}, "conv_kernel_size=5 with num_heads=9"),
    ({"init": "conv", "attention": "content"}, "init='conv' needs a positional attention kind"),
    ({"init": "conv", "attention": "learned", "table_dim": 2}, "set table_dim >= 3"),
    ({"init": "conv", "attention": "learned-content", "dim": 4}, "set head_dim \\(or dim\\) >= 6"),
    ({"value_init": "conv"}, "value_init='conv' needs init='conv'"),
    ({"init": "conv", "value_init": "conv", "head_dim": 16}, "set head_dim=None or value_init='random'"),
    ({"locality_strength": 0.0}, "locality_strength must be a positive finite number"),
    ({"locality_strength": math.inf}, "locality_strength must be a positive finite number"),
    ({"conv_dilation": 0}, "conv_dilation must be >= 1"),
    ({"conv_kernel_size": 0}, "conv_kernel_size must be >= 1"),
    ({"freeze_gate": True}, "freeze_gate applies to attention='gpsa' only"),
])
def test_bad_options_name_the_field_and_the_fix(options, match):
    with pytest.raises(ValueError, match=match):
        preset_model_config("quadratic-mini", **options)


def test_set_options_from_the_command_line_are_typed_and_checked():
    from attncnn.runs import resolve_config
    from attncnn.cli._parsing import key_value

    given = dict(key_value(s) for s in ["init=conv", "locality_strength=2", "conv_kernel_size=None",
                                         "conv_dilation=2", "value_init=conv", "freeze_gate=True",
                                         "head_dim=None"])       # value_init=conv needs full-width heads
    config = resolve_config("gpsa-mini", model=given)
    arch, model_config = preset_model_config(config.preset, **config.model)
    assert (model_config.init, model_config.locality_strength, model_config.conv_dilation) == ("conv", 2.0, 2)
    assert model_config.freeze_gate and model_config.value_init == "conv"
    with pytest.raises(ValueError, match="model option 'conv_dilation' must be"):
        resolve_config("quadratic-mini", model=dict([key_value("conv_dilation=1.5")]))
    with pytest.raises(ValueError, match="num_heads=4"):
        resolve_config("quadratic-mini", model={"init": "conv", "num_heads": 4})
