"""Per-layer head counts (``ImageTransformerConfig.layer_heads``), needed by pruned models (PAPER.md 3.8)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attncnn.cli import build_parser
from attncnn.models import ImageTransformerConfig, build_model, build_model_from_config, count_parameters
from attncnn.runs import load_model, resolve_config, save_checkpoint

SMALL = {"dim": 16, "mlp_dim": 16, "num_layers": 3, "num_heads": 4}


def test_layer_heads_sets_each_layer_and_none_keeps_num_heads():
    model = build_model("demo", **SMALL, layer_heads=[4, 1, 3])
    assert [b.attention.num_heads for b in model.blocks] == [4, 1, 3]
    assert model.config.heads() == [4, 1, 3]
    default = build_model("demo", **SMALL)
    assert default.config.layer_heads is None and default.config.heads() == [4, 4, 4]
    # An explicit list equal to num_heads everywhere builds the same network.
    assert count_parameters(build_model("demo", **SMALL, layer_heads=[4, 4, 4])) == count_parameters(default)
    per_head = 2 + 1 + 16 * 16      # isotropic head: centre, spread, a 16x16 block of the value matrix
    assert count_parameters(model) == count_parameters(default) - 4 * per_head


def test_the_papers_pruned_pattern_has_the_derived_parameter_count():
    # PAPER.md 3.8: [2, 4, 1, 2, 6, 0] heads pruned from 9 per layer; 12.09 M -> 9.69 M parameters.
    assert count_parameters(build_model("quadratic-generalized", layer_heads=[7, 5, 8, 7, 3, 9])) == 9_686_916


@pytest.mark.parametrize("value,match", [
    ([4, 4], r"layer_heads has 2 entries \[4, 4\] but the model has num_layers=3.*layer_heads=None"),
    ([4, 0, 4], r"layer\(s\) \[2\] have fewer than 1 head"),
    ([4, 4.0, 4], r"'layer_heads' must be a list of integers or None, got \[4, 4.0, 4\] \(a list\)"),
    ("4,4,4", r"'layer_heads' must be a list of integers or None, got '4,4,4' \(a string\)"),
])
def test_bad_layer_heads_name_the_field(value, match):
    with pytest.raises(ValueError, match=match):
        build_model("demo", **SMALL, layer_heads=value)


def test_config_checks_layer_heads_without_the_builder():
    with pytest.raises(ValueError, match="layer_heads must be a list of integers"):
        ImageTransformerConfig(num_layers=2, layer_heads=[True, 2])
    assert ImageTransformerConfig(num_layers=2, layer_heads=(3, 2)).layer_heads == [3, 2]   # JSON-friendly list


def test_layer_heads_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = build_model("demo", attention="quadratic-generalized", **SMALL, layer_heads=[2, 4, 1]).eval()
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model=model, metadata={"arch": "image-transformer",
                                                 "model_config": dataclasses.asdict(model.config)})
    loaded, meta = load_model(path)
    assert loaded.config.layer_heads == [2, 4, 1] and meta["model_config"]["layer_heads"] == [2, 4, 1]
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images), rtol=0, atol=0)
    rebuilt = build_model_from_config("image-transformer", dataclasses.asdict(model.config))
    rebuilt.load_state_dict(model.state_dict())          # strict: same names and shapes


def test_cli_set_parses_layer_heads_into_the_training_config():
    args = build_parser().parse_args(["train", "--preset", "demo", "--set", "layer_heads=[3,2]"])
    config = resolve_config("demo", model=dict(args.model))
    assert config.model == {"layer_heads": [3, 2]}
    assert [b.attention.num_heads for b in build_model("demo", **config.model).blocks] == [3, 2]
