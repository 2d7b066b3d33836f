"""metrics.jsonl stays valid JSON lines: a line cut short by a crash is never left in the middle of the
file, and a rewind for a resume leaves each epoch up to the checkpoint's once, in order."""

from __future__ import annotations

import json
import logging

from attncnn.runs import RunFolder


def _records(run: RunFolder) -> list[dict]:
    text = (run.path / "metrics.jsonl").read_text()
    assert not text or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_line_cut_short_is_dropped_not_left_mid_file_by_the_next_append(tmp_path, caplog):
    run = RunFolder(tmp_path, mode="new")
    run.append_metrics({"epoch": 1, "loss": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "lo')
    with caplog.at_level(logging.WARNING, logger="attncnn.runs.folder"):
        run.append_metrics({"epoch": 3, "loss": 0.5})
    assert _records(run) == [{"epoch": 1, "loss": 1.0}, {"epoch": 3, "loss": 0.5}]
    assert "line 2 is not a complete JSON record" in caplog.text
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 4}')                                          # whole, only its newline missing
    run.append_metrics({"epoch": 5})
    assert [r["epoch"] for r in _records(run)] == [1, 3, 4, 5]
    run.close()


def test_a_rewind_restores_a_torn_record_from_the_checkpoint_and_keeps_each_epoch_once(tmp_path, caplog):
    run = RunFolder(tmp_path, mode="new")
    lines = [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.9}, {"epoch": 2, "loss": 0.8}, {"epoch": 3, "loss": 0.7}]
    held = {"epoch": 3, "loss": 0.6}                                     # the checkpoint's copy of epoch 3
    torn = "".join(json.dumps(r) + "\n" for r in lines[:3]) + json.dumps(lines[3])[:12]
    (tmp_path / "metrics.jsonl").write_text(torn)
    with caplog.at_level(logging.WARNING, logger="attncnn.runs.folder"):
        assert run.rewind_metrics(3, held) == 1                          # epoch 2's first record
    assert _records(run) == [lines[0], lines[2], held]
    assert "restored from the checkpoint" in caplog.text
    before = (tmp_path / "metrics.jsonl").stat()
    assert run.rewind_metrics(3, {"epoch": 3, "loss": 0.0}) == 0         # a record in the file is kept
    after = (tmp_path / "metrics.jsonl").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)     # nothing to rewrite
    assert run.rewind_metrics(1) == 2 and _records(run) == [lines[0]]
    run.close()


def test_a_rewind_without_the_checkpoints_copy_says_the_record_is_lost(tmp_path, caplog):
    run = RunFolder(tmp_path, mode="new")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"epoch": 1}) + "\n" + '{"epoch": 2, "lo')
    with caplog.at_level(logging.WARNING, logger="attncnn.runs.folder"):
        assert run.rewind_metrics(2, {}) == 0
    assert _records(run) == [{"epoch": 1}]
    assert "epoch 2's record is missing and the checkpoint holds no copy of it" in caplog.text
    run.close()
