"""Every file attncnn writes is replaced atomically: a write that fails midway (full disk, crash)
leaves the previous file byte for byte, and no temporary file behind."""

from __future__ import annotations

import errno
import json
import os

import pytest

from attncnn import _io
from attncnn.runs import RunFolder, RunFolderError


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


# -- file modes: what a plain open() would give, not mkstemp's private 0600 ------------------------

@pytest.fixture(params=[(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def umask(request):
    """Run the test under a umask; yields the mode a plain open() would give a new file."""
    mask, mode = request.param
    previous = os.umask(mask)
    try:
        yield mode
    finally:
        os.umask(previous)


def _mode(path):
    return path.stat().st_mode & 0o777


def test_plain_writes_follow_the_umask(tmp_path, umask):
    _io.atomic_write_bytes(tmp_path / "b", b"x")
    _io.atomic_write_text(tmp_path / "t", "x")
    _io.atomic_write_json(tmp_path / "j", {"x": 1})
    with _io.atomic_path(tmp_path / "p.png", suffix=".png") as tmp:
        tmp.write_bytes(b"written by another library, e.g. matplotlib or safetensors")
    assert {p.name: _mode(p) for p in tmp_path.iterdir()} == {n: umask for n in ("b", "t", "j", "p.png")}


def test_replacing_a_file_gives_the_new_file_the_umask_mode(tmp_path, umask):
    target = tmp_path / "file"
    target.write_bytes(b"old")
    target.chmod(0o600)
    _io.atomic_write_bytes(target, b"new")
    assert _mode(target) == umask and target.read_bytes() == b"new"


def test_run_folder_checkpoint_and_figure_follow_the_umask(tmp_path, umask):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from attncnn.analysis.figures import save_figure
    from attncnn.runs.checkpoint import save_checkpoint

    run = RunFolder(tmp_path / "run", mode="new")
    run.write_config({"epochs": 1})
    run.append_metrics({"epoch": 1, "test_accuracy": 0.5})
    run.mark_finished({"done": 1})
    run.close()
    save_checkpoint(run.path / "checkpoints" / "last.safetensors", model=torch.nn.Linear(2, 2))
    fig = plt.figure()
    written = save_figure(fig, tmp_path / "fig", formats=("png", "pdf"))
    plt.close(fig)
    files = [run.path / n for n in ("config.json", "metrics.jsonl", "finished.json")]
    files += [run.path / "checkpoints" / "last.safetensors", *written]
    assert {p.name: _mode(p) for p in files} == {p.name: umask for p in files}


def test_a_taken_temporary_name_is_drawn_again(tmp_path, monkeypatch):
    names = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(_io.secrets, "token_hex", lambda n: next(names))
    _io.atomic_write_text(tmp_path / "one", "1")
    (tmp_path / ".two.aaaa.tmp").write_text("another writer's temporary file")
    _io.atomic_write_text(tmp_path / "two", "2")
    assert (tmp_path / "one").read_text() == "1" and (tmp_path / "two").read_text() == "2"
    assert (tmp_path / ".two.aaaa.tmp").read_text() == "another writer's temporary file"


def test_unwritable_folder_is_named(tmp_path):
    missing = tmp_path / "no-such-folder"
    with pytest.raises(OSError, match="cannot write into .*no-such-folder.*writable output folder"):
        _io.atomic_write_text(missing / "file", "x")


def test_a_writer_that_replaces_the_temporary_file_still_gets_the_umask_mode(tmp_path, umask):
    with _io.atomic_path(tmp_path / "file") as tmp:
        private = tmp_path / "private"
        fd = os.open(private, os.O_WRONLY | os.O_CREAT, 0o600)   # as safetensors >= 0.8 does
        os.close(fd)
        os.replace(private, tmp)
    assert _mode(tmp_path / "file") == umask


def test_a_full_disk_outside_a_run_folder_is_a_user_error_naming_the_file(tmp_path, monkeypatch):
    # figures, reports and --predictions are written through the same atomic path: a full disk there
    # is one line from the command line (an AttncnnError), with the errno a run folder's message reads
    from attncnn import AttncnnError
    from attncnn._io import atomic_write_text

    dest = tmp_path / "report.md"
    dest.write_text("old")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(AttncnnError, match=rf"cannot write {dest}: No space left on device; free some space") as err:
        atomic_write_text(dest, "new")
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    assert dest.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.md"]
