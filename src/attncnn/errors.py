"""The errors attncnn raises on purpose: one family, :class:`AttncnnError`, for everything a user can fix.

Each subclass also derives from the built-in exception its API documents, so ``except ValueError``
/ ``except FileNotFoundError`` / ``except OSError`` code keeps working:

- :class:`InputError` (a :class:`ValueError`): a bad option, argument, configuration or input;
- :class:`MissingFileError` (a :class:`FileNotFoundError`): a file or folder the user named is not there;
- :class:`OutputError` (an :class:`OSError`): a file or folder the user named cannot be written;
- ``attncnn.data.DataError``, ``attncnn.runs.RunFolderError``, ``attncnn.runs.CheckpointError`` and
  ``attncnn.training.TrainingError`` (a :class:`RuntimeError`) live beside the code that raises them.

The command line prints an ``AttncnnError`` as one line and exits with status 2. This module
imports nothing from attncnn.
"""

from __future__ import annotations

__all__ = ["AttncnnError", "InputError", "MissingFileError", "OutputError"]


class AttncnnError(Exception):
    """Base of every error attncnn raises on purpose: the message names the problem and the fix."""


class InputError(AttncnnError, ValueError):
    """A bad option, argument, configuration value or input that the user can fix."""


class MissingFileError(AttncnnError, FileNotFoundError):
    """A file or folder the user named (a run folder, a checkpoint, a trained model) is not there."""


class OutputError(AttncnnError, OSError):
    """A file or folder the user named cannot be written (not writable, a folder where a file goes)."""
