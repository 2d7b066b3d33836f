"""The command line end to end on a tiny image-folder dataset written by the test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attncnn.cli import main
from attncnn.training import load_checkpoint

CLASSES = ("cat", "dog", "frog")


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> Path:
    """3 classes, 20 train + 6 test PNGs each; class c has a brighter channel c (learnable)."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 6)):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 120, size=(32, 32, 3), dtype=np.uint8)
                img[..., c] += 120
                Image.fromarray(img).save(folder / f"{i:03d}.png")
    return root


def _train(tmp_path, data, *extra, out="run"):
    return main(["train", "--preset", "demo", "--data", str(data), "--epochs", "2", "--batch-size", "10",
                 "--out", str(tmp_path / out), "--no-progress", "--checkpoint-every", "1", *extra])


def test_train_writes_a_complete_run_folder(tmp_path, tiny_dataset, capsys):
    assert _train(tmp_path, tiny_dataset) == 0
    out = capsys.readouterr().out
    assert "test accuracy:" in out
    run = tmp_path / "run"
    config = json.loads((run / "config.json").read_text())
    assert config["preset"] == "demo" and config["epochs"] == 2 and config["batch_size"] == 10
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2]
    for key in ("lr", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "seconds", "images_per_second"):
        assert all(key in r for r in lines), key
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in lines)
    ckpts = {p.name for p in (run / "checkpoints").iterdir()}
    assert {"best.safetensors", "last.safetensors", "epoch_0001.safetensors", "epoch_0002.safetensors"} <= ckpts
    assert any((run / "tb").iterdir())          # TensorBoard events
    assert (run / "finished.json").exists()
    last = load_checkpoint(run / "checkpoints" / "last.safetensors")
    assert last.metadata["epoch"] == 2 and last.metadata["classes"] == list(CLASSES)


def test_evaluate_reproduces_the_logged_accuracy(tmp_path, tiny_dataset, capsys):
    assert _train(tmp_path, tiny_dataset) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert main(["evaluate", str(run / "checkpoints" / "last.safetensors"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["examples"] == 18
    assert result["test_accuracy"] == pytest.approx(lines[-1]["test_accuracy"])
    assert result["test_loss"] == pytest.approx(lines[-1]["test_loss"], rel=1e-5)


def test_existing_run_folder_is_refused_unless_overwrite(tmp_path, tiny_dataset, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    assert _train(tmp_path, tiny_dataset) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err
    assert _train(tmp_path, tiny_dataset, "--overwrite") == 0


def test_resume_continues_to_the_same_weights(tmp_path, tiny_dataset):
    """A run cut after epoch 1 and resumed ends with the same weights as an uninterrupted run."""
    assert _train(tmp_path, tiny_dataset, out="full") == 0
    assert _train(tmp_path, tiny_dataset, out="cut") == 0
    cut = tmp_path / "cut"
    # Roll the folder back to its state after epoch 1.
    (cut / "finished.json").unlink()
    (cut / "checkpoints" / "epoch_0001.safetensors").replace(cut / "checkpoints" / "last.safetensors")
    (cut / "checkpoints" / "epoch_0002.safetensors").unlink()
    # metrics.jsonl keeps its epoch-2 line, as after a crash between logging and checkpointing:
    # the resume must drop it rather than log epoch 2 twice.
    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0
    full = load_checkpoint(tmp_path / "full" / "checkpoints" / "last.safetensors").model_state
    resumed = load_checkpoint(cut / "checkpoints" / "last.safetensors").model_state
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name
    epochs = [json.loads(line)["epoch"] for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]


def test_presets_json_prints_exact_counts(capsys):
    assert main(["presets", "--json"]) == 0
    rows = {r["name"]: r["parameters"] for r in json.loads(capsys.readouterr().out)}
    assert rows["quadratic"] == 12_086_844 and rows["learned-content"] == 29_484_282
    assert rows["resnet18"] == 11_173_962


@pytest.mark.parametrize("argv,match", [
    (["train", "--preset", "gaussian"], "choose one of resnet18"),
    (["train", "--preset", "demo", "--epochs", "0"], "epochs must be a positive integer"),
    (["train", "--preset", "demo", "--set", "heads=3"], "unknown model option 'heads'"),
    (["evaluate", "/nonexistent/run"], "no checkpoint"),
])
def test_bad_arguments_give_one_clear_line(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_missing_official_data_names_places_and_download_flag(tmp_path, capsys):
    code = main(["train", "--preset", "demo", "--data", "cifar10", "--data-dir", str(tmp_path / "empty"),
                 "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--download" in err and str(tmp_path / "empty") in err
    assert not (tmp_path / "run" / "finished.json").exists()


def test_batch_larger_than_dataset_is_refused(tmp_path, tiny_dataset, capsys):
    assert main(["train", "--preset", "demo", "--data", str(tiny_dataset), "--batch-size", "1000",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "lower --batch-size" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_on_a_subset_of_real_cifar10(tmp_path, cifar10_path, data_cache_dir, capsys):
    """The main job's command end to end on real images: 1 epoch on 1,000 training images, then the
    full 10,000-image test set; accuracy well above chance (10 %)."""
    code = main(["train", "--preset", "demo", "--data", str(cifar10_path), "--data-dir", str(data_cache_dir),
                 "--train-subset", "1000", "--epochs", "2", "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["test_accuracy"] > 0.2
    assert "test accuracy:" in capsys.readouterr().out
