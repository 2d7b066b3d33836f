"""``attncnn reproduce efficiency-scarce`` end to end on a tiny data set: the calibration, the
learning-rate sweep and the grid (every row, a variant's options in its config.json), then the
report with ConViT's three claims and the gap of every scarce cell."""

from __future__ import annotations

import json
import os
import shutil
import signal
from unittest.mock import ANY

import pytest

from attncnn.cli import main
from attncnn.reproduce.running.jobs import plan_grid
from attncnn.reproduce.running.measurements import plan_calibration
from attncnn.reproduce.running.runner import TrainOptions, train_jobs
from attncnn.reproduce.running.ship import ABSOLUTE_PATH
from attncnn.reproduce.studies import EFFICIENCY_SCARCE
from attncnn.runs import load_checkpoint
from attncnn.training import TrainingInterrupted

pytestmark = pytest.mark.slow        # 18 tiny runs of 2-4 epochs of 60-120 images (about 30 s on 2 idle cores)

# cells of 50 % and 100 % of 120 images for one pass (2 and 1 epochs): the grid's 10 % cell would be
# 10 epochs, and its second seed, which the fast tests plan, would double it
SMOKE = ["--train-images", "120", "--passes", "1", "--batch-size", "20", "--fractions", "0.5,1", "--no-progress",
         "--device", "cpu"]


@pytest.fixture(scope="module")
def scarce(make_tiny_data, tmp_path_factory):
    data = make_tiny_data(40, 10, size=16)             # 3 classes: 120 train, 30 test images of 16x16
    out = tmp_path_factory.mktemp("scarce") / "efficiency-scarce"
    # --no-compile: on a fresh machine the compile choice would compile each preset (tens of seconds on 2 cores)
    # to time runs of seconds; the choice has its own tests (tests/perf/test_compiling.py)
    common = ["reproduce", "efficiency-scarce", "--data", str(data), "--out", str(out), *SMOKE, "--no-compile"]
    assert main([*common, "--calibrate"]) == 0
    assert main([*common, "--lr-sweep", "5e-4,1e-3"]) == 0
    assert main([*common, "--trim"]) == 0
    return out, json.loads((out / "report.json").read_text())


def test_calibration_and_sweep_print_their_measurements(scarce, capsys, make_tiny_data):
    out, _ = scarce
    assert (out / "calibrate" / "passes1" / "deit-mini" / "50pct" / "seed0" / "finished.json").is_file()
    sweep = json.loads((out / "lr-sweep" / "report.json").read_text())
    assert [entry["lr"] for entry in sweep["rates"]] == [5e-4, 1e-3]
    assert all(entry["held_out_mean"] is not None and entry["test_mean"] is not None for entry in sweep["rates"])
    assert sweep["best"] == max(sweep["rates"], key=lambda entry: entry["held_out_mean"])["lr"]
    report = (out / "lr-sweep" / "report.md").read_text()
    assert "Held-out accuracy (%) at the last epoch, which chooses the rate" in report
    # a command naming one rate (one process per rate) reports every rate swept under --out; one
    # not trained yet keeps the best "so far"
    data = make_tiny_data(40, 10, size=16)
    common = ["reproduce", "efficiency-scarce", "--data", str(data), "--out", str(out), *SMOKE]
    assert main([*common, "--lr-sweep", "1e-3", "--report-only"]) == 0
    assert json.loads((out / "lr-sweep" / "report.json").read_text()) == {**sweep, "command": ANY}
    assert main([*common, "--lr-sweep", "2e-3", "--report-only"]) == 0
    partial = json.loads((out / "lr-sweep" / "report.json").read_text())
    assert [entry["lr"] for entry in partial["rates"]] == [5e-4, 1e-3, 2e-3] and partial["best"] == sweep["best"]
    assert "so far" in (out / "lr-sweep" / "report.md").read_text()
    assert main([*common, "--lr-sweep", "5e-4,1e-3", "--report-only"]) == 0      # as before, for the tests below
    # a finished measurement runs again at once: nothing to train, the same lines
    capsys.readouterr()
    assert main(["reproduce", "efficiency-scarce", "--data", str(data), "--out", str(out), *SMOKE, "--calibrate"]) == 0
    printed = capsys.readouterr().out
    assert "resnet18-mini 50 % seed 0: train" in printed and "(criterion >= 15:" in printed


