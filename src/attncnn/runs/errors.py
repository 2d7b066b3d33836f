"""The error a run folder raises when it cannot be used as asked, and the sentence for a failed write."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import AttncnnError

__all__ = ["RunFolderError", "write_error_message"]


class RunFolderError(AttncnnError):
    """The run folder cannot be used in the requested mode (the message names the path and the fix)."""


_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def write_error_message(path: str | os.PathLike[str], err: OSError) -> str:
    """One sentence for a failed write of ``path``: what failed, why, and the fix (free space or another
    ``--out`` for a full disk; permissions or another ``--out`` otherwise), stating that the previous
    files are intact."""
    path = Path(path)
    reason = os.strerror(err.errno) if err.errno else str(err)
    if err.errno in _FULL:
        fix = (f"the disk holding {path.parent} is full: free some space there and continue with --resume, "
               "or start again with another --out folder")
    elif err.errno in _DENIED:
        fix = f"{path.parent} is not writable: fix its permissions or choose another --out folder"
    else:
        fix = "check the disk, or choose another --out folder"
    return f"cannot write {path} ({reason}); {fix}. The previous version of the file, if any, is intact"
