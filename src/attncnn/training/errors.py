"""The errors :func:`attncnn.training.train` raises on purpose: a run folder it cannot use, and why a
run stopped early.

The command line turns each into one line on stderr; :class:`TrainingInterrupted` also carries the
shell exit status (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import AttncnnError

__all__ = ["TrainingError", "NonFiniteLossError", "TrainingInterrupted"]




class TrainingError(AttncnnError, RuntimeError):
    """A run cannot go on (non-finite loss, inconsistent resume); the message says why and what to do."""


class NonFiniteLossError(TrainingError):
    """The training loss became NaN or infinite.

    Attributes:
        epoch: 0-based epoch of the first non-finite loss.
        batch_index: 0-based batch of that epoch (the step is ``batch_index + 1``).
        lr: learning rate of that step.
        loss: the loss value (``nan``, ``inf`` or ``-inf``).
    """

    def __init__(self, message: str, *, epoch: int, batch_index: int, lr: float, loss: float) -> None:
        super().__init__(message)
        self.epoch, self.batch_index, self.lr, self.loss = epoch, batch_index, lr, loss


class TrainingInterrupted(TrainingError):
    """SIGINT or SIGTERM stopped the run after a whole step and a resumable checkpoint was written.

    Attributes:
        signum: the signal received.
        checkpoint: the checkpoint to resume from.
        exit_status: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), the shell convention.
    """

    def __init__(self, message: str, *, signum: int, checkpoint: Path) -> None:
        super().__init__(message)
        self.signum, self.checkpoint = signum, checkpoint

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum)
