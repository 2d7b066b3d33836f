"""A new run into a folder that is not empty is refused before anything is loaded: a repeated
``attncnn train --preset demo`` used to decode the whole data set first."""

from __future__ import annotations

import pytest

from attncnn.cli import main
from attncnn.perf import make_plan
from attncnn.runs import RunFolderError, resolve_config
from attncnn.training import RunOptions, train


@pytest.fixture
def used(tmp_path, monkeypatch):
    """A run folder that holds a run, and no data loading allowed."""
    folder = tmp_path / "runs" / "demo"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.setattr("attncnn.training.loop.make_loaders", lambda *a, **k: pytest.fail("the data was loaded"))
    monkeypatch.setattr("attncnn.data.load_dataset", lambda *a, **k: pytest.fail("the data was loaded"))
    return folder


def test_the_command_refuses_a_used_folder_before_loading_data(used, capsys):
    assert main(["train", "--preset", "demo", "--data", "cifar10", "--out", str(used), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"run folder {used} already exists and is not empty; use --resume to continue it" in err


def test_train_refuses_a_used_folder_before_loading_data(used):
    config = resolve_config("demo", data="cifar10")
    with pytest.raises(RunFolderError, match="already exists and is not empty"):
        train(config, used, make_plan(config, RunOptions(device="cpu", precision="fp32")), mode="new")
    with pytest.raises(RunFolderError, match="exists but is not a folder"):
        train(config, used / "config.json", make_plan(config, RunOptions(device="cpu", precision="fp32")), mode="new")
