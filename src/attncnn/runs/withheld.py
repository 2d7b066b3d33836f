"""A finished run shipped without its weights: ``weights-withheld.json`` where ``checkpoints/`` was.

A clone carries its trained models in ``results/`` and must stay lean; a model too large for that
(the paper-width content model: 29.5 M parameters, 59 MB even in bfloat16) can ship its records
alone: ``config.json``, ``metrics.jsonl`` (every epoch's accuracy; position-only models' attention
metrics too), ``finished.json``, ``machine.json`` and ``predictions.json`` (what the weights
predicted for each test image, recorded before they were withheld), with this file in place of the
checkpoints (which move to a folder outside the committed tree: :func:`withhold_weights`). It says
which file the weights were (path in the folder, bytes, sha256 of the file, dtype), holds the
checkpoint's metadata (architecture, model options, epoch, data set), and gives the command that
trains the run again.

Every command that needs the weights (``evaluate``, ``inspect``, ``plot``, ``viewer``, ``prune``,
:func:`attncnn.pretrained`) refuses such a run with :func:`withheld_message`; reports read what
they need from the records (:func:`attncnn.analysis.runs.open_run` with ``withheld=True``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from .._io import atomic_write_json
from ..errors import InputError, MissingFileError
from .checkpoint import read_metadata
from .errors import RunFolderError
from .folder import RunFolder
from .predictions import PREDICTIONS_FILE

__all__ = ["WITHHELD_FILE", "withhold_weights", "read_withheld", "withheld_message"]

#: in a finished run folder shipped without ``checkpoints/``: what the weights were
WITHHELD_FILE = "weights-withheld.json"
_KEYS = {"file": str, "bytes": int, "sha256": str, "weights_dtype": str, "metadata": dict, "retrain": str}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def withhold_weights(folder: str | Path, *, retrain: str, move_to: str | Path, extra: dict | None = None) -> dict:
    """Ship the finished run ``folder`` without its weights: write :data:`WITHHELD_FILE` (about
    ``checkpoints/last.safetensors``), then move ``checkpoints/`` to ``move_to`` (nothing is
    deleted: the weights stay on this machine, outside what is committed). A folder already
    withheld is left as it is.

    Args:
        folder: a finished run folder with its ``last`` checkpoint and its prediction record.
        retrain: the command that trains the run again (shown wherever the weights are asked for).
        move_to: the folder ``checkpoints/`` becomes (it must not exist yet; its parents are made).
        extra: more of what the weights gave, kept in the record for reports that cannot measure it
            again (e.g. ``{"final_layers": [...]}``, the attention per layer); its keys must not be
            the record's own.

    Returns:
        The record written (or the one already there).

    Raises:
        InputError: an unfinished run (its checkpoint is needed to resume), or one without a
            prediction record (without the weights nothing could check its accuracy again; the
            message gives the command that records it), an empty ``retrain``, an ``extra`` key
            that is one of the record's own, or a ``move_to`` that exists.
        FileNotFoundError: no ``last`` checkpoint and no record of one.
    """
    folder, move_to = Path(folder), Path(move_to)
    if not retrain.strip():
        raise InputError("say how the withheld weights can be trained again (retrain=...): a run shipped without "
                         "its weights must name the command that makes them")
    clash = sorted(set(extra or {}) & set(_KEYS))
    if clash:
        raise InputError(f"extra keys {clash} are the record's own ({', '.join(_KEYS)}); name them otherwise")
    existing = read_withheld(folder)
    if existing is not None and not (folder / "checkpoints").exists():
        return existing
    run = RunFolder(folder, mode="read")
    if not run.finished:
        raise InputError(f"{folder} is not finished; only a finished run ships without its weights (an unfinished "
                         "one needs its checkpoint to resume)")
    last = run.checkpoint_path("last")
    if not last.is_file():
        raise MissingFileError(f"{folder} holds no checkpoints/{last.name} to withhold")
    if not (folder / PREDICTIONS_FILE).is_file():
        raise InputError(f"{folder} has no {PREDICTIONS_FILE}: record what its weights predict before withholding "
                         f"them (attncnn evaluate {folder} --data <its data set> --predictions "
                         f"{folder / PREDICTIONS_FILE})")
    if move_to.exists():
        raise InputError(f"{move_to} exists; the weights of {folder} go to a new folder (remove it or name another)")
    metadata = read_metadata(last)
    record = {"file": last.relative_to(folder).as_posix(), "bytes": last.stat().st_size, "sha256": _sha256(last),
              "weights_dtype": str(metadata.get("weights_dtype") or "float32"), "metadata": metadata,
              "retrain": retrain.strip(), **(extra or {})}
    # the record first: a move cut short leaves both, and the weights still load (the record only
    # speaks where the checkpoint is missing); the same call again finishes the move
    atomic_write_json(folder / WITHHELD_FILE, record)
    move_to.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(folder / "checkpoints"), str(move_to))
    return record


def read_withheld(folder: str | Path) -> dict | None:
    """The :data:`WITHHELD_FILE` record of ``folder`` (None: there is none).

    Raises:
        RunFolderError: the file is not such a record (the key at fault named).
    """
    path = Path(folder) / WITHHELD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunFolderError(f"{path} is unreadable ({err}); restore it from the repository") from err
    if not isinstance(record, dict):
        raise RunFolderError(f"{path} is not a JSON object; restore it from the repository")
    for key, kind in _KEYS.items():
        if not isinstance(record.get(key), kind):
            raise RunFolderError(f"{path}: {key!r} should be a {kind.__name__}, found {record.get(key)!r}; restore "
                                 "the file from the repository")
    return record


def withheld_message(folder: str | Path, record: dict) -> str:
    """What a command says when asked for the weights of a run shipped without them."""
    return (f"{folder} was shipped without its weights ({record['file']}: {record['bytes'] / 1e6:.1f} MB of "
            f"{record['weights_dtype']}, sha256 {record['sha256'][:16]}...; {WITHHELD_FILE} says so): its records "
            f"are there (config, metrics, accuracy, {PREDICTIONS_FILE}), its weights are not"
            + (f" ({record['weights_note']})" if isinstance(record.get("weights_note"), str) else "")
            + f". To train it again: {record['retrain']}")