def test_every_row_trains_and_the_report_judges_the_claims(scarce):
    out, report = scarce
    assert [row["preset"] for row in report["rows"]] == list(EFFICIENCY_SCARCE.presets)
    assert report["missing"] == []
    config = json.loads((out / "convit-mini-random" / "50pct" / "seed0" / "config.json").read_text())
    # the variant's option, beside the attention path the run measured (impl): `attncnn train --preset
    # convit-mini --set init=random` trains the same row
    assert (config["preset"], config["model"]["init"], config["optimizer"], config["lr"]) == (
        "convit-mini", "random", "adamw", EFFICIENCY_SCARCE.lr)
    claims = {c["claim"][:3]: c for c in report["claims"]}
    assert set(claims) == {"pre", "(a)", "(b)", "(c)"}
    assert all(c["verdict"] in ("holds", "fails") for c in claims.values())      # every cell is in
    assert "convit-mini-random 50 %: L1 " in claims["(c)"]["values"]
    md = (out / "report.md").read_text()
    assert "## Train - test gap of the 50 % cells" in md and md.count("| deit-mini 50 % seed") == 1
    assert "`convit-mini-random`: `convit-mini` with `--set init=random`" in md
    assert (out / "figures" / "efficiency-gates.png").is_file()


def _stop_after_first_epoch(model) -> dict:
    os.kill(os.getpid(), signal.SIGINT)                # as Ctrl-C: the epoch's checkpoint is saved, then it stops
    return {}


