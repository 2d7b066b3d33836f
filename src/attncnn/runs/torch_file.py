"""Files in PyTorch's own format (``torch.save``), for exchange with code that writes and reads them.

attncnn keeps its own checkpoints in safetensors (:mod:`attncnn.runs.checkpoint`); these two
functions exist for other programs' files, such as the reference code's ``*.checkpoint`` files
(``{"epoch", "test_accuracy", "model_state_dict"}``, written by its ``train.py`` with
``torch.save``). Reading never unpickles arbitrary objects: :func:`torch.load` runs with
``weights_only=True``, which accepts tensors and plain Python values only. Writing is atomic, as
every file this package writes.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_path, make_folders
from ..errors import MissingFileError
from .checkpoint import CheckpointError

__all__ = ["read_torch_file", "write_torch_file"]


def read_torch_file(path: str | os.PathLike[str]) -> Any:
    """The object in a ``torch.save`` file, its tensors on the CPU whatever device they were saved
    from (``map_location="cpu"``: a file written on a GPU loads on a machine without one).

    Raises:
        MissingFileError: no file at ``path``.
        CheckpointError: a file that is not a readable PyTorch file (truncated, corrupt, another
            format), or one holding objects other than tensors and plain values, which
            ``weights_only`` refuses (the message names the file and says which).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no file at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    with open(path, "rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive (PyTorch >= 1.6) or, in the legacy format, a pickle whose
    # first opcode is PROTO (0x80); anything else is another kind of file, whatever torch.load says
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise CheckpointError(f"{path} is not a readable PyTorch file (it does not start as torch.save's zip "
                              f"archive or pickle does, but with {head!r}); check that it is the checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" in str(err).lower():
            first = str(err).strip().splitlines()[-1].strip() if str(err).strip() else ""
            raise CheckpointError(
                f"{path} holds objects other than tensors and plain Python values ({first[:200]}); attncnn loads "
                "such files with torch.load(weights_only=True) and never unpickles arbitrary objects. Save the "
                "state dict itself (tensors, numbers, strings) and convert that file") from err
        raise CheckpointError(f"{path} is not a readable PyTorch file ({err}); it may be truncated or of "
                              "another format") from err
    except Exception as err:        # torch raises RuntimeError, KeyError, EOFError... for bad bytes
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} is not a readable PyTorch file ({type(err).__name__}: {reason}); it may be "
                              "truncated (an interrupted copy) or of another format: copy it again") from err


def write_torch_file(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` (tensors and plain Python values) with :func:`torch.save`, atomically: a
    failure leaves any previous file at ``path`` intact and no temporary file behind. Tensors are
    written from the CPU.

    Raises:
        OutputError (an OSError): the folder is not writable or the disk is full (names ``path``).
    """
    path = Path(path)
    make_folders(path.parent)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
