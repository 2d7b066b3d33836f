"""tools/ship.py: a study's folder readied for ``git add``; an unfinished run shipped, then resumed by
``attncnn reproduce`` from a copy (a fresh clone) on "another machine"; a grid's measurement cell too."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
from ship import main as ship
from trim import ABSOLUTE_PATH, trim_run

from attncnn.cli import main
from attncnn.reproduce import get_suite, plan
from attncnn.reproduce.running.measurements import plan_calibration
from attncnn.reproduce.running.runner import TrainOptions, train_jobs
from attncnn.reproduce.studies import EFFICIENCY_SCARCE
from attncnn.runs import RunFolder, load_checkpoint
from attncnn.training import TrainingInterrupted


def _stop_after_first_epoch(model) -> dict:
    os.kill(os.getpid(), signal.SIGINT)                # as Ctrl-C: the epoch's checkpoint is saved, then it stops
    return {}


def _records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _files(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_an_unfinished_run_is_shipped_and_resumes_elsewhere(make_tiny_data, tmp_path, monkeypatch, capsys):
    data = make_tiny_data(40, 10, size=16)
    suite = get_suite("mini-long")
    options = TrainOptions(data=str(data), epochs=2)
    here = tmp_path / "here" / "mini-long"
    job = plan(suite, here, only=("resnet18-mini",), seeds=(0,), epochs=2)[0]
    with pytest.raises(TrainingInterrupted):
        train_jobs([job], options, progress=False, epoch_metrics=_stop_after_first_epoch)
    assert (job.folder / "tb").is_dir() and not (job.folder / "finished.json").exists()
    # while a process trains it (its lock held), the run is not touched
    with RunFolder(job.folder, mode="resume"):
        assert ship([str(here)]) == 2
    assert "in use" in capsys.readouterr().err and (job.folder / "tb").is_dir()
    assert ship([str(here)]) == 0                      # the study from the folder's name; nothing finished to report
    out = capsys.readouterr().out
    assert f"unfinished {job.folder}: ready to commit" in out and "ready for `git add" in out
    assert _files(job.folder) == {"config.json", "metrics.jsonl", "machine.json", "checkpoints/last.safetensors"}
    last = load_checkpoint(job.folder / "checkpoints" / "last.safetensors")
    assert last.optimizer_state and last.metadata["epoch"] == 1
    for path in job.folder.rglob("*"):                 # nothing says where the data set was here
        if path.suffix in (".json", ".jsonl"):
            assert not ABSOLUTE_PATH.findall(path.read_text()), path
    assert not ABSOLUTE_PATH.findall(json.dumps(last.metadata))
    assert ship([str(here)]) == 0                      # shipping again changes nothing
    assert _files(job.folder) == {"config.json", "metrics.jsonl", "machine.json", "checkpoints/last.safetensors"}
    # a fresh clone on another machine: the package's own command continues the run where it stopped
    clone = tmp_path / "clone"
    shutil.copytree(here, clone)
    other = {"cpu": "Other CPU", "torch_threads": 3, "torch": "9.9", "device": "cpu"}
    monkeypatch.setattr("attncnn.perf.plan.machine_info", lambda device: other)         # the plan: machine.json
    args = ["reproduce", "mini-long", "--data", str(data), "--epochs", "2", "--only", "resnet18-mini", "--seeds", "0",
            "--no-progress", "--no-viewer"]
    assert main(args + ["--out", str(clone)]) == 0
    folder = clone / "resnet18-mini" / "seed0"
    records = _records(folder)
    segments = json.loads((folder / "machine.json").read_text())["segments"]
    assert [r["epoch"] for r in records] == [1, 2] and [s["epochs"] for s in segments] == [[1, 1], [2, 2]]
    assert segments[0]["machine"]["cpu"] != "Other CPU" and segments[1]["machine"]["cpu"] == "Other CPU"
    assert f"Other CPU, 3 threads, torch 9.9, {records[1]['precision']} (epoch 2)" in (clone / "report.md").read_text()
    # and it lost nothing: the same numbers as a run never interrupted (same machine, same kernels)
    monkeypatch.undo()
    reference = plan(suite, tmp_path / "reference", only=("resnet18-mini",), seeds=(0,), epochs=2)[0]
    train_jobs([reference], options, progress=False)
    for ours, theirs in zip(records, _records(reference.folder)):
        for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-6), (ours["epoch"], key)


@pytest.mark.slow
def test_shipping_keeps_the_periodic_checkpoints_fig_3_is_drawn_from(make_tiny_data, tmp_path):
    data = make_tiny_data(40, 10, size=16)
    out = tmp_path / "mini"
    jobs = plan(get_suite("mini"), out, only=("quadratic-mini", "resnet18-mini"), seeds=(0,), epochs=3)
    options = TrainOptions(data=str(data), epochs=3, compile=False)
    for job in jobs:                                   # both stop after their first epoch (epoch_0001 written)
        with pytest.raises(TrainingInterrupted):
            train_jobs([job], options, progress=False, epoch_metrics=_stop_after_first_epoch)
    assert ship([str(out), "--no-report"]) == 0
    names = {job.preset: {p.name for p in (job.folder / "checkpoints").iterdir()} for job in jobs}
    assert names["quadratic-mini"] == {"last.safetensors", "epoch_0001.safetensors"}     # Fig. 3's run
    assert names["resnet18-mini"] == {"last.safetensors"}
    kept = load_checkpoint(jobs[0].folder / "checkpoints" / "epoch_0001.safetensors")
    assert kept.optimizer_state is None and kept.metadata["epoch"] == 1                  # weights only


@pytest.mark.slow
def test_a_measurement_cut_off_mid_cell_is_shipped_and_resumes_from_a_copy(make_tiny_data, tmp_path, capsys):
    # a content model's calibration cell outlives a session on two CPU cores: the tool must leave it
    # committable and resumable, as the suites' unfinished runs are
    data = make_tiny_data(40, 10, size=16)
    here = tmp_path / "here" / "efficiency-scarce"
    resnet, deit = plan_calibration(EFFICIENCY_SCARCE, here, passes=1, train_images=120, fraction=0.5)
    options = TrainOptions(data=str(data), device="cpu", batch_size=20)
    with pytest.raises(TrainingInterrupted):
        train_jobs([resnet], options, progress=False, epoch_metrics=_stop_after_first_epoch)
    assert ship([str(here), "--no-report"]) == 0
    assert f"unfinished {resnet.folder}: ready to commit" in capsys.readouterr().out
    assert not deit.folder.exists()                                 # the tool trains nothing
    assert _files(resnet.folder) == {"config.json", "metrics.jsonl", "machine.json", "checkpoints/last.safetensors"}
    assert load_checkpoint(resnet.folder / "checkpoints" / "last.safetensors").optimizer_state
    # a fresh clone: the same measurement command continues the cell, then trains the other row
    clone = tmp_path / "clone" / "efficiency-scarce"
    shutil.copytree(here, clone)
    common = ["reproduce", "efficiency-scarce", "--data", str(data), "--train-images", "120", "--passes", "1",
              "--batch-size", "20", "--fractions", "0.5", "--no-progress", "--device", "cpu", "--calibrate"]
    assert main([*common, "--out", str(clone)]) == 0
    cell = clone / resnet.folder.relative_to(here)
    assert [r["epoch"] for r in _records(cell)] == [1, 2]
    assert (clone / deit.folder.relative_to(here) / "finished.json").is_file()
    # finished cells are trimmed as a grid's are (lean: last alone, weights only), nothing is left to ship
    (cell / "held_out.json").write_text("{}")              # a sweep's measurement, made once: kept
    capsys.readouterr()
    assert ship([str(clone), "--no-report"]) == 0
    assert "ready to commit" not in capsys.readouterr().out
    assert _files(cell) == {"config.json", "metrics.jsonl", "machine.json", "finished.json", "held_out.json",
                            "checkpoints/last.safetensors"}
    assert load_checkpoint(cell / "checkpoints" / "last.safetensors").optimizer_state is None


def test_what_the_tool_cannot_do_is_refused_in_one_line(tmp_path, capsys):
    assert ship([str(tmp_path)]) == 2
    assert "is no study's folder by its name; give --study (efficiency" in capsys.readouterr().err
    assert ship([str(tmp_path / "mini")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "mini").mkdir()
    assert ship([str(tmp_path / "mini"), "--weights-to", str(tmp_path / "w")]) == 2
    assert "--weights-to is where --without-weights moves the weights" in capsys.readouterr().err
    assert ship([str(tmp_path / "mini"), "--without-weights", "quadratic"]) == 2
    assert "--without-weights takes presets of mini (quadratic-mini, " in capsys.readouterr().err
    with pytest.raises(ValueError, match="not finished; only finished runs are trimmed"):
        (tmp_path / "mini" / "config.json").write_text("{}")
        trim_run(tmp_path / "mini", keep_epochs=False)
