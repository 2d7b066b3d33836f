"""MainProcessRunFolder: rank 0 writes the run folder, the other ranks only read and wait.

The ranks are played in one process: a :class:`Distributed` whose agreement collective answers
"rank 0 succeeded" stands in for the process group (the real two-process job is in
test_distributed.py).
"""

from __future__ import annotations

import errno

import pytest

from attncnn.runs.folder import RunFolder, RunFolderError
from attncnn.runs.main_process_folder import MainProcessRunFolder
from attncnn.training.distributed import Distributed


class _Rank(Distributed):
    """One rank of a two-process job in which rank 0's writes succeed."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank=rank, world_size=2)

    def max_int(self, value: int) -> int:
        return int(value)


def _periodic_save(run: MainProcessRunFolder, epoch: int, keep: int, written: list) -> None:
    """What Saver.save_periodic does, with a writer that records who wrote."""
    path = run.periodic_path(epoch)
    run.write_checkpoint(path, lambda: (written.append(path.name), path.write_bytes(b"ckpt")))
    run.prune_periodic(keep)


def test_rank_0_writes_and_prunes_the_other_ranks_do_nothing(tmp_path):
    main = MainProcessRunFolder.open(tmp_path / "run", "new", _Rank(0))
    other = MainProcessRunFolder.open(tmp_path / "run", "new", _Rank(1))      # reads what rank 0 made
    on_main, on_other = [], []
    for epoch in (1, 2, 3):
        _periodic_save(main, epoch, 2, on_main)
        before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
        _periodic_save(other, epoch, 1, on_other)                               # would delete one more
        assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before
    assert on_main == ["epoch_0001.safetensors", "epoch_0002.safetensors", "epoch_0003.safetensors"]
    assert on_other == []
    assert other.periodic_path(3) == main.periodic_path(3)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "epoch_0002.safetensors", "epoch_0003.safetensors"]
    other.write_config({"preset": "demo"})
    assert not (tmp_path / "run" / "config.json").exists()
    main.close()
    other.close()


def test_one_process_is_the_plain_run_folder(tmp_path):
    run = MainProcessRunFolder.open(tmp_path / "run", "new", Distributed())
    written = []
    for epoch in (1, 2, 3):
        _periodic_save(run, epoch, 1, written)
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["epoch_0003.safetensors"]
    assert run.latest_checkpoint() == run.periodic_path(3)
    run.close()


def test_a_failed_write_on_rank_0_is_raised_there_and_named_on_the_others(tmp_path):
    class _Rank0Failed(_Rank):
        def max_int(self, value: int) -> int:
            return 1                                   # rank 0 reported a failure

    def full_disk() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    main = MainProcessRunFolder.open(tmp_path / "run", "new", _Rank(0))
    with pytest.raises(RunFolderError, match="cannot write .*epoch_0001.safetensors \\(No space left on device\\)"):
        main.write_checkpoint(main.periodic_path(1), full_disk)
    other = MainProcessRunFolder(RunFolder(tmp_path / "run", mode="read"), _Rank0Failed(1))
    with pytest.raises(RunFolderError, match="rank 0 failed to delete old periodic checkpoints .*; rank 1 stops"):
        other.prune_periodic(1)
    main.close()
