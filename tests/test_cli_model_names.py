"""Commands that read a run take a trained model's name too: ``attncnn inspect quadratic-mini``."""

from __future__ import annotations

import argparse
import importlib
import logging
import shutil
from pathlib import Path

import pytest

from attncnn.cli import main
from attncnn.cli._parsing import run_or_model

RESULTS = Path(__file__).resolve().parents[1] / "results"
SHIPPED = RESULTS / "mini" / "resnet18-mini" / "seed0"
pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="no committed results/mini")


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """A results folder holding one trained resnet18-mini, the only place models are looked for."""
    shutil.copytree(SHIPPED, tmp_path / "results" / "mini" / "resnet18-mini" / "seed0")
    monkeypatch.setenv("ATTNCNN_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def test_a_trained_models_name_means_its_run_folder(results, tmp_path, monkeypatch):
    assert Path(run_or_model("resnet18-mini")) == results / "mini" / "resnet18-mini" / "seed0"
    # a path that exists is the path, even when a preset has its name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "resnet18-mini").mkdir()
    assert run_or_model("resnet18-mini") == "resnet18-mini"
    # neither a path nor a preset: as given, for the command's own message
    assert run_or_model("no-such-thing") == "no-such-thing"


def test_a_folder_here_that_has_a_trained_models_name_wins_and_says_so(results, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "resnet18-mini").mkdir()
    with caplog.at_level(logging.INFO, logger="attncnn"):
        assert run_or_model("resnet18-mini") == "resnet18-mini"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1
    assert said[0].startswith(f"resnet18-mini: using the path {tmp_path / 'resnet18-mini'} here, not the trained "
                              f"model of that name ({results / 'mini' / 'resnet18-mini' / 'seed0'})")
    caplog.clear()
    (tmp_path / "quadratic-mini").mkdir()     # a preset's name, but no trained model of it there: nothing shadowed
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.import_module("attncnn.api.pretrained"), "PACKAGED_MODELS", tmp_path / "none")
    with caplog.at_level(logging.INFO, logger="attncnn"):
        assert run_or_model("quadratic-mini") == "quadratic-mini"
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("name, meant", [("resnet18-mimi", "resnet18-mini"), ("quadratc-mini", "quadratic-mini")])
def test_a_misspelt_model_name_is_answered_with_the_closest(results, capsys, name, meant):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"no run folder or checkpoint at '{name}', and no trained "
                                                         rf"model of that name; did you mean {meant}\b"):
        run_or_model(name)
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", name])
    assert stop.value.code == 2 and f"did you mean {meant}" in capsys.readouterr().err
    # a path, or a name close to none: left to the command's own message
    assert run_or_model("runs/quadratc-mini") == "runs/quadratc-mini"
    assert run_or_model("my-run") == "my-run"


def test_a_preset_without_a_trained_model_says_where_it_looked(results):
    with pytest.raises(argparse.ArgumentTypeError, match="no trained model of that name"):
        run_or_model("learned-content")          # a preset no results folder, cache or package holds


def test_theorem_takes_the_name_of_a_trained_resnet(results, capsys):
    assert main(["theorem", "--conv-from", "resnet18-mini", "--images", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert str(results / "mini" / "resnet18-mini" / "seed0") in out and "random images" in out
