"""One rule for which checkpoint of a run folder every reader takes: ``last``, the final weights
whose epoch the reports quote; ``best`` only when asked for by name or by its file. Each command
says which file (and epoch) it read."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import attncnn
from attncnn.analysis.runs import open_run
from attncnn.cli import main
from attncnn.perf import make_plan
from attncnn.runs import load_model, resolve_config
from attncnn.runs.loading import DEFAULT_CHECKPOINT, checkpoint_of
from attncnn.training import RunOptions, train


@pytest.fixture(scope="module")
def run(make_tiny_data, tmp_path_factory):
    """A finished 2-epoch demo run (width 16) whose ``best`` is epoch 1 and ``last`` epoch 2, as
    when a run's test accuracy peaks before its end."""
    root = tmp_path_factory.mktemp("rule")
    config = resolve_config("demo", data=str(make_tiny_data(10, 4)), epochs=2, batch_size=10,
                            model={"dim": 16, "mlp_dim": 16})
    out = root / "run"
    train(config, out, make_plan(config, RunOptions(data_dir=str(root / "cache"), device="cpu")), progress=False)
    checkpoints = out / "checkpoints"
    shutil.copyfile(checkpoints / "epoch_0001.safetensors", checkpoints / "best.safetensors")
    return out


def _epoch(path):
    return load_model(path)[1]["epoch"]


def test_the_fixture_has_best_and_last_at_different_epochs(run):
    assert _epoch(run / "checkpoints" / "best.safetensors") == 1
    assert _epoch(run / "checkpoints" / "last.safetensors") == 2


def test_a_run_folder_means_its_last_checkpoint(run, caplog):
    assert DEFAULT_CHECKPOINT == "last"
    assert checkpoint_of(run) == run / "checkpoints" / "last.safetensors"
    with caplog.at_level(logging.INFO, logger="attncnn.runs.loading"):
        _, meta = load_model(run)
    assert meta["epoch"] == 2
    assert f"run folder {run}: using {run / 'checkpoints' / 'last.safetensors'} (epoch 2)" in caplog.text
    assert attncnn.load_model(run).source == run / "checkpoints" / "last.safetensors"
    assert open_run(run).checkpoint == run / "checkpoints" / "last.safetensors"
    assert open_run(run).metadata["epoch"] == 2


def test_best_is_read_when_asked_for(run):
    assert checkpoint_of(run, "best") == run / "checkpoints" / "best.safetensors"
    assert load_model(run, checkpoint="best")[1]["epoch"] == 1
    model = attncnn.load_model(run, checkpoint="best")
    assert model.source == run / "checkpoints" / "best.safetensors" and model.metadata["epoch"] == 1
    assert load_model(run, checkpoint="epoch_0001")[1]["epoch"] == 1


def test_a_missing_checkpoint_is_refused_with_those_the_folder_holds(run, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no 'epoch_0009' checkpoint; it holds best, epoch_0001, "
                                                r"epoch_0002, last: name one"):
        checkpoint_of(run, "epoch_0009")
    with pytest.raises(ValueError, match="is a checkpoint file.*give the run folder, or the file alone"):
        checkpoint_of(run / "checkpoints" / "last.safetensors", "best")


def test_evaluate_reads_last_and_says_so(run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["checkpoint"], out["epoch"]) == (str(run / "checkpoints" / "last.safetensors"), 2)
    # the number it prints is the one metrics.jsonl records for that epoch (what reports quote)
    last_line = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert out["test_accuracy"] == pytest.approx(last_line["test_accuracy"], abs=1e-6)
    assert main(["evaluate", str(run)]) == 0
    text = capsys.readouterr().out
    assert "epoch 2" in text and f"checkpoint: {run / 'checkpoints' / 'last.safetensors'}" in text


def test_evaluate_reads_best_when_asked_for(run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run), "--checkpoint", "best", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["checkpoint"], out["epoch"]) == (str(run / "checkpoints" / "best.safetensors"), 1)
    assert main(["evaluate", str(run / "checkpoints" / "best.safetensors"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epoch"] == 1
    assert main(["evaluate", str(run), "--checkpoint", "nope"]) == 2
    assert "holds no 'nope' checkpoint; it holds best" in capsys.readouterr().err


def test_inspect_and_prune_read_last_and_say_so(run, capsys):
    last = str(run / "checkpoints" / "last.safetensors")
    capsys.readouterr()
    assert main(["inspect", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["checkpoint"], out["epoch"]) == (last, 2)
    assert main(["inspect", str(run)]) == 0
    assert f"checkpoint: {last}" in capsys.readouterr().out
    assert main(["prune", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["source_checkpoint"], out["epoch"]) == (last, 2)
    assert main(["prune", str(run)]) == 0
    assert f"checkpoint: {last}" in capsys.readouterr().out
