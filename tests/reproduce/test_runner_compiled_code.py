"""A suite trained in one process drops dynamo's compiled code between its runs, and only there:
:func:`attncnn.training.train` itself leaves a caller's compiled functions alone
(tests/training/test_trainer.py checks that side)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from attncnn.reproduce import get_suite, plan
from attncnn.reproduce.running import runner


def test_the_suite_resets_dynamo_between_runs_after_a_compiled_one(tmp_path, monkeypatch):
    events = []

    def fake_train(config, folder, plan_, *, mode, progress, epoch_metrics):
        events.append("train")
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"preset": "resnet18-mini"}))
        (folder / "finished.json").write_text("{}")

    plans = iter([False, True, False, False])                       # the second run compiles, the others do not
    monkeypatch.setattr(runner, "train", fake_train)
    monkeypatch.setattr(runner, "make_plan", lambda config, options: SimpleNamespace(compile=next(plans)))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    jobs = plan(get_suite("mini-long"), tmp_path, only=("resnet18-mini",), seeds=(0, 1, 2, 3), epochs=1)
    runner.train_jobs(jobs, runner.TrainOptions(data=str(tmp_path / "unused"), epochs=1), progress=False)
    # eager, compiled, then a reset before each run that follows a compiled one
    assert events == ["train", "train", "reset", "train", "reset", "train"]
