"""``attncnn reproduce efficiency-scarce`` end to end on a tiny data set: the calibration, the
learning-rate sweep and the grid (every row, a variant's options in its config.json), then the
report with ConViT's three claims and the gap of every scarce cell."""

from __future__ import annotations

import json

import pytest

from attncnn.cli import main
from attncnn.reproduce.grid import SCARCE_GRID

pytestmark = pytest.mark.slow        # 18 tiny runs of 2-4 epochs of 60-120 images (about 30 s on 2 idle cores)

# cells of 50 % and 100 % of 120 images for one pass (2 and 1 epochs): the grid's 10 % cell would be
# 10 epochs, and its second seed, which the fast tests plan, would double it
SMOKE = ["--train-images", "120", "--passes", "1", "--batch-size", "20", "--fractions", "0.5,1", "--no-progress",
         "--device", "cpu"]


@pytest.fixture(scope="module")
def scarce(make_tiny_data, tmp_path_factory):
    data = make_tiny_data(40, 10)                      # 3 classes: 120 train, 30 test images
    out = tmp_path_factory.mktemp("scarce") / "efficiency-scarce"
    common = ["reproduce", "efficiency-scarce", "--data", str(data), "--out", str(out), *SMOKE]
    assert main([*common, "--calibrate"]) == 0
    assert main([*common, "--lr-sweep", "5e-4,1e-3"]) == 0
    assert main([*common, "--trim"]) == 0
    return out, json.loads((out / "report.json").read_text())


def test_calibration_and_sweep_print_their_measurements(scarce, capsys, make_tiny_data):
    out, _ = scarce
    assert (out / "calibrate" / "passes1" / "deit-mini" / "50pct" / "seed0" / "finished.json").is_file()
    sweep = json.loads((out / "lr-sweep" / "report.json").read_text())
    assert [entry["lr"] for entry in sweep["rates"]] == [5e-4, 1e-3]
    assert all(entry["mean"] is not None for entry in sweep["rates"])
    assert sweep["best"] == max(sweep["rates"], key=lambda entry: entry["mean"])["lr"]
    # a finished measurement runs again at once: nothing to train, the same lines
    capsys.readouterr()
    assert main(["reproduce", "efficiency-scarce", "--data", str(make_tiny_data(40, 10)), "--out", str(out), *SMOKE,
                 "--calibrate"]) == 0
    printed = capsys.readouterr().out
    assert "resnet18-mini 50 % seed 0: train" in printed and "(criterion >= 15:" in printed


def test_every_row_trains_and_the_report_judges_the_claims(scarce):
    out, report = scarce
    assert [row["preset"] for row in report["rows"]] == list(SCARCE_GRID.presets)
    assert report["missing"] == []
    config = json.loads((out / "convit-mini-random" / "50pct" / "seed0" / "config.json").read_text())
    # the variant's option, beside the attention path the run measured (impl): `attncnn train --preset
    # convit-mini --set init=random` trains the same row
    assert (config["preset"], config["model"]["init"], config["optimizer"], config["lr"]) == (
        "convit-mini", "random", "adamw", SCARCE_GRID.lr)
    claims = {c["claim"][:3]: c for c in report["claims"]}
    assert set(claims) == {"pre", "(a)", "(b)", "(c)"}
    assert all(c["verdict"] in ("holds", "fails") for c in claims.values())      # every cell is in
    assert "convit-mini-random 50 %: L1 " in claims["(c)"]["values"]
    md = (out / "report.md").read_text()
    assert "## Train - test gap of the 50 % cells" in md and md.count("| deit-mini 50 % seed") == 1
    assert "`convit-mini-random`: `convit-mini` with `--set init=random`" in md
    assert (out / "figures" / "efficiency-gates.png").is_file()
