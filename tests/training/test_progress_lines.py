"""Without a terminal, a long epoch reports its progress in a few log lines (no bar), a short one in none."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from attncnn.training import progress
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
