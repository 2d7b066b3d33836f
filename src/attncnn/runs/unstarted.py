"""A new run that stops before its first epoch ends leaves nothing behind: a folder holding only
``config.json`` would make the same command refuse it as "already exists", so
:func:`discard_if_unstarted` removes it.
"""

from __future__ import annotations

import contextlib
import logging

from .folder import RunFolder, empty_folder
from .lock import LOCK_FILE

__all__ = ["discard_if_unstarted"]

log = logging.getLogger(__name__)


def discard_if_unstarted(folder: RunFolder) -> bool:
    """Remove what a new run wrote in ``folder`` (opened ``"new"`` or ``"overwrite"``, its lock held)
    when it holds no checkpoint and no epoch record, and the folder itself where ``folder`` created
    it; then close ``folder``. Anything else is kept, and a folder opened to resume or read is never
    touched.

    Returns:
        True where the run's files were removed.
    """
    path, metrics = folder.path, folder.path / "metrics.jsonl"
    if folder.mode not in ("new", "overwrite") or not folder.locked \
            or folder.latest_checkpoint() is not None or (metrics.is_file() and metrics.stat().st_size > 0):
        return False
    empty_folder(path, ignore_errors=True)     # the lock stays held meanwhile: no other process takes the folder
    if folder.created:
        with contextlib.suppress(OSError):
            (path / LOCK_FILE).unlink()
            path.rmdir()
    folder.close()
    log.info("the run stopped before its first epoch ended: removed what it had written in %s (nothing to "
             "resume; run the same command again)", path)
    return True
