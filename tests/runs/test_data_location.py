"""Pointing a run folder that travelled at this machine's copy of its data set, and the wait of the
other ranks under torchrun for rank 0 to have done it."""

from __future__ import annotations

import json
import threading
import time

import pytest

from attncnn.runs import (DATA_NAMES, RunFolderError, await_pointed, is_data_name, point_at_data,
                          same_data_file)
from attncnn._recorded_data import locate_recorded_data
from attncnn.runs.data_location import pointed_config


def _here(stored, folder=None):
    """Whether a run's recorded data set is on this machine, found as every command finds it."""
    return locate_recorded_data(stored, folder) is not None


def _shipped(tmp_path, data="cifar10-jpeg.zip", data_dir=None):
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"preset": "quadratic-mini", "data": data, "data_dir": data_dir}))
    return folder


def _elsewhere(tmp_path, name="cifar10-jpeg.zip"):
    """A data file in a folder of its own: not beside the run folder or above it, where a shipped run's
    bare file name would find it."""
    data = tmp_path / "data" / name
    data.parent.mkdir(exist_ok=True)
    data.write_bytes(b"")
    return data


def _config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_another_copy_named_for_a_run_whose_data_set_is_here_is_said_to_be_unused(tmp_path, caplog):
    data = tmp_path / "set.zip"
    data.write_bytes(b"")
    folder = _shipped(tmp_path, str(data))
    with caplog.at_level("WARNING", logger="attncnn.runs"):
        assert point_at_data(folder, str(data)) is False                       # the same file: nothing to say
        assert not caplog.records
        assert point_at_data(folder, str(tmp_path / "copy" / "set.zip")) is False
    assert _config(folder)["data"] == str(data)
    assert f"its data set {data} is still here, and the run keeps it; --data {tmp_path / 'copy' / 'set.zip'} is " \
           "not used" in caplog.text


def test_a_shipped_run_is_pointed_at_the_data_set_here(tmp_path, monkeypatch):
    folder = _shipped(tmp_path)
    data = _elsewhere(tmp_path)
    monkeypatch.chdir(folder)
    with pytest.raises(ValueError, match="trained on cifar10-jpeg.zip, which is not here; pass --data"):
        point_at_data(folder, "cifar10")
    assert _config(folder)["data"] == "cifar10-jpeg.zip"                      # a refusal writes nothing
    assert point_at_data(folder, str(data)) is True
    assert _config(folder) == {"preset": "quadratic-mini", "data": str(data.resolve()), "data_dir": None}
    assert point_at_data(folder, "elsewhere/cifar10-jpeg.zip") is False        # its data set is here now
    _shipped(tmp_path, "cifar10")
    assert point_at_data(folder, "cifar10") is False     # a built-in name: the cache folder is a run-time option


def test_whether_a_data_set_is_here(tmp_path):
    assert _here("cifar10") and _here(" CIFAR100 ")
    assert not _here(str(tmp_path / "cifar10-jpeg.zip"))
    (tmp_path / "cifar10-jpeg.zip").write_bytes(b"")
    assert _here(str(tmp_path / "cifar10-jpeg.zip"))


def test_pointed_config_changes_only_where_the_data_set_is():
    config = {"preset": "demo", "data": "gone/set.zip", "data_dir": None, "epochs": 3}
    assert pointed_config(config, "here/set.zip") == {**config, "data": "here/set.zip"}   # only "data" changes
    assert config["data"] == "gone/set.zip"                                    # the argument is not changed
    assert pointed_config({"preset": "demo"}, "here/set.zip") is None          # records no data set
    with pytest.raises(ValueError, match="trained on set.zip"):
        pointed_config(config, "here/other.zip")


def test_another_rank_waits_until_rank_0_has_pointed_the_run(tmp_path):
    folder = _shipped(tmp_path)
    data = _elsewhere(tmp_path)
    rank0 = threading.Timer(0.5, point_at_data, (folder, str(data)))
    started = time.monotonic()
    rank0.start()
    await_pointed(folder, str(data), timeout=30)
    rank0.join()
    assert time.monotonic() - started >= 0.5                                   # it did wait for rank 0
    assert _config(folder)["data"] == str(data.resolve())
    started = time.monotonic()
    await_pointed(folder, str(data), timeout=30)                               # nothing to wait for
    assert time.monotonic() - started < 0.5


def test_another_rank_stops_when_rank_0_never_points_the_run(tmp_path):
    folder = _shipped(tmp_path)
    data = _elsewhere(tmp_path)
    with pytest.raises(RunFolderError, match="rank 0 did not record where the run's data set is .* within 0.3 s"):
        await_pointed(folder, str(data), timeout=0.3, poll=0.05)
    with pytest.raises(ValueError, match="trained on cifar10-jpeg.zip"):        # refused as rank 0 refuses it
        await_pointed(folder, str(tmp_path / "other.zip"), timeout=0.3)


def test_a_data_file_is_known_by_its_exact_name():
    assert same_data_file("/gone/cifar10-jpeg.zip", "here/cifar10-jpeg.zip")
    assert not same_data_file("/gone/cifar10-jpeg.zip", "here/CIFAR10-JPEG.zip")     # another case: another file
    assert same_data_file("cifar10", " CIFAR10 ") and not same_data_file("cifar10", "cifar100")   # names: any case
    assert not same_data_file("cifar10", "here/cifar10")                                  # a folder named so
    with pytest.raises(ValueError, match="trained on set.zip"):
        pointed_config({"data": "gone/set.zip"}, "here/SET.zip")


def test_every_name_a_run_may_record_is_a_data_set_the_loader_knows():
    from attncnn.data import peek_dataset
    # DATA_NAMES (attncnn._recorded_data) is the one list, which runs and data both import; the
    # loader's archives are described apart (attncnn.data.cifar.VARIANTS)
    assert [peek_dataset(f" {name.upper()} ").name for name in DATA_NAMES] == list(DATA_NAMES)
    assert all(is_data_name(f" {name.upper()} ") and not is_data_name(f"{name}.zip") for name in DATA_NAMES)
