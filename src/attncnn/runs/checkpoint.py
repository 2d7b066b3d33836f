"""Single-file training checkpoints in safetensors format (never pickle; the reference code saves
``torch.save`` pickles, and loading a pickle can run arbitrary code):

* tensors ``model.<name>`` for ``model.state_dict()``;
* tensors ``optim.<param_index>.<state_key>`` for the optimizer's tensor state
  (e.g. SGD ``momentum_buffer``, Adam ``exp_avg``/``step``);
* tensors ``extra.<key>`` for caller tensors (e.g. RNG states as uint8 tensors);
* in the safetensors header metadata (string -> string): ``"format_version": "1"``,
  ``"attncnn"`` = the caller's metadata as JSON, ``"optimizer"`` = the optimizer's non-tensor
  state as JSON, ``"digest"`` = ``"sha256:<hex>"`` of every tensor's name, shape and bytes, and
  ``"header_digest"`` = ``"sha256:<hex>"`` of every other metadata entry and every tensor's dtype.

Files are written atomically. Loading verifies both digests, so a flipped bit anywhere is an error
naming the file. Files written before the header digest load with a note that their metadata is not
covered (before either digest: a warning that nothing is checked), once per file and process;
``python tools/checkpoint_upgrade.py`` (in a checkout) re-saves them with both digests.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_path, make_folders
from ..errors import AttncnnError

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "write_checkpoint", "load_checkpoint", "read_metadata",
           "tensor_specs", "FORMAT_VERSION"]

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_MODEL, _OPTIM, _EXTRA = "model.", "optim.", "extra."
# A safetensors header larger than this is treated as corruption (the format itself caps it at 100 MB).
_MAX_HEADER = 100_000_000


class CheckpointError(AttncnnError):
    """A file is not a readable attncnn checkpoint (pickle, truncated, corrupt or foreign)."""


@dataclass
class Checkpoint:
    """Contents of a checkpoint file.

    Attributes:
        model_state: ``model.state_dict()`` as saved (tensors on ``map_location``).
        optimizer_state: ``torch.optim.Optimizer.state_dict()``-format dict ready for
            ``optimizer.load_state_dict``, or ``None`` when no optimizer was saved.
        extra_tensors: the ``extra_tensors`` given to :func:`save_checkpoint`.
        metadata: the ``metadata`` dict given to :func:`save_checkpoint` (JSON round trip:
            tuples come back as lists, dict keys as strings).
    """

    model_state: dict[str, torch.Tensor]
    optimizer_state: dict | None
    extra_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    # clone() gives every tensor its own storage, so tied/aliased weights (which safetensors
    # refuses to save) are stored twice; contiguous_format makes the copy dense.
    return t.detach().to("cpu").clone(memory_format=torch.contiguous_format)


def _digest(entries) -> str:
    """``"sha256:<hex>"`` over ``(name, shape, raw bytes)`` entries taken in name order."""
    h = hashlib.sha256()
    for name, shape, data in sorted(entries, key=lambda e: e[0]):
        h.update(f"{name}\0{list(shape)}\0".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()


@functools.lru_cache(maxsize=None)
def _safetensors_dtype(dtype: torch.dtype) -> str:
    """The dtype name safetensors writes in a header for ``dtype`` (``"F32"``, ``"BF16"``...), learnt
    from safetensors itself, so that the digest computed before writing matches the written header."""
    from safetensors.torch import save

    raw = save({"t": torch.empty(0, dtype=dtype)})
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])["t"]["dtype"]


def _header_digest(metadata: dict[str, str], dtypes: dict[str, str]) -> str:
    """``"sha256:<hex>"`` over the header metadata (every entry but ``header_digest`` itself, the tensor
    digest included) and each tensor's safetensors dtype name."""
    covered = {key: value for key, value in metadata.items() if key != "header_digest"}
    text = json.dumps({"metadata": covered, "dtypes": dtypes}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes safetensors writes for a contiguous CPU tensor (little-endian, row-major)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _dumps(obj: Any, what: str) -> str:
    try:
        return json.dumps(obj, default=_json_default)
    except (TypeError, ValueError) as err:
        raise TypeError(f"checkpoint {what} must be JSON serialisable: {err}") from err


def save_checkpoint(path: str | os.PathLike[str], *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None,
                    extra_tensors: dict[str, torch.Tensor] | None = None,
                    metadata: dict | None = None) -> None:
    """Write ``model`` (+ optimizer, extra tensors, metadata) to one safetensors file atomically:
    :func:`write_checkpoint` of their state dicts.

    Args:
        path: destination file (conventionally ``*.safetensors``).
        model: its ``state_dict()`` is stored as contiguous CPU copies.
        optimizer: its ``state_dict()``: tensor state as tensors, the rest as JSON.
        extra_tensors: stored as ``extra.<key>``.
        metadata: any JSON-serialisable dict (config, epoch, metrics).

    Raises:
        as :func:`write_checkpoint`.
    """
    write_checkpoint(path, Checkpoint(model_state=model.state_dict(),
                                      optimizer_state=None if optimizer is None else optimizer.state_dict(),
                                      extra_tensors=dict(extra_tensors or {}), metadata=metadata or {}))


def write_checkpoint(path: str | os.PathLike[str], checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to one safetensors file atomically (the inverse of :func:`load_checkpoint`);
    the parent folder is created if needed.

    Raises:
        TypeError: a non-tensor entry in the model state or the extra tensors, or metadata /
            optimizer hyper-parameters that are not JSON serialisable.
        OSError: the folder is not writable or the disk is full (the message names ``path``; its
            ``errno`` is the system's, ENOSPC for a full disk).
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, value in checkpoint.model_state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"model state entry {name!r} is a {type(value).__name__}, not a tensor; "
                            "safetensors checkpoints hold tensors only")
        tensors[_MODEL + name] = _cpu_copy(value)
    for key, value in checkpoint.extra_tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"extra_tensors[{key!r}] is a {type(value).__name__}, not a tensor")
        tensors[_EXTRA + key] = _cpu_copy(value)

    header = {"format_version": FORMAT_VERSION, "attncnn": _dumps(checkpoint.metadata, "metadata")}
    if checkpoint.optimizer_state is not None:
        tensors.update(_optimizer_tensors(checkpoint.optimizer_state, header))
    header["digest"] = _digest((name, t.shape, _tensor_bytes(t)) for name, t in tensors.items())
    dtypes = {name: _safetensors_dtype(t.dtype) for name, t in tensors.items()}
    header["header_digest"] = _header_digest(header, dtypes)

    path = Path(path)
    make_folders(path.parent)
    with atomic_path(path, suffix=".safetensors") as tmp:
        try:
            save_file(tensors, str(tmp), metadata=header)
        except SafetensorError as err:
            # safetensors reports I/O failures (a full disk among them) as its own exception, not
            # OSError, so callers that turn OSError into "cannot write <file>; <fix>" missed them.
            raise _as_os_error(path, err) from err
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    log.debug("saved checkpoint %s (%d tensors)", path, len(tensors))


def _as_os_error(path: Path, err: Exception) -> OSError:
    """An :class:`OSError` naming ``path`` for a write error safetensors raised as its own
    exception, with the system's errno when its message carries one (``"... (os error 28)"``)."""
    found = re.search(r"os error (\d+)", str(err))
    code = int(found.group(1)) if found else errno.EIO
    return OSError(code, f"{os.strerror(code)} (while safetensors wrote the checkpoint)", str(path))


def _optimizer_tensors(opt: dict, header: dict) -> dict[str, torch.Tensor]:
    """An optimizer ``state_dict()`` split into tensors ``optim.<index>.<key>`` (returned) and its
    JSON part, the param groups and scalar state, stored as ``header["optimizer"]``."""
    tensors: dict[str, torch.Tensor] = {}
    scalar_state: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{_OPTIM}{int(index)}.{key}"] = _cpu_copy(value)
            else:
                scalar_state.setdefault(str(int(index)), {})[key] = value
    header["optimizer"] = _dumps({"param_groups": opt["param_groups"], "state": scalar_state},
                                 "optimizer hyper-parameters")
    return tensors


def _looks_like_pickle(head: bytes) -> bool:
    """``torch.save`` zip archive (``PK\\x03\\x04``) or a pickle stream starting with PROTO 2-5.

    Only consulted when the file is not a plausible safetensors file. A truncated safetensors file whose
    header-length bytes start with 0x80 is not mistaken for a pickle: its third byte is 0 (headers under
    64 KiB), a pickle's is an opcode.
    """
    if head[:4] == b"PK\x03\x04":
        return True
    return len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5 and head[2] != 0


def _read_header(path: Path) -> tuple[dict, int]:
    """Validate the safetensors framing without loading tensors; return the header JSON and the
    offset of the data section."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(9)
            n = struct.unpack("<Q", head[:8])[0] if len(head) >= 8 else 0
            plausible = len(head) == 9 and 0 < n <= min(_MAX_HEADER, size - 8) and head[8:9] == b"{"
            if not plausible and _looks_like_pickle(head):
                raise CheckpointError(
                    f"{path} is a pickle file; attncnn only loads safetensors checkpoints because "
                    "unpickling can run arbitrary code; if you trust the file, convert it yourself with "
                    "torch.load(weights_only=True) and attncnn.runs.save_checkpoint")
            if len(head) < 9:
                raise CheckpointError(f"{path} is not an attncnn checkpoint: only {size} bytes "
                                      "(truncated or empty file)")
            if not plausible:
                raise CheckpointError(f"{path} is not an attncnn checkpoint: not a safetensors file, or its "
                                      f"header is truncated/corrupt (header claims {n} bytes, file has {size})")
            f.seek(8)
            raw = f.read(n)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path} is not an attncnn checkpoint: corrupt safetensors header ({err})") from err
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError) as err:
            raise CheckpointError(f"{path}: corrupt safetensors entry {name!r}") from err
    if 8 + n + end > size:
        raise CheckpointError(f"{path} is truncated: tensor data needs {8 + n + end} bytes, file has {size}")
    return header, 8 + n


def tensor_specs(path: str | os.PathLike[str]) -> dict[str, tuple[str, list[int]]]:
    """``{name: (safetensors dtype, shape)}`` of a checkpoint's model tensors (``model.`` prefix
    removed), read from its header alone: no tensor data is loaded.

    Raises:
        FileNotFoundError, CheckpointError: as :func:`load_checkpoint`.
    """
    header, _ = _read_header(Path(path))
    return {name[len(_MODEL):]: (info.get("dtype"), list(info.get("shape", [])))
            for name, info in header.items() if name.startswith(_MODEL)}


def _verified_tensors(path: Path, header: dict, data_start: int, device: str) -> dict[str, torch.Tensor]:
    """The file's tensors on ``device``, after checking the stored digest (one read of the file)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    stored = (header.get("__metadata__") or {}).get("digest")
    if stored is None:
        _note_once(path, logging.WARNING, "%s has no content digest (written by an older attncnn): its integrity is "
                   "not checked")
    elif "header_digest" not in header["__metadata__"]:
        # INFO, not WARNING: the tensors are checked; only what is read beside them is not.
        _note_once(path, logging.INFO, "%s was written before checkpoints covered their metadata: its tensors are "
                   "checked against their digest, its metadata (epoch, step, recipe) is not; "
                   "python tools/checkpoint_upgrade.py PATH in a checkout of attncnn re-saves it with both")
    if stored is not None:
        view = memoryview(raw)
        try:
            actual = _digest((name, info["shape"], view[data_start + int(info["data_offsets"][0]):
                                                        data_start + int(info["data_offsets"][1])])
                             for name, info in header.items() if name != "__metadata__")
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: corrupt safetensors header ({err!r})") from err
        if actual != stored:
            raise CheckpointError(f"{path} is corrupt: its tensors do not match the digest stored when it was "
                                  "written (a changed byte on disk or in a copy); use another checkpoint of the "
                                  "run, or copy the file again")
    try:
        tensors = load(raw)
    except (SafetensorError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    return {name: t.to(device) for name, t in tensors.items()}


#: the older files :func:`_note_once` has spoken of in this process (resolved paths): once per file
_NOTED: set[str] = set()


def _note_once(path: Path, level: int, message: str) -> None:
    """Log ``message % path`` at ``level`` the first time this process reads the file at ``path``."""
    key = os.path.realpath(path)
    if key not in _NOTED:
        _NOTED.add(key)
        log.log(level, message, path)


def _check_header_digest(path: Path, header: dict) -> None:
    """Refuse a header whose metadata or tensor dtypes changed since the file was written (files
    without ``header_digest``, from older versions, pass: :func:`_verified_tensors` warns)."""
    meta = header.get("__metadata__") or {}
    stored = meta.get("header_digest")
    if stored is None:
        return
    try:
        dtypes = {name: str(info["dtype"]) for name, info in header.items() if name != "__metadata__"}
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: corrupt safetensors header ({err!r})") from err
    if _header_digest(meta, dtypes) != stored:
        raise CheckpointError(f"{path} is corrupt: its metadata (epoch, step, recipe, optimiser settings or tensor "
                              "types) does not match the digest stored when it was written (a changed byte on disk "
                              "or in a copy); use another checkpoint of the run, or copy the file again")


def _attncnn_metadata(path: Path, header: dict) -> tuple[dict, dict | None]:
    """``(caller metadata, optimizer JSON or None)`` from a safetensors header, after checking the
    header digest (:func:`_check_header_digest`)."""
    meta = header.get("__metadata__") or {}
    if meta.get("format_version") != FORMAT_VERSION or "attncnn" not in meta:
        raise CheckpointError(f"{path} is a safetensors file but not an attncnn checkpoint (format_version "
                              f"{meta.get('format_version')!r}, expected {FORMAT_VERSION!r})")
    _check_header_digest(path, header)
    try:
        return json.loads(meta["attncnn"]), (json.loads(meta["optimizer"]) if "optimizer" in meta else None)
    except ValueError as err:
        raise CheckpointError(f"{path}: corrupt attncnn metadata ({err})") from err


def read_metadata(path: str | os.PathLike[str]) -> dict:
    """The metadata given to :func:`save_checkpoint`, from the file's header alone (header digest
    checked; the tensor digest is checked when the tensors are loaded).

    Raises:
        FileNotFoundError, CheckpointError: as :func:`load_checkpoint`.
    """
    path = Path(path)
    return _attncnn_metadata(path, _read_header(path)[0])[0]


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; never unpickles anything.

    Args:
        path: the ``.safetensors`` file.
        map_location: device for the returned tensors (``"cpu"``, ``"cuda:0"``, ...).

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: a pickle / ``torch.save`` file (refused, not opened), a truncated or
            corrupt file (including tensors or metadata that no longer match the stored digests), or a
            safetensors file not written by attncnn; the message names the file.
    """
    path = Path(path)
    header, data_start = _read_header(path)
    metadata, optim_json = _attncnn_metadata(path, header)
    tensors = _verified_tensors(path, header, data_start, str(torch.device(map_location)))

    model_state: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    optim_tensors: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        if name.startswith(_MODEL):
            model_state[name[len(_MODEL):]] = tensor
        elif name.startswith(_EXTRA):
            extra[name[len(_EXTRA):]] = tensor
        elif name.startswith(_OPTIM):
            index, _, key = name[len(_OPTIM):].partition(".")
            if not index.isdigit() or not key:
                raise CheckpointError(f"{path}: malformed optimizer entry {name!r}")
            optim_tensors.setdefault(int(index), {})[key] = tensor
        else:
            raise CheckpointError(f"{path}: unexpected tensor {name!r}; not an attncnn checkpoint")

    optimizer_state = None
    if optim_json is not None:
        state: dict[int, dict[str, Any]] = {}
        for index, values in optim_json.get("state", {}).items():
            state.setdefault(int(index), {}).update(values)
        for index, values in optim_tensors.items():
            state.setdefault(index, {}).update(values)
        optimizer_state = {"state": dict(sorted(state.items())), "param_groups": optim_json["param_groups"]}
    elif optim_tensors:
        raise CheckpointError(f"{path}: optimizer tensors without optimizer hyper-parameters")
    return Checkpoint(model_state=model_state, optimizer_state=optimizer_state, extra_tensors=extra,
                      metadata=metadata)
