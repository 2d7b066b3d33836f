"""benchmarks/gpu/speed.py: the rows of a GPU speed job, their commands (the baseline's code for
``before``), the table's ratios, the budget, and one real row on the CPU."""

import json
import os
import re
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from attncnn.perf.precision import fast_bf16

import speed

ROOT = Path(__file__).resolve().parents[2]


def _args(tmp_path, **kw):
    values = dict(out=str(tmp_path / "out"), baseline=str(tmp_path / "base" / "src"), device="cuda", batch_size=100,
                  layers=None, budget=300.0, rows="full", precision="bf16", row_limit=None)
    values.update(kw)
    return Namespace(**values)


def test_the_plan_puts_the_baseline_and_the_runs_own_choice_first():
    quick, full = speed.plan("quick"), speed.plan("full")
    assert full[:len(quick)] == quick
    assert [r.code for r in quick[:2]] == ["before", "before"] and all(not r.compile and r.impl is None
                                                                        for r in quick[:2])
    # the earlier code has no one-hot paths: only "after" rows name a path
    assert all(r.code == "after" for r in full if r.impl)
    assert {r.impl for r in full if r.impl} == {"explicit-half", "explicit-onehot", "bilinear", "sdpa"}
    content = speed.plan("content")
    assert {r.preset for r in content} == {"learned-content"} and content[0] == speed.Row("before", "learned-content")
    assert {(r.impl, r.compile) for r in content[1:]} == {(None, False), (None, True), ("bilinear", True),
                                                         ("explicit-onehot", True)}


def test_before_rows_run_the_baseline_code_and_after_rows_this_checkout(tmp_path):
    args = _args(tmp_path, layers=1)
    cmd, env = speed.command(speed.Row("before", "quadratic"), args)
    assert cmd[1:4] == ["-m", "attncnn", "bench"] and "--set" not in cmd
    assert cmd[cmd.index("--variants") + 1] == "bf16" and cmd[cmd.index("--layers") + 1] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str((tmp_path / "base" / "src").resolve())
    cmd, env = speed.command(speed.Row("after", "learned-content", "bilinear", compile=True), args)
    assert cmd[cmd.index("--set") + 1] == "impl=bilinear" and cmd[cmd.index("--variants") + 1] == "bf16+compile"
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT / "src")
    fp32 = _args(tmp_path, precision="fp32")
    variants = []
    for compiled in (False, True):
        cmd, _ = speed.command(speed.Row("after", "quadratic", compile=compiled), fp32)
        variants.append(cmd[cmd.index("--variants") + 1])
    assert variants == ["fp32", "fp32+compile"]
    assert "rows, fp32, batch 100" in speed.table([], [], fp32)
    text = speed.table([_result(speed.Row("after", "learned-content", "bilinear"), 10.0)], [], args)
    assert "| after | learned-content | bilinear |" in text


def _result(row, images_per_s, **extra):
    return {"row": row.__dict__, "seconds": 12.0, "machine": {"gpu": "test GPU"}, "train_images_per_s": images_per_s,
            "infer_images_per_s": 2 * images_per_s, "peak_memory_bytes": 2**30,
            "attention_paths": {"train": ["explicit-half"] * 6, "eval": ["sdpa"] * 6}, **extra}


def test_the_table_gives_each_row_its_ratio_to_the_baseline_eager_row_of_its_preset(tmp_path):
    rows = [speed.Row("before", "learned-content"), speed.Row("after", "learned-content", compile=True),
            speed.Row("after", "quadratic")]
    results = [_result(rows[0], 1000.0), _result(rows[1], 2500.0), _result(rows[2], 5000.0),
               {"row": speed.Row("after", "learned-content", "sdpa").__dict__, "seconds": 3.0, "error": "boom"}]
    text = speed.table(results, [(speed.Row("after", "quadratic", compile=True), "the 300 s budget")],
                       _args(tmp_path))
    lines = text.splitlines()
    assert "gpu test GPU" in lines[0]
    (after,) = [line for line in lines if "| after | learned-content | auto |" in line]
    assert "| 2.50x |" in after and "| 2,500 |" in after and "explicit-half / sdpa" in after
    (quadratic,) = [line for line in lines if "| after | quadratic | auto |" in line and "| no |" in line]
    assert "| - |" in quadratic                     # no baseline row of its preset: no ratio
    assert any("failed: boom" in line for line in lines)
    assert any("not run: the 300 s budget" in line for line in lines)


