"""Absurd ``--epochs`` in ``attncnn reproduce --dry-run``: the test passes are counted, not looped
over (10**9 epochs took 100 s), the estimate stays a number, and a count past any run is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attncnn.cli import main
from attncnn.training import count_test_passes, evaluates


def test_the_count_of_test_passes_is_the_epoch_by_epoch_count():
    for epochs in range(0, 60):
        for eval_every in range(1, 70):
            looped = sum(evaluates(e, epochs, eval_every) for e in range(1, epochs + 1))
            assert count_test_passes(epochs, eval_every) == looped, (epochs, eval_every)
    with pytest.raises(ValueError, match="eval_every must be >= 1"):
        count_test_passes(10, 0)


def test_counting_the_test_passes_of_a_trillion_epochs_is_arithmetic():
    # in a child process with a time limit: an epoch-by-epoch count of 10**12 epochs would take a day
    import attncnn

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(attncnn.__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    code = "from attncnn.training import count_test_passes; print(count_test_passes(10**12, 7), " \
           "count_test_passes(10**12, 10**12), count_test_passes(10**12 + 1, 10**12))"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("count_test_passes(10**12, 7) did not return within 60 s: it loops over the epochs")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(-(-10**12 // 7)), "1", "2"]


def test_epochs_past_any_run_are_refused_before_anything_runs(tmp_path, capsys):
    for epochs in (10**12 + 1, 10**400):
        assert main(["reproduce", "mini", "--out", str(tmp_path / "m"), "--report-only", "--epochs", str(epochs)]) == 2
        err = capsys.readouterr().err
        assert "--epochs must be at most 1,000,000,000,000 (10**12)" in err and err.count("\n") == 1
    assert "a number of 401 digits" in err                   # not 400 digits of the number itself
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_dry_run_of_a_billion_epochs_prints_a_finite_estimate(make_tiny_data, tmp_path, capsys, monkeypatch):
    from attncnn.reproduce.running import estimate

    monkeypatch.setattr(estimate, "time_steps", lambda *a, **k: {"step_seconds": 2.0, "infer_seconds": 0.5})
    data = make_tiny_data(40, 10, size=16)            # 3 classes: 120 train, 30 test images of 16x16
    assert main(["reproduce", "mini", "--dry-run", "--only", "quadratic-mini", "--seeds", "0", "--out",
                 str(tmp_path / "m"), "--epochs", str(10**9), "--no-compile", "--batch-size", "10",
                 "--data", str(data)]) == 0
    text = capsys.readouterr().out
    # 12 steps of 2 s and a test pass of 3 batches of 0.5 s an epoch: 25.5 s, 10**9 times
    assert "--epochs 1000000000" in text and "~0.4 min/epoch" in text
    assert f"~{25.5e9 / 3600:.2f} h (" in text and "inf" not in text and "nan" not in text
    assert not (tmp_path / "m").exists()
