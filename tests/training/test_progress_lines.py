"""Without a terminal, a long epoch or test pass reports its progress in a few log lines (no bar), a short one
in none."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from attncnn.data import DeviceLoader, ImageSplit
from attncnn.training import evaluate, progress
from attncnn.training import progress as progress_module
from attncnn.training.progress import EpochMeter

SYNC = 25           # the loop shows its progress where it syncs: every SYNC_EVERY steps and at the last


class FakeSums:
    """Running sums whose means (the one host sync a line costs) are counted."""

    def __init__(self):
        self.count, self.synced = 0, 0

    def means(self, dist):
        self.synced += 1
        return 1.25, 0.5


def _epoch(monkeypatch, caplog, seconds_per_step, *, steps=1000, terminal=False, enabled=True, start=0):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(progress, "sys", SimpleNamespace(stderr=SimpleNamespace(isatty=lambda: terminal)))
    sums = FakeSums()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="attncnn.training.progress"):
        with EpochMeter(2, steps, start, sums, enabled) as meter:
            meter.bar.disable = meter.bar.disable or terminal     # a terminal's bar: not drawn in the test's log
            for step in range(start + 1, steps + 1):
                now[0] += seconds_per_step
                sums.count += 10
                if step % SYNC == 0 or step == steps:
                    meter.show(step, sums, 0.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "attncnn.training.progress"]
    return lines, sums


def test_a_long_epoch_logs_about_every_tenth_and_only_at_the_sync_points(monkeypatch, caplog):
    lines, sums = _epoch(monkeypatch, caplog, 0.25)                # 250 s
    assert [int(line.split()[3].split("/")[0]) for line in lines] == list(range(100, 1000, 100))
    assert lines[0] == "epoch 3  step 100/1000 (10 %)  train loss 1.2500 acc 0.5000  40 img/s"
    assert sums.synced == len(lines)                               # one read of the sums per line, no other


def test_lines_are_at_least_ten_seconds_apart(monkeypatch, caplog):
    lines, _ = _epoch(monkeypatch, caplog, 0.04)                   # 40 s: a tenth is 4 s
    assert [int(line.split()[3].split("/")[0]) for line in lines] == [250, 500, 750]


@pytest.mark.parametrize("seconds_per_step", [0.001, 0.02, 0.029])
def test_an_epoch_under_half_a_minute_logs_nothing(monkeypatch, caplog, seconds_per_step):
    lines, sums = _epoch(monkeypatch, caplog, seconds_per_step)
    assert lines == [] and sums.synced == 0


def test_a_resumed_epoch_counts_from_where_it_resumed(monkeypatch, caplog):
    lines, _ = _epoch(monkeypatch, caplog, 0.25, start=500)
    assert [int(line.split()[3].split("/")[0]) for line in lines] == [600, 700, 800, 900]


def test_no_lines_with_a_terminal_or_without_progress(monkeypatch, caplog):
    assert _epoch(monkeypatch, caplog, 0.25, terminal=True)[0] == []
    assert _epoch(monkeypatch, caplog, 0.25, enabled=False)[0] == []


# -- a test pass (attncnn evaluate) reports its progress the same way -------------------------------

class _SecondPerBatch(torch.nn.Module):
    """A classifier whose every forward pass takes one (simulated) second."""

    def __init__(self, now: list[float]):
        super().__init__()
        self.now, self.fc = now, torch.nn.Linear(3 * 4 * 4, 10)

    def forward(self, x):
        self.now[0] += 1.0
        return self.fc(x.flatten(1))


def _test_pass(monkeypatch, caplog, batches: int, *, progress: bool = True, terminal: bool = False):
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(progress_module, "sys", SimpleNamespace(stderr=SimpleNamespace(isatty=lambda: terminal)))
    generator = torch.Generator().manual_seed(0)
    split = ImageSplit(torch.randint(0, 256, (batches * 5, 3, 4, 4), dtype=torch.uint8, generator=generator),
                       torch.randint(0, 10, (batches * 5,), generator=generator))
    loader = DeviceLoader(split, batch_size=5, train=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="attncnn.training.progress"):
        result = evaluate(_SecondPerBatch(now), loader, progress=progress)
    return [r.getMessage() for r in caplog.records if r.name == "attncnn.training.progress"], result


def test_a_long_test_pass_logs_about_every_tenth_with_its_accuracy_so_far(monkeypatch, caplog):
    # attncnn evaluate printed nothing for minutes after "loaded decoded images"
    lines, result = _test_pass(monkeypatch, caplog, 200)           # 200 s
    assert [line.split()[2] for line in lines] == [f"{b}/200" for b in range(20, 200, 20)]
    assert lines[0].startswith("test  batch 20/200 (10 %)  100 images  accuracy so far 0.")
    assert lines[0].endswith("  5 img/s") and result.examples == 1000


def test_a_short_test_pass_and_a_pass_without_progress_log_nothing(monkeypatch, caplog):
    assert _test_pass(monkeypatch, caplog, 25)[0] == []                      # 25 s: under half a minute
    assert _test_pass(monkeypatch, caplog, 200, progress=False)[0] == []     # the test passes inside training
    assert _test_pass(monkeypatch, caplog, 200, terminal=True)[0] == []      # a terminal gets the bar instead


def test_the_evaluate_command_asks_for_progress_unless_told_not_to(monkeypatch, capsys):
    from attncnn.cli import main

    asked = []

    def evaluate_run(path, **options):
        asked.append(options["progress"])
        return {"test_accuracy": 0.5, "test_loss": 1.0, "examples": 10, "dataset": "d", "epoch": 1,
                "precision": "fp32", "precision_from": "--precision", "checkpoint": path}

    monkeypatch.setattr("attncnn.api.evaluation.evaluate_run", evaluate_run)
    assert main(["evaluate", "some/run"]) == 0 and main(["evaluate", "some/run", "--no-progress"]) == 0
    assert asked == [True, False]
