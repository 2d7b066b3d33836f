"""``attncnn convert-reference`` / ``export-reference``, and commands reading a converted run folder."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from reference_format import reference_config, reference_state

import attncnn
from attncnn.cli import main


@pytest.fixture
def reference_run(tmp_path):
    """A tiny reference quadratic run folder: final.checkpoint + config.yaml (CIFAR-10, 32x32 images)."""
    cfg = reference_config("quadratic", layers=1, heads=4, dim=8, mlp=6)
    folder = tmp_path / "reference"
    folder.mkdir()
    torch.save({"epoch": 9, "test_accuracy": 0.25, "model_state_dict": reference_state(cfg)},
               folder / "final.checkpoint")
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder / "final.checkpoint"


def test_convert_then_evaluate_and_load(tmp_path, reference_run, cifar10_path, capsys):
    run = tmp_path / "run"
    assert main(["convert-reference", str(reference_run), "--out", str(run)]) == 0
    assert f"run folder: {run}" in capsys.readouterr().out
    assert main(["evaluate", str(run), "--data", str(cifar10_path), "--sample", "200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["examples"] == 200 and result["epoch"] == 10 and 0 <= result["test_accuracy"] <= 1
    model = attncnn.load_model(run)
    images = torch.rand(3, 3, 32, 32)
    assert model(images).shape == (3, 10) and model.predict(images)[0] in model.classes


def test_export_with_an_explicit_config_and_overwrite_rules(tmp_path, reference_run, capsys):
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text((reference_run.parent / "config.yaml").read_text())
    lone = tmp_path / "lone" / "best.checkpoint"
    lone.parent.mkdir()
    lone.write_bytes(reference_run.read_bytes())
    run = tmp_path / "run"
    assert main(["convert-reference", str(lone), "--out", str(run), "--config", str(elsewhere)]) == 0
    assert json.loads((run / "reference.json").read_text())["config_source"] == str(elsewhere)
    out = tmp_path / "back" / "final.checkpoint"
    assert main(["export-reference", str(run), "--out", str(out)]) == 0
    assert (tmp_path / "back" / "config.yaml").is_file() and torch.load(out, weights_only=True)["epoch"] == 9
    capsys.readouterr()
    assert main(["export-reference", str(run), "--out", str(out)]) == 2            # exists: refused, one line
    assert "already exists" in capsys.readouterr().err
    assert main(["export-reference", str(run), "--out", str(out), "--overwrite"]) == 0
    assert main(["convert-reference", str(lone), "--out", str(run), "--config", str(elsewhere)]) == 2


def test_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.checkpoint"
    bad.write_bytes(b"not a checkpoint at all")
    assert main(["convert-reference", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a readable PyTorch file" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run").exists()


def test_export_refuses_a_kind_the_reference_does_not_have(tmp_path, capsys):
    from attncnn.models import build_model
    from attncnn.runs import Checkpoint, TrainConfig, write_checkpoint

    model = build_model("gpsa-mini", num_layers=1)
    recipe = TrainConfig(preset="gpsa-mini", model={"num_layers": 1})
    write_checkpoint(tmp_path / "gpsa.safetensors", Checkpoint(model.state_dict(), None, {}, {
        "arch": model.arch, "model_config": model.to_dict(), "config": recipe.to_dict(), "epoch": 1}))
    assert main(["export-reference", str(tmp_path / "gpsa.safetensors"), "--out", str(tmp_path / "x.checkpoint")]) == 2
    assert "no counterpart of attncnn's 'gpsa'" in capsys.readouterr().err
    assert not (tmp_path / "x.checkpoint").exists() and not (tmp_path / "config.yaml").exists()