def test_rows_past_the_budget_are_skipped_and_the_table_is_written_after_every_row(tmp_path, monkeypatch):
    (tmp_path / "base" / "src" / "attncnn").mkdir(parents=True)
    ran = []

    def fake(row, args, limit, why):
        ran.append(row)
        assert (limit, why) == (100 - 30 * len(ran), "the 100 s budget")    # 3x 40 s would pass the budget
        assert (Path(args.out) / "gpu-speed.md").exists() == (len(ran) > 1)
        return _result(row, 100.0)

    monkeypatch.setattr(speed, "run_row", fake)
    # 100 s: the eager rows (40 s each) fit until the clock says otherwise; no compiled row (90 s) fits after two
    clock = iter(range(0, 10_000, 30))
    monkeypatch.setattr(speed.time, "monotonic", lambda: next(clock))
    code = speed.main(["--out", str(tmp_path / "out"), "--baseline", str(tmp_path / "base" / "src"), "--rows", "quick",
                       "--budget", "100"])
    assert code == 0 and [r.code for r in ran] == ["before", "before"]
    text = (tmp_path / "out" / "gpu-speed.md").read_text()
    assert text.count("not run: the 100 s budget") == 4
    assert len(json.loads((tmp_path / "out" / "gpu-speed.json").read_text())) == 2


def test_a_row_may_run_three_times_its_assumed_seconds_or_its_limit_but_never_past_the_budget(tmp_path):
    eager, compiled = speed.Row("after", "quadratic"), speed.Row("after", "quadratic", compile=True)
    args = _args(tmp_path)
    assert speed.row_limit(eager, args, 1000.0) == (120.0, "the row limit")
    assert speed.row_limit(compiled, args, 1000.0) == (270.0, "the row limit")
    assert speed.row_limit(compiled, args, 200.0) == (200.0, "the 300 s budget")
    assert speed.row_limit(compiled, _args(tmp_path, row_limit=50.0), 200.0) == (50.0, "the row limit")


def test_a_row_that_runs_on_is_stopped_with_the_processes_it_started(tmp_path, monkeypatch,
                                                                      assert_process_ends):
    """A stalled row (here a process that starts a child and sleeps) is stopped at its limit, the
    child too (a compile worker would hold the GPU), and its error says after how long and why."""
    child_pid = tmp_path / "child.pid"
    script = ("import subprocess, sys, time, pathlib; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"pathlib.Path({str(child_pid)!r}).write_text(str(c.pid)); time.sleep(60)")
    monkeypatch.setattr(speed, "command", lambda row, args: ([sys.executable, "-c", script], dict(os.environ)))
    row = speed.Row("after", "learned-content", "bilinear", compile=True)
    start = time.monotonic()
    result = speed.run_row(row, _args(tmp_path), 3.0, "the row limit")
    assert time.monotonic() - start < 30
    assert result["row"] == row.__dict__ and 3.0 <= result["seconds"] < 30
    assert re.fullmatch(r"stopped after \d+ s \(the row limit\)", result["error"]), result["error"]
    pid = int(child_pid.read_text())
    assert_process_ends(pid, "the row's child process")
    text = speed.table([result], [], _args(tmp_path))
    assert "failed: stopped after" in text and "(the row limit)" in text


def test_a_row_limit_that_is_not_positive_is_refused(tmp_path, capsys):
    (tmp_path / "base" / "src" / "attncnn").mkdir(parents=True)
    with pytest.raises(SystemExit):
        speed.main(["--out", str(tmp_path / "out"), "--baseline", str(tmp_path / "base" / "src"), "--row-limit", "0"])
    assert "--row-limit must be a positive number of seconds, got 0" in capsys.readouterr().err


def test_a_baseline_without_the_package_is_refused_with_the_command_that_makes_it(tmp_path, capsys):
    with pytest.raises(SystemExit):
        speed.main(["--out", str(tmp_path / "out"), "--baseline", str(tmp_path / "nowhere")])
    assert "git archive <commit> src | tar -x -C .gpu/baseline" in capsys.readouterr().err


@pytest.mark.slow
def test_one_real_row_on_the_cpu(tmp_path):
    """The command a row runs works: this checkout's bench of a one-layer preset, parsed (in fp32 on a
    CPU without fast bf16, where a bf16 row takes minutes)."""
    precision = "bf16" if fast_bf16(torch.device("cpu")) else "fp32"
    args = _args(tmp_path, device="cpu", batch_size=2, layers=1, precision=precision)
    result = speed.run_row(speed.Row("after", "learned-content", "explicit-onehot"), args)
    assert "error" not in result, result.get("error")
    assert result["train_images_per_s"] > 0 and result["attention_paths"]["train"] == ["explicit-onehot"]
    assert result["machine"]["device"] == "cpu"
