"""The one rule for attncnn's per-user cache folder: :func:`user_cache_dir`.

Everything attncnn keeps for a user outside run folders and data folders (models fetched with
``attncnn download``, measurements of this machine) lives under this folder, so that one variable
moves or clears all of it. This module imports nothing from attncnn, so every package may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "user_cache_dir", "xdg_cache_folder"]

#: environment variable naming the cache folder
CACHE_ENV = "ATTNCNN_CACHE_DIR"


def xdg_cache_folder() -> Path:
    """``$XDG_CACHE_HOME/attncnn`` (the XDG base directory convention), else ``~/.cache/attncnn``:
    where attncnn's caches go when no variable of its own names a folder (also the data folder's
    default, :func:`attncnn.data.default_data_dir`). Only the path: nothing is created."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg).expanduser() / "attncnn" if xdg else Path.home() / ".cache" / "attncnn"


def user_cache_dir() -> Path:
    """``$ATTNCNN_CACHE_DIR`` if set, else :func:`xdg_cache_folder`. Only the path: nothing is created."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else xdg_cache_folder()
