"""A suite preset with a schedule of its own (its row's recipe overrides, ``Suite.rows``): the longest schedule that
fits where the suite's does not (a width-400 model on a short GPU job). It is planned, trained and
reported with its own epochs, and a folder of another length is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from attncnn.cli import main
from attncnn.reproduce import STUDIES, SUITES, get_suite, job_state, plan
from attncnn.reproduce.running.runner import TrainOptions, job_config
from attncnn.training.schedule import LRSchedule


def _shortened(name: str, preset: str, epochs: int, suite_epochs: int | None = None):
    suite = get_suite(name)
    rows = {row: {**recipe, **({} if suite_epochs is None else {"epochs": suite_epochs})}
            for row, recipe in suite.rows.items()}
    return dataclasses.replace(suite, rows={**rows, preset: {**rows[preset], "epochs": epochs}})


@pytest.mark.parametrize("name", ["mini-long", "mini-300", "paper-long"])
def test_every_run_of_a_long_suite_decays_to_zero_by_its_last_step(name, tmp_path):
    """Widths 64 and 400 compare at equal epochs and schedules: the ResNet's own multistep schedule
    (first decay at epoch 80 of 300) would keep 0.1 through all 60 epochs."""
    suite = get_suite(name)
    for job in plan(suite, tmp_path):
        config = job_config(job, TrainOptions())
        schedule = LRSchedule(base_lr=config.lr, epochs=config.epochs, steps_per_epoch=500, kind=config.schedule,
                              warmup_ratio=config.warmup_ratio, stepping=config.lr_stepping,
                              milestones=tuple(config.milestones), gamma=config.gamma)
        assert config.epochs == suite.rows[job.preset]["epochs"] and config.schedule == "cosine"
        assert schedule.lr_at(config.epochs - 1, 499) < 1e-3 * config.lr, job.label
        assert schedule.lr_at(config.epochs // 2, 0) > 0.4 * config.lr, job.label


def test_a_preset_override_changes_that_presets_jobs_alone(tmp_path):
    suite = _shortened("paper-long", "learned-content", 40)
    epochs = {job.preset: dict(job.overrides)["epochs"] for job in plan(suite, tmp_path)}
    assert epochs == {"quadratic": 60, "learned": 60, "resnet18": 60, "quadratic-generalized": 60,
                      "learned-content": 40}
    assert suite.rows["learned-content"] == {"epochs": 40} and suite.rows["quadratic"] == {"epochs": 60}
    # a smoke run's --epochs is every job's length
    assert {dict(job.overrides)["epochs"] for job in plan(suite, tmp_path, epochs=1)} == {1}


@pytest.mark.slow
def test_a_shortened_preset_trains_and_reports_its_own_epochs(make_tiny_data, tmp_path, monkeypatch):
    suite = _shortened("mini-long", "resnet18-mini", 1, suite_epochs=2)
    for table in (STUDIES, SUITES):
        monkeypatch.setitem(table, "mini-long", suite)
    data, out = make_tiny_data(40, 10), tmp_path / "mini-long"
    # --no-compile: on a fresh machine the compile choice would compile each preset (tens of seconds on 2 cores)
    # to time runs of seconds; the choice has its own tests (tests/perf/test_compiling.py)
    assert main(["reproduce", "mini-long", "--data", str(data), "--out", str(out), "--seeds", "0",
                 "--only", "quadratic-mini,resnet18-mini", "--no-progress", "--no-viewer", "--no-compile"]) == 0
    lengths = {p: json.loads((out / p / "seed0" / "config.json").read_text())["epochs"]
               for p in ("quadratic-mini", "resnet18-mini")}
    assert lengths == {"quadratic-mini": 2, "resnet18-mini": 1}
    report = json.loads((out / "report.json").read_text())
    trained = {r["preset"]: r["epochs"] for r in report["rows"] if r["epochs"] is not None}
    assert trained == {"quadratic-mini": 2, "resnet18-mini": 1}
    assert not any(label.startswith(("quadratic-mini ", "resnet18-mini ")) for label in report["missing"])
    # the suite's length is not the shortened run's: that folder is refused, not retrained
    full = dataclasses.replace(suite, rows={**suite.rows, "resnet18-mini": suite.rows["quadratic-mini"]})
    (resnet,) = plan(full, out, seeds=(0,), only=("resnet18-mini",))
    with pytest.raises(ValueError, match="holds a run with epochs=1, but resnet18-mini seed 0 needs epochs=2"):
        job_state(resnet)
