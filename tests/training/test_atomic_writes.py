"""Every file attncnn writes is replaced atomically: a write that fails midway (full disk, crash)
leaves the previous file byte for byte, and no temporary file behind."""

from __future__ import annotations

import errno
import json
import os

import pytest

from attncnn import _io
from attncnn.training import RunFolder, RunFolderError


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture
def full_disk_after_writing(monkeypatch):
    """The data reaches the temporary file, then fsync reports ENOSPC (a write failing midway)."""
    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(_io.os, "fsync", fsync)


@pytest.mark.parametrize("write", [
    lambda p: _io.atomic_write_bytes(p, b"new"),
    lambda p: _io.atomic_write_text(p, "new"),
    lambda p: _io.atomic_write_json(p, {"new": 1}),
])
def test_failed_write_leaves_the_previous_file(tmp_path, full_disk_after_writing, write):
    target = tmp_path / "file"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="No space left"):
        write(target)
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_crash_between_write_and_rename_leaves_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "file"
    target.write_bytes(b"old")

    def crash(*a, **k):
        raise KeyboardInterrupt   # e.g. a second Ctrl-C at the worst moment

    monkeypatch.setattr(_io.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        _io.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_run_folder_files_survive_a_full_disk(tmp_path, monkeypatch):
    run = RunFolder(tmp_path / "run", mode="new")
    run.write_config({"epochs": 3})
    run.append_metrics({"epoch": 1, "test_accuracy": 0.5})
    run.mark_finished({"done": 1})
    files = {name: (run.path / name).read_bytes() for name in ("config.json", "metrics.jsonl", "finished.json")}

    monkeypatch.setattr(_io.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    for action, name in ((lambda: run.write_config({"epochs": 4}), "config.json"),
                         (lambda: run.append_metrics({"epoch": 2, "test_accuracy": 0.6}), "metrics.jsonl"),
                         (lambda: run.rewind_metrics(0), "metrics.jsonl"),
                         (lambda: run.mark_finished({"done": 2}), "finished.json")):
        with pytest.raises(RunFolderError) as err:
            action()
        msg = str(err.value)
        assert str(run.path / name) in msg and "free some space" in msg and "--out" in msg and "intact" in msg
    for name, data in files.items():
        assert (run.path / name).read_bytes() == data, name
    assert _leftovers(run.path) == []
    run.close()


def test_metrics_are_rewritten_whole_and_keep_every_record(tmp_path):
    run = RunFolder(tmp_path / "run", mode="new")
    for epoch in range(1, 4):
        run.append_metrics({"epoch": epoch, "loss": 1.0 / epoch})
    assert [json.loads(line)["epoch"] for line in (run.path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert os.listdir(run.path).count("metrics.jsonl") == 1 and _leftovers(run.path) == []
    run.close()
