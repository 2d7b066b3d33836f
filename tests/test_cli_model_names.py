"""Commands that read a run take a trained model's name too: ``attncnn inspect quadratic-mini``."""

from __future__ import annotations

import argparse
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


def test_a_preset_without_a_trained_model_says_where_it_looked(results):
    with pytest.raises(argparse.ArgumentTypeError, match="no trained model of that name"):
        run_or_model("learned-content")          # a preset no results folder, cache or package holds


def test_theorem_takes_the_name_of_a_trained_resnet(results, capsys):
    assert main(["theorem", "--conv-from", "resnet18-mini", "--images", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert str(results / "mini" / "resnet18-mini" / "seed0") in out and "random images" in out
