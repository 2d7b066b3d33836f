"""A run's data set is found again from any folder, or the command stops and asks for --data: it is
never replaced by another data set (attncnn._recorded_data, attncnn.data.run_data)."""

from __future__ import annotations

import json
import os

import pytest

from attncnn.cli import main
from attncnn.data import DataError, run_data
from attncnn._recorded_data import locate_recorded_data
from attncnn.runs import point_at_data, resolve_config
from attncnn.runs.data_location import pointed_config


def _here(stored, folder=None):
    """Whether a run's recorded data set is on this machine, found as every command finds it."""
    return locate_recorded_data(stored, folder) is not None


TRAIN = ["--preset", "demo", "--epochs", "1", "--batch-size", "10", "--set", "dim=16", "--set", "mlp_dim=16",
         "--device", "cpu", "--no-progress"]


def _file(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_new_run_records_its_data_path_absolute(tmp_path, monkeypatch):
    _file(tmp_path / "shared" / "set.zip")
    monkeypatch.chdir(tmp_path / "shared")
    config = resolve_config("demo", data="../shared/set.zip")
    assert config.data == str((tmp_path / "shared" / "set.zip").resolve())
    assert resolve_config("demo", data="CIFAR10").data == "CIFAR10"                  # a name stays a name
    assert resolve_config("demo", data="gone/set.zip").data == "gone/set.zip"        # the loader names it


def test_a_run_trained_with_a_relative_path_is_evaluated_from_another_folder(make_tiny_data, tmp_path, monkeypatch,
                                                                             capsys):
    data = make_tiny_data(20, 6)
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    relative = os.path.relpath(data, tmp_path / "work")               # as typed in tmp_path/work
    assert relative.startswith("..")
    assert main(["train", *TRAIN, "--data", relative, "--data-dir", str(tmp_path / "cache"), "--out", "run"]) == 0
    assert json.loads((tmp_path / "work" / "run" / "config.json").read_text())["data"] == str(data.resolve())
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "work" / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["examples"] == 18 and str(data.resolve()) in out["dataset"]


def test_a_data_set_that_is_not_here_stops_the_command_and_is_never_replaced(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    run = _file(tmp_path / "run" / "config.json").parent
    for stored in ("cifar10-jpeg.zip", "../shared/data/cifar10-jpeg.zip", str(tmp_path / "gone" / "cifar10-jpeg.zip")):
        for where in ({}, {"run": run}):
            with pytest.raises(DataError) as err:
                run_data(stored, **where)
            message = str(err.value)
            assert f"was trained on {stored}, which is not here" in message and "\n" not in message
            assert "pass --data with the path of cifar10-jpeg.zip on this machine" in message
    assert "using cifar10" not in caplog.text
    assert run_data("cifar10-jpeg.zip", "elsewhere/cifar10-jpeg.zip") == "elsewhere/cifar10-jpeg.zip"    # --data wins
    assert run_data(" CIFAR100 ") == " CIFAR100 " and run_data(None) == "cifar10"     # names need no file


def test_an_old_relative_path_is_found_from_the_run_folder_and_the_folders_above_it(tmp_path, monkeypatch):
    # trained in tmp_path/project with --data ../shared/set.zip --out runs/demo, evaluated from tmp_path/else/where
    data = _file(tmp_path / "shared" / "set.zip")
    run = _file(tmp_path / "project" / "runs" / "demo" / "config.json").parent
    _file(tmp_path / "else" / "where" / "x")
    monkeypatch.chdir(tmp_path / "else" / "where")
    assert run_data("../shared/set.zip", run=run) == str(data.resolve())
    assert run_data("../shared/set.zip", run=run / "checkpoints" / "last.safetensors") == str(data.resolve())
    assert _here("../shared/set.zip", run) and not _here("../shared/set.zip")
    with pytest.raises(DataError, match="which is not here"):
        run_data("../shared/set.zip")                                  # without the run: the current folder only
    # a resume records the file found, so that training opens that file from any folder
    config = {"preset": "demo", "data": "../shared/set.zip", "data_dir": None}
    assert pointed_config(config, str(data), folder=run) == {**config, "data": str(data.resolve())}


def test_a_relative_path_that_fits_two_files_is_refused_naming_both(tmp_path, monkeypatch):
    first = _file(tmp_path / "a" / "data" / "set.zip", "one")
    run = _file(tmp_path / "a" / "runs" / "demo" / "config.json").parent
    second = _file(tmp_path / "b" / "data" / "set.zip", "two")
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(DataError) as err:
        run_data("data/set.zip", run=run)
    assert str(second) in str(err.value) and str(first) in str(err.value) and "pass --data" in str(err.value)
    with pytest.raises(ValueError, match="both"):
        _here("data/set.zip", run)
    monkeypatch.chdir(tmp_path / "a")                                  # the same file both ways: no doubt
    assert run_data("data/set.zip", run=run) == str(first.resolve())


def test_a_resume_without_data_records_the_file_found_or_asks_for_data(tmp_path, monkeypatch):
    data = _file(tmp_path / "shared" / "set.zip")
    run = _file(tmp_path / "project" / "runs" / "demo" / "config.json",
                json.dumps({"preset": "demo", "data": "../shared/set.zip", "data_dir": None})).parent
    _file(tmp_path / "else" / "where" / "x")
    monkeypatch.chdir(tmp_path / "else" / "where")
    assert point_at_data(run) is True                                   # the same file, from any folder now
    assert json.loads((run / "config.json").read_text())["data"] == str(data.resolve())
    assert point_at_data(run) is False
    (run / "config.json").write_text(json.dumps({"preset": "demo", "data": "cifar10-jpeg.zip"}))
    before = (run / "config.json").read_bytes()
    with pytest.raises(ValueError, match=r"was trained on cifar10-jpeg.zip, which is not here .*; pass --data with "
                                         "the path of cifar10-jpeg.zip on this machine$"):
        point_at_data(run)
    assert (run / "config.json").read_bytes() == before                 # a refusal writes nothing
