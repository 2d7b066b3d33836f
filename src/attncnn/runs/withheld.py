"""A finished run shipped without its weights: ``weights-withheld.json`` where ``checkpoints/`` was.

A model too large for a clone's ``results/`` ships its records alone (``config.json``,
``metrics.jsonl``, ``finished.json``, ``machine.json``, ``predictions.json``) with this file in
place of the checkpoints (written by the repository's ``tools/withhold.py``). It says which file
the weights were (path, bytes, sha256, dtype), holds the checkpoint's metadata, and gives the
command that trains the run again. Every command that needs the weights refuses such a run with
:func:`withheld_message`; reports read its records (:func:`attncnn.analysis.runs.open_run` with
``withheld=True``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import RunFolderError
from .predictions import PREDICTIONS_FILE

__all__ = ["WITHHELD_FILE", "KEYS", "read_withheld", "withheld_message"]

#: in a finished run folder shipped without ``checkpoints/``: what the weights were
WITHHELD_FILE = "weights-withheld.json"
#: the record's own keys and their types (a writer may add others, e.g. ``final_layers``)
KEYS = {"file": str, "bytes": int, "sha256": str, "weights_dtype": str, "metadata": dict, "retrain": str}


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
    for key, kind in KEYS.items():
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
