"""``attncnn reproduce efficiency-scarce`` end to end on a tiny data set: the calibration, the
learning-rate sweep and the grid (every row, a variant's options in its config.json), then the
report with ConViT's three claims and the gap of every scarce cell."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from attncnn.cli import main
from attncnn.reproduce.studies import EFFICIENCY_SCARCE

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
    assert main(common) == 0
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
    assert [row["preset"] for row in report["rows"]] == list(EFFICIENCY_SCARCE.rows)
    assert report["missing"] == []
    config = json.loads((out / "convit-mini-random" / "50pct" / "seed0" / "config.json").read_text())
    # the row's model option, beside the attention path the run measured (impl): `attncnn train --preset
    # convit-mini --set init=random` trains the same row
    assert (config["preset"], config["model"]["init"], config["optimizer"], config["lr"]) == (
        "convit-mini", "random", "adamw", EFFICIENCY_SCARCE.rows["convit-mini-random"]["lr"])
    claims = {c["claim"][:3]: c for c in report["claims"]}
    assert set(claims) == {"pre", "(a)", "(b)", "(c)", "(d)"}
    assert all(c["verdict"] in ("holds", "fails") for c in claims.values())      # every cell is in
    assert "convit-mini-random 50 %: L1 " in claims["(c)"]["values"]
    md = (out / "report.md").read_text()
    assert "## Train - test gap of the 50 % cells" in md and md.count("| deit-mini 50 % seed") == 1
    assert "`convit-mini-random`: `convit-mini` with `--set init=random`" in md
    assert (out / "figures" / "efficiency-gates.png").is_file()


def test_the_sweep_validates_on_training_images_outside_the_cell(scarce, make_tiny_data, capsys):
    from attncnn.data import DeviceLoader, ImageSplit, held_out_indices, load_dataset
    from attncnn.reproduce.running.measurements import HELD_OUT_FILE, held_out_results
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
    # the cache is kept, so the report is rewritten without the data set (the default, cifar10, is not here)
    capsys.readouterr()
    assert main(["reproduce", "efficiency-scarce", "--out", str(out), *SMOKE, "--lr-sweep", "5e-4,1e-3",
                 "--report-only"]) == 0
    assert "(highest held-out mean): " in capsys.readouterr().out
    assert json.loads((run / HELD_OUT_FILE).read_text()) == stored
    # another data set would hold other images: refused, not measured
    (run / HELD_OUT_FILE).unlink()
    with pytest.raises(ValueError, match="give --data the run's data set"):
        held_out_results([run], lambda: load_dataset(str(make_tiny_data(41, 10, size=16))))
    with pytest.raises(ValueError, match="give --data"):
        held_out_results([run], lambda: None)
    assert held_out_results([run], lambda: dataset) == {run: stored}


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
