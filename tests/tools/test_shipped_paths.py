"""Shipped run folders say nothing about the machine that trained them and work on any other:
no absolute path in any file under results/, the data set named by its file name and pixel digest,
and the ship tool's step (tools/trim.py, share_run_folder) that makes a fresh run folder so."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from trim import share_run_folder, share_run_folders

from attncnn.cli import main
from attncnn.runs import load_checkpoint
from attncnn.runs.checkpoint import _read_header

RESULTS = Path(__file__).resolve().parents[2] / "results"
# written here on its own (not imported from trim.py): a slash-rooted path with at least one folder,
# where a file would record one (after a quote, a space, "=", "(")
ABSOLUTE = re.compile(r"""(?:^|(?<=[\s"'`(=,\[]))/(?:[\w.+-]+/)+[\w.+-]*""", re.M)
BASE64_RUN = re.compile(r"[A-Za-z0-9+/=]{200,}")          # the viewer page's embedded blobs
DATASET_NAME = re.compile(r"^[^/\\\s]+ \(sha256:[0-9a-f]{12}\)$")


def _text(path: Path) -> str:
    """What a file records: a checkpoint's header metadata, any other file's text."""
    if path.suffix == ".safetensors":
        return json.dumps(_read_header(path)[0].get("__metadata__"))
    return BASE64_RUN.sub("", path.read_text(errors="replace"))


def _shipped_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p.suffix != ".png")


def test_the_checker_finds_absolute_paths():
    assert ABSOLUTE.findall('"data": "/work/shared/data/cifar10-jpeg.zip"') == ["/work/shared/data/cifar10-jpeg.zip"]
    assert ABSOLUTE.findall("image zip /home/me/x.zip (CIFAR-10 JPEG mirror)") == ["/home/me/x.zip"]
    assert not ABSOLUTE.findall("see https://example.org/a/b, results/mini/x, <model>/10pct/seed0, 1/2/3")


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no committed results/")
def test_no_file_under_results_records_an_absolute_path():
    files = _shipped_files()
    assert len(files) > 100                                     # the checkpoints' metadata included
    found = {str(p.relative_to(RESULTS)): ABSOLUTE.findall(_text(p))[:2] for p in files}
    assert not {k: v for k, v in found.items() if v}


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no committed results/")
def test_shipped_runs_name_their_data_set_and_its_digest_not_a_path():
    configs = sorted(RESULTS.rglob("config.json"))
    assert len(configs) > 30
    for config in configs:
        stored = json.loads(config.read_text())
        assert "/" not in stored["data"] and stored.get("data_dir") is None, config   # a recipe holds none
        for checkpoint in (config.parent / "checkpoints").glob("*.safetensors"):
            meta = json.loads(_read_header(checkpoint)[0]["__metadata__"]["attncnn"])
            assert meta["config"]["data"] == stored["data"] and meta["config"].get("data_dir") is None, checkpoint
            assert DATASET_NAME.match(meta["dataset_name"]) and "/" not in meta["dataset"], checkpoint


def test_sharing_a_fresh_run_keeps_its_weights_and_evaluate_asks_for_its_data_set(make_tiny_data, tmp_path, capsys):
    # an absolute path, as a user might type it, in a folder that is not above the run (a command looks for a
    # shared run's bare file name there, and the session's tiny data sets sit above every test's folder)
    data = tmp_path / "elsewhere" / "shared-tiny"
    shutil.copytree(make_tiny_data(20, 6), data)
    run = tmp_path / "run"
    assert main(["train", "--preset", "demo", "--data", str(data), "--epochs", "1", "--batch-size", "10",
                 "--set", "dim=16", "--set", "mlp_dim=16", "--out", str(run), "--no-progress"]) == 0
    before = {p.name: load_checkpoint(p).model_state for p in (run / "checkpoints").glob("*.safetensors")}
    assert ABSOLUTE.findall(_text(run / "config.json"))         # the trainer records where its data was
    changed = share_run_folder(run)
    assert {p.name for p in changed} >= {"config.json", "finished.json", "last.safetensors"}
    assert not any(ABSOLUTE.findall(_text(p)) for p in run.rglob("*") if p.is_file() and p.suffix != "")
    for path in (run / "checkpoints").glob("*.safetensors"):
        after = load_checkpoint(path)                           # digest verified: the same tensors
        assert all(after.model_state[k].equal(v) for k, v in before[path.name].items())
        assert after.metadata["config"]["data"] == data.name and data.name in after.metadata["dataset"]
    assert share_run_folder(run) == [] and share_run_folders(tmp_path) == []    # nothing left to change
    capsys.readouterr()
    # without --data: the run's data set is not "here" under its bare name, and no other one is used
    assert main(["evaluate", str(run), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"was trained on {data.name}, which is not here" in err
    assert f"pass --data with the path of {data.name} on this machine" in err
    assert "CIFAR-10" not in err
    assert main(["evaluate", str(run), "--data", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 18


def test_an_unfinished_run_is_not_shared(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"preset": "demo", "data": "/somewhere/data.zip"}))
    with pytest.raises(ValueError, match="not a finished run folder"):
        share_run_folder(tmp_path)
    assert share_run_folders(tmp_path) == []                    # skipped, untouched
    assert "/somewhere" in (tmp_path / "config.json").read_text()
