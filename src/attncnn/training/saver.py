"""Writing a run's checkpoints (``last``, ``best``, periodic) and saying what a failure left behind."""

from __future__ import annotations

import logging
import os
import shlex
import signal
from pathlib import Path

from ..runs.checkpoint import write_checkpoint
from ..runs.main_process_folder import MainProcessRunFolder
from .distributed import Distributed
from .errors import NonFiniteLossError, TrainingInterrupted
from .state import TrainState, position_text

__all__ = ["Saver", "resume_command"]

log = logging.getLogger(__name__)


def resume_command(run_path: Path, dist: Distributed, options: tuple[str, ...] = ()) -> str:
    """The shell command that continues the run in ``run_path`` (under torchrun when it ran there),
    with ``options``, the run-time flags this run was given."""
    command = shlex.join(["attncnn", "train", "--resume", str(run_path), *options])
    if not dist.enabled:
        return command
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size))
    command = f"torchrun --nproc_per_node {per_node} -m {command}"
    if per_node != dist.world_size:
        command += " (on every node, with this run's rendezvous options)"
    return command


class Saver:
    """Writes ``state``'s checkpoints into ``run`` and remembers the newest ``last`` one. Every process
    calls the same methods; rank 0 alone writes, atomically."""

    def __init__(self, run: MainProcessRunFolder, state: TrainState, repeat: tuple[str, ...] = ()) -> None:
        self.run, self.state = run, state
        #: options the resume command repeats (the run-time flags given: :meth:`RunOptions.flags`)
        self.repeat = tuple(repeat)
        #: ``(file, epoch, step)`` of the newest good ``last`` checkpoint, or None before the first
        self.last_good: tuple[Path, int, int] | None = None

    def _write(self, path: Path) -> None:
        checkpoint = self.state.to_checkpoint()
        self.run.write_checkpoint(path, lambda: write_checkpoint(path, checkpoint))

    def save(self, name: str = "last") -> Path:
        """Checkpoint the state now as ``checkpoints/<name>.safetensors``; returns the path."""
        path = self.run.checkpoint_path(name)
        self._write(path)
        if name == "last":
            self.last_good = (path, self.state.epoch, self.state.step)
        return path

    def save_periodic(self) -> Path:
        """Checkpoint the state as ``checkpoints/epoch_NNNN.safetensors`` (the epochs done), then delete
        the periodic checkpoints beyond the newest ``config.keep_checkpoints``; returns the path."""
        path = self.run.periodic_path(self.state.epoch)
        self._write(path)
        self.run.prune_periodic(self.state.config.keep_checkpoints)
        return path

    def interrupted(self, signum: int, where: str) -> TrainingInterrupted:
        """The error for a stop on ``signum`` at ``where``, after ``last`` was saved."""
        last = self.run.checkpoint_path("last")
        message = (f"interrupted by {signal.Signals(signum).name} at {where}; saved a resumable checkpoint {last}. "
                   f"Resume with: {resume_command(self.run.path, self.state.dist, self.repeat)}")
        # debug only: the caller reports the error (the command line prints it), a warning too doubled the line
        log.debug("%s", message)
        return TrainingInterrupted(message, signum=signum, checkpoint=last)

    def explain(self, err: NonFiniteLossError) -> NonFiniteLossError:
        """``err`` with what is left: nothing written after the failure, and the last good checkpoint."""
        kept = ("no checkpoint had been written yet, so nothing of a new run is kept" if self.last_good is None else
                f"the last good checkpoint is {self.last_good[0]} ({position_text(*self.last_good[1:])})")
        err.args = (f"{err.args[0]} Nothing was written after the failure; {kept}.",)
        return err

