"""The error a run folder raises when it cannot be used as asked."""

from __future__ import annotations

__all__ = ["RunFolderError"]

class RunFolderError(Exception):
    """The run folder cannot be used in the requested mode (the message names the path and the fix)."""
