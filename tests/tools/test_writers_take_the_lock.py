"""Every command that writes a run folder refuses one that a live training holds (its ``.lock``):
``convert-reference --overwrite`` (tests/reference), trimming and sharing a run for ``results/``
here, as ``train --overwrite`` and ``--resume`` do."""

from __future__ import annotations

import json

import pytest

from trim import share_run_folder, trim_run

from attncnn.runs import RunFolderError
from attncnn.runs.lock import RunLock


def _finished_run(folder):
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"preset": "demo", "seed": 0, "data": "/somewhere/data.zip"}))
    (folder / "finished.json").write_text(json.dumps({"preset": "demo", "dataset": "/somewhere/data.zip"}))
    (folder / "tb").mkdir()
    return folder


@pytest.mark.parametrize("writer", ["trim", "share"])
def test_a_held_run_folder_is_refused_and_left_as_it_was(tmp_path, writer):
    run = _finished_run(tmp_path / "run")
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    training = RunLock.take(run)              # a process training in it (flock: per open file)
    try:
        with pytest.raises(RunFolderError, match=r"run folder .*run is in use: attncnn pid \d+ on host"):
            if writer == "trim":
                trim_run(run, keep_epochs=False)
            else:
                share_run_folder(run)
    finally:
        training.release()
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.name != ".lock") == before
    assert "/somewhere" in (run / "config.json").read_text()


def test_a_trim_leaves_no_lock_file_in_a_folder_for_results(tmp_path):
    run = _finished_run(tmp_path / "run")
    trim_run(run, keep_epochs=False)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json", "finished.json"]
    assert "/somewhere" not in (run / "config.json").read_text()
