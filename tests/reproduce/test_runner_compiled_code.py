"""A suite trained in one process drops dynamo's compiled code between its runs, and only there:
:func:`attncnn.training.train` itself leaves a caller's compiled functions alone
(tests/training/test_trainer.py checks that side)."""

from __future__ import annotations

import json

import torch

from attncnn.reproduce import get_suite, plan
from attncnn.reproduce.running import runner


def test_the_suite_resets_dynamo_between_runs_after_a_compiled_one(tmp_path, monkeypatch):
    events = []

    def fake_train(config, folder, plan_, *, mode, progress, epoch_metrics):
        events.append("train")
        folder.mkdir(parents=True)
        compiled = len([e for e in events if e == "train"]) == 2     # the second run compiles, the first does not
        (folder / "config.json").write_text(json.dumps({"precision": "fp32", "compile": compiled}))
        (folder / "finished.json").write_text("{}")

    monkeypatch.setattr(runner, "train", fake_train)
    monkeypatch.setattr(runner, "make_plan", lambda config: None)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    jobs = plan(get_suite("mini-long"), tmp_path, only=("resnet18-mini",), seeds=(0, 1, 2, 3), epochs=1)
    runner.train_jobs(jobs, runner.TrainOptions(data=str(tmp_path / "unused"), epochs=1), progress=False)
    # eager, compiled, then a reset before each run that follows a compiled one
    assert events == ["train", "train", "reset", "train", "reset", "train"]
