"""The sample-efficiency grid's cells and plan (no training): equal seen images, whole epochs,
the order a grid run in parts needs, and folders that hold another cell refused."""

from __future__ import annotations

import json

import pytest

from attncnn.models import get_preset
from attncnn.reproduce import job_state
from attncnn.reproduce.running.runner import cell_options, plan_grid
from attncnn.reproduce.running.runner import TrainOptions, job_config, train_command
from attncnn.reproduce.studies import EFFICIENCY


def test_every_cell_sees_the_same_images_in_whole_epochs():
    cells = [cell_options(f, train_images=50_000, passes=EFFICIENCY.passes, evaluations=EFFICIENCY.evaluations)
             for f in EFFICIENCY.fractions]
    assert [(c["train_subset"], c["epochs"], c["eval_every"]) for c in cells] == [(5_000, 20, 5), (12_500, 8, 2),
                                                                                  (50_000, 2, 1)]
    assert {c["train_subset"] * c["epochs"] for c in cells} == {100_000}
    assert all(c["checkpoint_every"] == 0 for c in cells)


def test_cells_that_are_not_whole_epochs_are_refused():
    with pytest.raises(ValueError, match="not a whole number of epochs.*--passes"):
        cell_options(0.3, train_images=50_000, passes=2, evaluations=4)        # 100,000 / 15,000
    with pytest.raises(ValueError, match="larger --train-images"):
        cell_options(0.1, train_images=4, passes=2, evaluations=4)           # 0 images


def test_plan_puts_the_smallest_subset_first_and_every_preset_exists(tmp_path):
    jobs = plan_grid(EFFICIENCY, tmp_path, seeds=(0,))
    assert len(jobs) == len(EFFICIENCY.rows) * len(EFFICIENCY.fractions)
    assert [j.cell for j in jobs[:len(EFFICIENCY.rows)]] == ["10 %"] * len(EFFICIENCY.rows)
    assert [j.preset for j in jobs[:len(EFFICIENCY.rows)]] == list(EFFICIENCY.rows)
    assert all(get_preset(p).name == p for p in EFFICIENCY.rows)
    assert jobs[0].folder == tmp_path / "resnet18-mini" / "10pct" / "seed0"
    assert jobs[0].label == "resnet18-mini 10 % seed 0"
    only = plan_grid(EFFICIENCY, tmp_path, seeds=(1,), only=("gpsa-mini",), train_images=1_000)
    assert [(j.preset, j.seed, dict(j.overrides)["train_subset"]) for j in only] == [
        ("gpsa-mini", 1, 100), ("gpsa-mini", 1, 250), ("gpsa-mini", 1, 1_000)]
    with pytest.raises(ValueError, match="not in the efficiency grid"):
        plan_grid(EFFICIENCY, tmp_path, only=("quadratic",))


def test_the_scarce_data_cells_get_a_second_seed_after_the_first_seeds_whole_grid(tmp_path):
    jobs = plan_grid(EFFICIENCY, tmp_path)
    whole = len(EFFICIENCY.rows) * len(EFFICIENCY.fractions)
    first, more = jobs[:whole], jobs[whole:]
    assert {j.seed for j in first} == {0} and first[-1].cell == "100 %"
    assert [(j.preset, j.seed, j.cell) for j in more] == [(p, 1, "10 %") for p in EFFICIENCY.rows]
    assert more[0].folder == tmp_path / "resnet18-mini" / "10pct" / "seed1"
    # --seeds gives every cell the same seeds
    assert {(j.seed, j.cell) for j in plan_grid(EFFICIENCY, tmp_path, seeds=(2,))} == {(2, "10 %"), (2, "25 %"),
                                                                                      (2, "100 %")}


def test_a_cells_options_win_over_the_command_line_and_reach_its_train_command(tmp_path):
    job = plan_grid(EFFICIENCY, tmp_path)[1]
    options = TrainOptions(data="somewhere", epochs=99, batch_size=50)
    config = job_config(job, options)
    assert (config.preset, config.train_subset, config.epochs, config.eval_every, config.batch_size) == (
        "quadratic-mini", 5_000, 20, 5, 50)
    command = train_command(job, options)
    assert "--train-subset 5000" in command and "--epochs 20" in command and "--eval-every 5" in command


def test_a_folder_holding_another_cell_is_refused(tmp_path):
    ten, thirty = plan_grid(EFFICIENCY, tmp_path, only=("quadratic-mini",))[:2]
    thirty.folder.mkdir(parents=True)
    stored = {"preset": "quadratic-mini", "seed": 0, **dict(ten.overrides)}
    (thirty.folder / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="holds a run with epochs=20.*needs epochs=8"):
        job_state(thirty)
