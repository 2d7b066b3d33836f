"""A long timing is not silent: one line of progress once it has run 10 s, none for a short one; the
dry run says which step it times before it starts."""

from __future__ import annotations

import logging

import pytest
import torch

from attncnn.data import DataShape
from attncnn.perf import precision, timing
from attncnn.reproduce.running import estimate, runner

CPU = torch.device("cpu")


def _clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def call_taking(seconds):
        def fn():
            now[0] += seconds
        return fn
    return call_taking


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "attncnn.perf.timing"]


def test_a_long_timing_logs_one_line_as_it_goes(monkeypatch, caplog):
    call_taking = _clock(monkeypatch)
    with caplog.at_level(logging.INFO, logger="attncnn.perf.timing"):
        seconds = timing.time_median(call_taking(6.0), CPU, warmup=1, reps=3, what="a training step of x")
    assert seconds == 6.0
    assert _lines(caplog) == ["timing a training step of x: 12 s for 2 of 4 calls so far, about 12 s to go"]


def test_a_short_timing_logs_nothing(monkeypatch, caplog):
    call_taking = _clock(monkeypatch)
    with caplog.at_level(logging.INFO, logger="attncnn.perf.timing"):
        timing.time_alternated({"a": call_taking(1.0), "b": call_taking(1.2)}, CPU, reps=3)   # 8.8 s in all
        timing.time_alternated({"a": call_taking(0.1)}, CPU, reps=20)
    assert _lines(caplog) == []


@pytest.mark.parametrize("fast", [False, True], ids=["slow-bf16", "fast-bf16"])
def test_the_dry_run_names_the_step_it_times_before_timing_it(monkeypatch, caplog, tmp_path, fast):
    # the job's precision is "auto", which the CPU decides: both answers are tried on any CPU, and the
    # expectation comes from the rule the runner applies, never from the CPU this test runs on
    monkeypatch.setattr(precision, "fast_bf16", lambda device: fast)
    expected = precision.resolve_precision("auto", CPU)
    order = []

    def fake_time_steps(model, images, labels, **kwargs):
        order.append(("timed", kwargs["what"]))
        return {"step_seconds": 2.0, "infer_seconds": 0.5, "peak_memory_bytes": 0}

    monkeypatch.setattr(estimate, "time_steps", fake_time_steps)
    monkeypatch.setattr(estimate.log, "info", lambda msg, *args: order.append(("logged", msg % args)))
    data = DataShape("tiny", train=120, test=30, num_classes=3, image_shape=(3, 16, 16))
    estimate.estimate_job(runner.Job("quadratic-mini", 0, tmp_path / "q"),
                          runner.TrainOptions(compile=False, epochs=2, batch_size=10), data=data)
    assert expected == ("bf16" if fast else "fp32")
    assert order == [("logged", f"timing one training step and one test batch of quadratic-mini (batch 10, {expected}) "
                                "on cpu for the estimate..."),
                     ("timed", f"quadratic-mini (batch 10, {expected})")]
