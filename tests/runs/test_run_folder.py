"""RunFolder: modes, config, metrics + TensorBoard, periodic checkpoints, finished marker."""

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from attncnn.runs.folder import RunFolder, RunFolderError


def test_new_creates_and_refuses_non_empty(tmp_path):
    run = RunFolder(tmp_path / "a" / "run", mode="new")
    assert run.path.is_dir() and [p.name for p in run.path.iterdir()] == [".lock"]      # held while open
    run.write_config({"lr": 0.1})
    run.close()
    with pytest.raises(RunFolderError, match="use --resume to continue it, --overwrite to replace it"):
        RunFolder(run.path, mode="new")
    empty = tmp_path / "empty"
    empty.mkdir()
    RunFolder(empty, mode="new")                       # an existing empty folder is fine


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown run folder mode"):
        RunFolder("x", mode="append")


def test_overwrite_deletes_previous_contents(tmp_path):
    run = RunFolder(tmp_path / "run", mode="new")
    run.write_config({"a": 1})
    run.append_metrics({"epoch": 1, "loss": 1.0})
    run.close()
    (run.checkpoint_path("last")).write_bytes(b"x")
    run2 = RunFolder(tmp_path / "run", mode="overwrite")
    assert [p.name for p in run2.path.iterdir()] == [".lock"]
    RunFolder(tmp_path / "fresh", mode="overwrite")    # missing folder is created
    assert (tmp_path / "fresh").is_dir()


def test_overwrite_refuses_cwd_and_its_parents(tmp_path, monkeypatch):
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("precious")
    monkeypatch.chdir(work)
    for target in (work, tmp_path, "."):
        with pytest.raises(RunFolderError, match="refusing to overwrite"):
            RunFolder(target, mode="overwrite")
    assert (work / "notes.txt").read_text() == "precious"
    other = tmp_path / "other"
    other.mkdir()
    (other / "stale.txt").write_text("x")
    RunFolder(other, mode="overwrite").close()         # any other folder is emptied
    assert [p.name for p in other.iterdir()] == [".lock"]


def test_resume_requires_config(tmp_path):
    with pytest.raises(RunFolderError, match="does not exist"):
        RunFolder(tmp_path / "missing", mode="resume")
    (tmp_path / "half").mkdir()
    with pytest.raises(RunFolderError, match="no config.json"):
        RunFolder(tmp_path / "half", mode="resume")
    run = RunFolder(tmp_path / "ok", mode="new")
    run.write_config({"epochs": 3, "milestones": [1, 2]})
    run.close()
    resumed = RunFolder(tmp_path / "ok", mode="resume")
    assert resumed.read_config() == {"epochs": 3, "milestones": [1, 2]}


def test_read_mode(tmp_path):
    with pytest.raises(RunFolderError, match="does not exist"):
        RunFolder(tmp_path / "missing", mode="read")
    run = RunFolder(tmp_path, mode="read")
    assert not (tmp_path / "checkpoints").exists()
    assert run.checkpoint_path("best") == tmp_path / "checkpoints" / "best.safetensors"
    assert not (tmp_path / "checkpoints").exists()     # read mode creates nothing
    with pytest.raises(RunFolderError, match="read-only"):
        run.append_metrics({"epoch": 1})
    with pytest.raises(RunFolderError, match="read-only"):
        run.write_config({})
    with pytest.raises(RunFolderError, match="config.json does not exist"):
        run.read_config()


def test_not_creatable_folder_names_path_and_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunFolderError, match=r"file.*not a folder"):
        RunFolder(blocker, mode="new")
    target = blocker / "run"
    with pytest.raises(RunFolderError, match=rf"{target}.*choose a writable output folder"):
        RunFolder(target, mode="new")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(RunFolderError, match="choose a writable output folder"):
            RunFolder(ro, mode="new")
        with pytest.raises(RunFolderError, match="choose a writable output folder"):
            RunFolder(ro / "sub", mode="new")
    finally:
        ro.chmod(0o700)