def test_a_measurement_cut_off_mid_cell_is_shipped_and_resumes_from_a_copy(make_tiny_data, tmp_path, capsys):
    # a content model's calibration cell outlives a session on two CPU cores: --ship must leave it
    # committable and resumable, as the suites' unfinished runs are
    data = make_tiny_data(40, 10, size=16)
    here = tmp_path / "here" / "efficiency-scarce"
    resnet, deit = plan_calibration(EFFICIENCY_SCARCE, here, passes=1, train_images=120, fraction=0.5)
    options = TrainOptions(data=str(data), device="cpu", batch_size=20)
    with pytest.raises(TrainingInterrupted):
        train_jobs([resnet], options, progress=False, epoch_metrics=_stop_after_first_epoch)
    assert (resnet.folder / "tb").is_dir() and not (resnet.folder / "finished.json").exists()
    common = ["reproduce", "efficiency-scarce", "--data", str(data), *SMOKE, "--calibrate"]
    assert main([*common, "--out", str(here), "--ship"]) == 0
    printed = capsys.readouterr().out
    assert f"unfinished resnet18-mini 50 % seed 0: {resnet.folder} ready to commit" in printed
    assert "resnet18-mini 50 % seed 0: not finished yet" in printed
    assert not deit.folder.exists()                                 # --ship trains nothing
    kept = {p.relative_to(resnet.folder).as_posix() for p in resnet.folder.rglob("*") if p.is_file()}
    assert kept == {"config.json", "metrics.jsonl", "machine.json", "checkpoints/last.safetensors"}
    last = load_checkpoint(resnet.folder / "checkpoints" / "last.safetensors")
    assert last.optimizer_state and last.metadata["epoch"] == 1
    for path in resnet.folder.rglob("*.json*"):       # nothing says where the data set was here
        assert not ABSOLUTE_PATH.findall(path.read_text()), path
    # a fresh clone: the same command without --ship continues the cell, then trains the other row
    clone = tmp_path / "clone" / "efficiency-scarce"
    shutil.copytree(here, clone)
    assert main([*common, "--out", str(clone)]) == 0
    records = [json.loads(line) for line in
               (clone / resnet.folder.relative_to(here) / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert (clone / deit.folder.relative_to(here) / "finished.json").is_file()
    # finished cells are trimmed by --ship as the grid trims them, and nothing is left to ship
    assert main([*common, "--out", str(clone), "--ship"]) == 0
    assert "ready to commit" not in capsys.readouterr().out
    assert not (clone / resnet.folder.relative_to(here) / "tb").exists()


def test_a_grid_cell_cut_off_is_shipped(make_tiny_data, tmp_path, capsys):
    data = make_tiny_data(40, 10, size=16)
    out = tmp_path / "efficiency-scarce"
    common = ["reproduce", "efficiency-scarce", "--data", str(data), "--out", str(out), *SMOKE, "--passes", "2"]
    assert main([*common, "--only", "resnet18-mini", "--seeds", "0", "--fractions", "0.5"]) == 0
    job = plan_grid(EFFICIENCY_SCARCE, out, seeds=(0,), only=("resnet18-mini",), train_images=120, passes=2,
                    fractions=(1.0,))[0]                # 2 epochs, stopped after the first
    with pytest.raises(TrainingInterrupted):
        train_jobs([job], TrainOptions(data=str(data), device="cpu", batch_size=20), progress=False,
                   epoch_metrics=_stop_after_first_epoch)
    capsys.readouterr()
    assert main([*common, "--ship"]) == 0
    assert f"unfinished resnet18-mini 100 % seed 0: {job.folder} ready to commit" in capsys.readouterr().out
    assert (out / "report.md").is_file()               # the finished cell is reported
    assert {p.name for p in job.folder.iterdir()} == {"config.json", "metrics.jsonl", "machine.json", "checkpoints"}
    assert load_checkpoint(job.folder / "checkpoints" / "last.safetensors").optimizer_state
    assert main([*common, "--ship", "--dry-run"]) != 0
    assert "--ship trains nothing and writes the folder for committing; leave out --dry-run" in capsys.readouterr().err


def test_the_sweep_validates_on_training_images_outside_the_cell(scarce, make_tiny_data, capsys):
    from attncnn.data import DeviceLoader, ImageSplit, held_out_indices, load_dataset
    from attncnn.reproduce.running.held_out import HELD_OUT_FILE, held_out_result
    from attncnn.runs import load_model
    from attncnn.training import evaluate

    out, _ = scarce
    run = out / "lr-sweep" / "deit-mini" / "lr0.001" / "50pct" / "seed0"
    stored = json.loads((run / HELD_OUT_FILE).read_text())
    sweep = json.loads((out / "lr-sweep" / "report.json").read_text())
    assert sweep["rates"][1]["held_out"]["deit-mini"] == stored["accuracy"]
    # the 60 training images the 50 % cell left out, evaluated by hand, give the stored result
    dataset = load_dataset(str(make_tiny_data(40, 10, size=16)))
    idx = held_out_indices(dataset.train.labels, 60, 0, 10_000)
    model, _ = load_model(run / "checkpoints" / "last.safetensors")
    mine = evaluate(model, DeviceLoader(ImageSplit(dataset.train.images[idx], dataset.train.labels[idx]),
                                        batch_size=500, train=False), precision=stored["precision"])
    assert (stored["examples"], stored["train_subset"], stored["epoch"]) == (60, 60, 2)
    assert stored["accuracy"] == mine.accuracy and stored["loss"] == pytest.approx(mine.loss, rel=1e-6)
    # --ship trims the finished runs but keeps the cache, so the report is rewritten without the data
    # set (the default, cifar10, is not here)
    capsys.readouterr()
    assert main(["reproduce", "efficiency-scarce", "--out", str(out), *SMOKE, "--lr-sweep", "5e-4,1e-3",
                 "--ship"]) == 0
    assert "(highest held-out mean): " in capsys.readouterr().out
    assert json.loads((run / HELD_OUT_FILE).read_text()) == stored
    # another data set would hold other images: refused, not measured
    (run / HELD_OUT_FILE).unlink()
    with pytest.raises(ValueError, match="give --data the run's data set"):
        held_out_result(run, load_dataset(str(make_tiny_data(41, 10, size=16))))
    with pytest.raises(ValueError, match="give --data"):
        held_out_result(run, None)
    assert held_out_result(run, dataset) == stored


def test_only_trains_some_rows_of_a_measurement_and_its_result_covers_all(make_tiny_data, tmp_path, capsys):
    # one process per model, e.g. side by side on a GPU
    out = tmp_path / "efficiency-scarce"
    data = make_tiny_data(40, 10, size=16)
    common = ["reproduce", "efficiency-scarce", "--data", str(data), "--out", str(out), *SMOKE, "--lr-sweep", "1e-3"]
    assert main([*common, "--only", "resnet18-mini"]) == 2
    assert "--only resnet18-mini: not measured by --lr-sweep, which trains convit-mini, deit-mini" in \
        capsys.readouterr().err
    assert main([*common, "--only", "convit-mini"]) == 0
    sweep = out / "lr-sweep"
    assert (sweep / "convit-mini" / "lr0.001" / "50pct" / "seed0" / "finished.json").is_file()
    assert not (sweep / "deit-mini").exists()
    assert "| 0.001 | not finished yet | " in capsys.readouterr().out
