"""Files in PyTorch's own format (``torch.save``), for exchange with other programs, such as the
reference code's ``*.checkpoint`` files (``{"epoch", "test_accuracy", "model_state_dict"}``).

Reading never unpickles arbitrary objects (:func:`torch.load` with ``weights_only=True``); writing
is atomic. A tensor in such a file is a view of a storage and may declare far more values than the
file holds (a stride-0 view of one number as a huge matrix): :func:`read_torch_file` refuses, from
the declared shapes and strides alone, any overlapping view and a file whose tensors declare more
than twice the bytes of its storages.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Iterator

import torch

from .._io import atomic_path, make_folders
from ..errors import MissingFileError
from .checkpoint import CheckpointError

__all__ = ["read_torch_file", "write_torch_file"]

#: how many times the bytes of a file's storages its tensors may declare in all (tied weights share
#: a storage; a file that repeats one storage a thousand times is refused)
_MAX_SHARING = 2
#: declared bytes always allowed on top (small files of many tiny shared tensors)
_SLACK_BYTES = 1 << 20


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
        raise MissingFileError(f"no file at {path}" + (" (it is a folder)" if path.is_dir() else
                                                        " (it is not a regular file)" if path.exists() else ""))
    with open(path, "rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive (PyTorch >= 1.6) or, in the legacy format, a pickle whose
    # first opcode is PROTO (0x80); anything else is another kind of file, whatever torch.load says
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise CheckpointError(f"{path} is not a readable PyTorch file (it does not start as torch.save's zip "
                              f"archive or pickle does, but with {head!r}); check that it is the checkpoint")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
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
    _check_stored(path, payload)
    return payload


def _tensors(obj: Any, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` (nested dicts, lists and tuples) with its key path (``a.b.0``)."""
    if isinstance(obj, torch.Tensor):
        yield name or "the tensor", obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _tensors(value, f"{name}.{key}" if name else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _tensors(value, f"{name}.{i}" if name else str(i))


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two indices of ``t`` reach one stored value (a stride-0 or otherwise overlapping view),
    judged from its sizes and strides: every stored tensor of a model (transposed ones too) passes."""
    dims = sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    reach = 1                 # values a view over the dims so far spans
    for stride, size in dims:
        if stride < reach:
            return True
        reach = stride * size
    return False


def _check_stored(path: Path, payload: Any) -> None:
    """Refuse tensors that declare values the file does not hold (see the module's description),
    from shapes and strides alone: nothing is copied or allocated here.

    Raises:
        CheckpointError: naming the file, the tensor, its shape and strides, and the sizes.
    """
    declared, storages = 0, {}
    for name, t in _tensors(payload):
        if t.numel() == 0:
            continue
        if _overlaps(t):
            raise CheckpointError(
                f"{path}: tensor {name} declares shape {tuple(t.shape)} with strides {tuple(t.stride())}, a view "
                f"that repeats its stored values ({t.untyped_storage().nbytes():,} bytes stored, "
                f"{t.numel() * t.element_size():,} declared); a saved model stores every value, so this file is "
                "refused before anything is expanded. Save the state dict of the model itself")
        declared += t.numel() * t.element_size()
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    stored = sum(storages.values())
    if declared > _MAX_SHARING * stored + _SLACK_BYTES:
        raise CheckpointError(
            f"{path}: its tensors declare {declared:,} bytes but the file stores {stored:,}: they share storages "
            f"more than {_MAX_SHARING} times over, which a saved model does not; refused before anything is "
            "expanded. Save the state dict of the model itself")


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
