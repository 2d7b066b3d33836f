"""Pruning degenerate heads: counts, parameters, unchanged outputs when pruned heads are silent,
rebuilding pruned models from their config, and `attncnn prune --out / --finetune-epochs`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attncnn.analysis.maps import attention_layers
from attncnn.analysis.metrics import quadratic_head_parameters
from attncnn.analysis.pruning import prune_degenerate_heads, prune_layer, pruned_metadata
from attncnn.cli import main
from attncnn.layers import QuadraticAttention
from attncnn.models import build_model, build_model_from_config, count_parameters
from attncnn.runs import load_model, read_metadata, save_checkpoint


def _silence(layer, heads):
    """Make heads degenerate (tiny spread) and zero their value columns."""
    dh = layer.head_dim
    with torch.no_grad():
        for h in heads:
            layer.spreads[h] = 1e-4 if not layer.full_covariance else 1e-4 * torch.eye(2)
            layer.value.weight[:, h * dh:(h + 1) * dh] = 0.0


@pytest.mark.parametrize("attention", ["quadratic", "quadratic-generalized"])
def test_pruning_silent_heads_keeps_the_outputs(attention):
    torch.manual_seed(0)
    model = build_model("demo", attention=attention, dim=16, mlp_dim=16, num_heads=9, num_layers=3).eval()
    _silence(model.blocks[0].attention, [1, 4])
    _silence(model.blocks[2].attention, [8])
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        before = model(images)
    params = count_parameters(model)
    result = prune_degenerate_heads(model)
    assert result.pruned == [[1, 4], [], [8]]
    assert result.heads_before == [9, 9, 9] and result.heads_after == [7, 9, 8]
    per_head = 2 + (4 if attention == "quadratic-generalized" else 1) + 16 * 16     # centre, spread, value block
    assert result.parameters_before == params and result.parameters_after == params - 3 * per_head
    assert result.parameters_after == count_parameters(model)
    with torch.no_grad():
        torch.testing.assert_close(model(images), before, rtol=1e-5, atol=1e-6)


def test_prune_layer_with_a_value_projection_and_errors():
    torch.manual_seed(0)
    layer = QuadraticAttention(8, 4, head_dim=3).eval()
    x = torch.randn(2, 5, 5, 8)
    with torch.no_grad():
        layer.value.weight[:, 3:6] = 0.0                      # head 1 silent
        small = prune_layer(layer, torch.tensor([True, False, True, True]))
        torch.testing.assert_close(small(x), layer(x))
    assert small.num_heads == 3 and small.value_in.out_features == 9
    with pytest.raises(ValueError, match="every head"):
        prune_layer(layer, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="quadratic"):
        prune_degenerate_heads(build_model("learned", num_layers=1, dim=16, mlp_dim=16))


def test_pruned_model_rebuilds_from_its_config(tmp_path):
    torch.manual_seed(0)
    model = build_model("demo", attention="quadratic-generalized", dim=16, mlp_dim=16, num_layers=3).eval()
    _silence(model.blocks[1].attention, [0, 2])
    result = prune_degenerate_heads(model)
    assert model.config.layer_heads == result.heads_after == [4, 2, 4]
    rebuilt = build_model_from_config("image-transformer", dataclasses.asdict(model.config)).eval()
    rebuilt.load_state_dict(model.state_dict())             # strict: every name and shape fits
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(images), model(images), rtol=0, atol=0)
    # ... and through a checkpoint with the metadata `attncnn prune --out` writes.
    options = {"attention": "quadratic-generalized", "dim": 16, "mlp_dim": 16, "num_layers": 3}
    meta = pruned_metadata(model, result, {"epoch": 7, "config": {"preset": "demo", "model": options}},
                           source="runs/x", condition_number=1000.0, min_eigenvalue=1e-5)
    save_checkpoint(tmp_path / "p.safetensors", model=model, metadata=meta)
    loaded, stored = load_model(tmp_path / "p.safetensors")
    assert stored["config"]["model"] == {**options, "layer_heads": [4, 2, 4]}
    assert stored["pruning"]["pruned"] == [[], [0, 2], []] and stored["epoch"] == 7
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images), rtol=0, atol=0)


def _prune_one_head(run) -> list[str]:
    """Thresholds that prune exactly the head with the smallest largest eigenvalue of Sigma^-1."""
    model, _ = load_model(run / "checkpoints" / "last.safetensors")      # what `prune RUN` loads
    largest = sorted(float(v) for layer in attention_layers(model)
                     for v in quadratic_head_parameters(layer)["eigenvalues"][:, 1])
    assert largest[0] < largest[1]
    return ["--min-eigenvalue", repr((largest[0] + largest[1]) / 2), "--condition-number", "inf"]


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_prune_finetunes_into_a_new_run_from_the_pruned_weights(runs, tmp_path, capsys):
    source = runs["generalized"]
    thresholds = _prune_one_head(source)
    expected, _ = load_model(source / "checkpoints" / "last.safetensors")
    result = prune_degenerate_heads(expected, condition_number=float("inf"),
                                    min_eigenvalue=float(thresholds[1]))
    assert sum(result.heads_after) == 7
    before = sorted(p.name for p in (source / "checkpoints").iterdir())
    out = tmp_path / "pruned"
    # lr 0: the weights never move, so the finished run still holds its starting weights.
    assert main(["prune", str(source), *thresholds, "--finetune-epochs", "1", "--lr", "0", "--out", str(out),
                 "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kept = out / "checkpoints" / "pruned.safetensors"
    assert report["heads_after"] == result.heads_after and report["pruned_checkpoint"] == str(kept)
    assert report["final"]["epoch"] == 1 and (out / "finished.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["layer_heads"] == result.heads_after
    assert config["epochs"] == 1 and config["lr"] == 0 and config["init_from"] == str(kept)
    assert config["model"]["attention"] == "quadratic-generalized"          # the source's options stay
    want = _state(expected)
    for path in (kept, out / "checkpoints" / "last.safetensors"):
        model, meta = load_model(path)
        assert model.config.layer_heads == result.heads_after
        got = _state(model)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), path
    assert sorted(p.name for p in (source / "checkpoints").iterdir()) == before        # source untouched
    # The pruned run reads like any other: its report names every layer's heads, its figure is drawn.
    assert main(["report", str(out), "--json", "--no-speed"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert f"heads {'/'.join(map(str, result.heads_after))}," in row["model"]
    assert row["parameters"] == count_parameters(expected)
    assert main(["plot", str(out), "--figures", "centers", "--formats", "png", "--out", str(tmp_path / "fig")]) == 0
    assert [p.stat().st_size > 0 for p in (tmp_path / "fig").rglob("*.png")] == [True]
    # A second run into the same folder is refused unless --overwrite.
    assert main(["prune", str(source), *thresholds, "--finetune-epochs", "1", "--out", str(out),
                 "--no-progress"]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


def test_prune_out_without_finetune_writes_an_evaluable_checkpoint(runs, tmp_path, capsys):
    path = tmp_path / "pruned.safetensors"
    assert main(["prune", str(runs["generalized"]), "--min-eigenvalue", "1e9", "--out", str(path)]) == 0
    assert f"pruned model: {path}" in capsys.readouterr().out
    model, meta = load_model(path)
    assert model.config.layer_heads == [1, 1] and meta["pruning"]["pruned_per_layer"] == [3, 3]
    source = read_metadata(runs["generalized"] / "checkpoints" / "last.safetensors")
    for key in ("dataset", "dataset_name", "image_size", "classes"):      # the data set it was trained on
        assert meta[key] == source[key], key
    assert main(["evaluate", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 12
    assert main(["prune", str(runs["generalized"]), "--out", str(path)]) == 2            # exists
    assert main(["prune", str(runs["generalized"]), "--out", str(tmp_path / "x")]) == 2   # not .safetensors
    assert main(["prune", str(runs["generalized"]), "--lr", "0.1"]) == 2                 # needs a fine-tune
    err = capsys.readouterr().err
    assert "--overwrite" in err and "must end in .safetensors" in err and "only apply to a fine-tune" in err


def test_the_finetune_of_a_bf16_run_uses_fp32_where_bf16_is_slow_unless_told(tiny_data, tmp_path, capsys,
                                                                               monkeypatch):
    from attncnn.perf import precision as run_precision

    source = tmp_path / "bf16"
    assert main(["train", "--preset", "demo", "--data", str(tiny_data), "--epochs", "1", "--batch-size", "10",
                 "--precision", "bf16", "--set", "dim=16", "--set", "mlp_dim=16", "--out", str(source),
                 "--no-progress"]) == 0
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: False)       # a CPU without bf16 units
    for given, expected in (([], "fp32"), (["--precision", "bf16"], "bf16")):
        out = tmp_path / f"pruned-{expected}"
        assert main(["prune", str(source), "--finetune-epochs", "1", "--lr", "0", "--out", str(out), "--no-progress",
                     "--json", *given]) == 0
        assert json.loads((out / "machine.json").read_text())["segments"][0]["precision"] == expected, given
    capsys.readouterr()
    assert main(["prune", str(source), "--precision", "fp32"]) == 2                  # nothing runs: refused
    assert "--precision only apply to a fine-tune" in capsys.readouterr().err