def test_metrics_lines_and_tensorboard_events(tmp_path):
    run = RunFolder(tmp_path / "run", mode="new")
    run.append_metrics({"epoch": 1, "train_loss": 2.5, "test_accuracy": 0.1, "note": "x", "ok": True})
    run.append_metrics({"epoch": 2, "train_loss": 1.5, "test_accuracy": 0.4, "images": 50000})
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]
    assert run.read_metrics()[1] == {"epoch": 2, "train_loss": 1.5, "test_accuracy": 0.4, "images": 50000}
    run.close()
    run.close()                                         # idempotent
    events = list((run.path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run.path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {"train_loss", "test_accuracy", "images"}
    loss = acc.Scalars("train_loss")
    assert [(e.step, e.value) for e in loss] == [(1, 2.5), (2, 1.5)]


def test_metrics_need_epoch(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    with pytest.raises(ValueError, match="integer 'epoch'"):
        run.append_metrics({"loss": 1.0})


def test_truncated_last_line_is_ignored_and_next_append_is_clean(tmp_path, caplog):
    run = RunFolder(tmp_path, mode="new")
    run.append_metrics({"epoch": 1, "loss": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "lo')                      # crash mid-write
    with caplog.at_level(logging.WARNING, logger="attncnn.runs.folder"):
        assert run.read_metrics() == [{"epoch": 1, "loss": 1.0}]
    assert "line 2" in caplog.text
    run.append_metrics({"epoch": 2, "loss": 0.5})
    assert run.read_metrics() == [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]
    run.close()


def test_read_metrics_without_file(tmp_path):
    assert RunFolder(tmp_path, mode="read").read_metrics() == []


def test_config_is_atomic_json(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    run.write_config({"b": 2, "a": [1, 2]})
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": [1, 2], "b": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "config.json"]
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(RunFolderError, match="config.json"):
        run.read_config()


def _save_periodic(run, epoch, keep, calls=None):
    """A periodic save as the saver does it: path, write, prune."""
    path = run.periodic_path(epoch)
    if calls is not None:
        calls.append(path.name)
    path.write_bytes(b"ckpt")
    run.prune_periodic(keep)
    return path


def test_checkpoint_path_names(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    assert run.checkpoint_path("epoch_0010") == tmp_path / "checkpoints" / "epoch_0010.safetensors"
    assert (tmp_path / "checkpoints").is_dir()
    for bad in ("", "a/b", "..", "a\\b"):
        with pytest.raises(ValueError):
            run.checkpoint_path(bad)


def test_periodic_path_names_the_epoch_with_at_least_four_digits(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    assert run.periodic_path(7) == tmp_path / "checkpoints" / "epoch_0007.safetensors"
    assert run.periodic_path(12345).name == "epoch_12345.safetensors"
    assert not run.periodic_path(7).exists()                          # a path, nothing written
    for epoch in (7, 300, 12345):
        run.periodic_path(epoch).write_bytes(b"x")
    assert [e for e, _ in run.periodic_checkpoints()] == [7, 300, 12345]   # the number reads back


def test_periodic_saves_keep_the_last_n_deleting_the_oldest_first(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    calls = []
    kept_after = []
    for epoch in (10, 20, 30, 40, 50):
        p = _save_periodic(run, epoch, keep=3, calls=calls)
        assert p.name == f"epoch_{epoch:04d}.safetensors" and p.exists()
        kept_after.append(sorted(x.name for x in (tmp_path / "checkpoints").iterdir()))
    assert calls == [f"epoch_{e:04d}.safetensors" for e in (10, 20, 30, 40, 50)]
    assert kept_after[2] == ["epoch_0010.safetensors", "epoch_0020.safetensors", "epoch_0030.safetensors"]
    assert kept_after[3] == ["epoch_0020.safetensors", "epoch_0030.safetensors", "epoch_0040.safetensors"]
    assert kept_after[4] == ["epoch_0030.safetensors", "epoch_0040.safetensors", "epoch_0050.safetensors"]


def test_periodic_saves_order_by_epoch_number_and_spare_other_files(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    run.checkpoint_path("best").write_bytes(b"b")
    run.checkpoint_path("last").write_bytes(b"l")
    for epoch in (9999, 10000, 5):                       # 10000 > 9999 although "1..." < "9..."
        _save_periodic(run, epoch, keep=0)              # keep all
    assert len(run.periodic_checkpoints()) == 3
    _save_periodic(run, 10001, keep=2)
    names = sorted(x.name for x in (tmp_path / "checkpoints").iterdir())
    assert names == ["best.safetensors", "epoch_10000.safetensors", "epoch_10001.safetensors",
                     "last.safetensors"]


@pytest.mark.parametrize("keep, left", [(0, [1, 2, 3, 4]), (1, [4]), (3, [2, 3, 4]), (4, [1, 2, 3, 4]),
                                        (9, [1, 2, 3, 4])])
def test_prune_periodic_leaves_the_newest_keep(tmp_path, keep, left):
    run = RunFolder(tmp_path, mode="new")
    for epoch in (3, 1, 4, 2):
        run.periodic_path(epoch).write_bytes(b"x")
    run.checkpoint_path("last").write_bytes(b"l")
    deleted = run.prune_periodic(keep)
    assert [e for e, _ in run.periodic_checkpoints()] == left
    assert deleted == [run.periodic_path(e) for e in (1, 2, 3, 4) if e not in left]      # oldest first
    assert run.checkpoint_path("last").exists()
    assert run.prune_periodic(keep) == []                              # nothing more to do


def test_prune_periodic_without_checkpoints_and_in_a_read_only_folder(tmp_path):
    run = RunFolder(tmp_path / "run", mode="new")
    assert run.prune_periodic(1) == []                                 # no checkpoints/ folder yet
    run.periodic_path(1).write_bytes(b"x")
    run.periodic_path(2).write_bytes(b"x")
    reader = RunFolder(tmp_path / "run", mode="read")
    with pytest.raises(RunFolderError, match="opened read-only; cannot delete old periodic checkpoints"):
        reader.prune_periodic(1)
    assert len(run.periodic_checkpoints()) == 2


def test_latest_checkpoint(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    assert run.latest_checkpoint() is None
    _save_periodic(run, 1, keep=0)
    _save_periodic(run, 2, keep=0)
    assert run.latest_checkpoint().name == "epoch_0002.safetensors"
    run.checkpoint_path("last").write_bytes(b"x")
    assert run.latest_checkpoint().name == "last.safetensors"


def test_mark_finished(tmp_path):
    run = RunFolder(tmp_path, mode="new")
    assert not run.finished
    run.mark_finished({"best": {"accuracy": 0.9, "epoch": 3}, "loss": float("nan")})
    assert run.finished
    data = json.loads((tmp_path / "finished.json").read_text())   # strict JSON: NaN became null
    assert data == {"best": {"accuracy": 0.9, "epoch": 3}, "loss": None}
    assert RunFolder(tmp_path, mode="read").finished


def test_context_manager_closes_writer(tmp_path):
    with RunFolder(tmp_path, mode="new") as run:
        run.append_metrics({"epoch": 1, "x": 1.0})
        assert run._writer is not None
    assert run._writer is None


def test_unwritable_folder_simulated(tmp_path, monkeypatch):
    # Works as root too: simulate the EACCES a read-only folder gives an ordinary user.
    import tempfile

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(RunFolderError, match=rf"{tmp_path}.*Permission denied; choose a writable output folder"):
        RunFolder(tmp_path, mode="new")


def test_probes_at_the_same_moment_do_not_refuse_each_other(tmp_path):
    # The ranks of one torchrun job probe the folder together (a CI run once failed so: rank 0 took
    # rank 1's probe for a trainer). A probe holds a shared lock and rewrites nothing.
    RunFolder(tmp_path / "run", mode="new").close()
    lock = tmp_path / "run" / ".lock"
    line = lock.read_text()
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)           # another process's probe, in progress
        RunFolder.check_not_in_use(tmp_path / "run")
    finally:
        os.close(fd)
    assert lock.read_text() == line


def test_a_writing_folder_is_locked_until_closed(tmp_path):
    first = RunFolder(tmp_path / "run", mode="new")
    first.write_config({"a": 1})
    for mode in ("resume", "overwrite"):
        with pytest.raises(RunFolderError, match=rf"{tmp_path / 'run'} is in use: attncnn pid {os.getpid()} on host"):
            RunFolder(tmp_path / "run", mode=mode)
    with pytest.raises(RunFolderError, match="is in use"):
        RunFolder.check_not_in_use(tmp_path / "run")
    assert RunFolder(tmp_path / "run", mode="read").read_config() == {"a": 1}     # readers take no lock
    first.close()
    RunFolder.check_not_in_use(tmp_path / "run")
    with RunFolder(tmp_path / "run", mode="overwrite") as again:
        assert [p.name for p in again.path.iterdir()] == [".lock"]               # the lock file survives
    RunFolder(tmp_path / "run", mode="new").close()                               # only a lock: empty


def test_a_second_start_on_a_folder_another_process_just_began_is_told_it_is_in_use(tmp_path):
    """Two trains started at the same instant: the loser finds the winner's first files. It is told
    which process holds the folder, not to --resume it (which the lock would refuse in turn)."""
    run = tmp_path / "run"
    code = ("import sys\nfrom attncnn.runs.folder import RunFolder\n"
            "folder = RunFolder(sys.argv[1], mode='new')\nfolder.write_config({'lr': 0.1})\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    winner = subprocess.Popen([sys.executable, "-c", code, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert winner.stdout.readline().strip() == "ready"
        for mode in ("new", "resume"):
            with pytest.raises(RunFolderError) as err:
                RunFolder(run, mode=mode)
            message = str(err.value)
            assert f"{run} is in use: attncnn pid {winner.pid} on host " in message and "--resume" not in message
    finally:
        winner.communicate("", timeout=60)
    RunFolder(run, mode="resume").close()                      # once it has ended, the advice holds


def test_a_lock_taken_an_instant_ago_is_named_once_its_holder_has_written_its_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    late = threading.Timer(0.2, lambda: os.write(fd, b"attncnn pid 4242 on host elsewhere\n"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)          # taken, its line not yet written
        late.start()
        with pytest.raises(RunFolderError, match="is in use: attncnn pid 4242 on host elsewhere is training in it"):
            RunFolder(run, mode="new")
    finally:
        late.cancel()
        late.join()
        os.close(fd)
