"""Trimming finished run folders to what is worth committing (``python tools/ship.py FOLDER``).

A trimmed folder keeps ``config.json``, ``metrics.jsonl``, ``finished.json``, ``machine.json``,
``held_out.json`` (a sweep run's validation accuracy) and ``checkpoints/last.safetensors``, weights
only (``attncnn evaluate``, ``inspect``, ``plot``, ``viewer`` and ``train --init-from`` work on it
as on any run folder; the optimiser state, as large
again as the weights, only serves to resume, and a finished run is not resumed); ``best`` only when
it is another epoch than ``last``. Periodic checkpoints are kept, weights only, for the runs that
feed the figure of centres over epochs (paper Fig. 3), and deleted elsewhere. TensorBoard events
and the lock file go. A lean trim (the sample-efficiency grid's many cells) also drops ``best``.
Unfinished folders are never touched: they are still needed to resume.

A shipped folder must also work on other machines and say nothing about this one:
:func:`share_run_folder` (run by every trim) replaces the local paths a run records (its data set's
path and cache folder, an ``--init-from`` file) by file names, in ``config.json``,
``finished.json`` and every checkpoint's metadata. The data set stays identified by its name
and the digest of its decoded pixels (``dataset_name``); the checkpoints' tensors, and so their
sha256 digests, are unchanged. Commands given such a run without ``--data`` look for that file name
from the current folder, the run folder and the folders above it, and otherwise stop and ask for
``--data`` (:func:`attncnn.data.run_data`); they never use another data set.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from attncnn._io import atomic_write_json
from attncnn.errors import InputError
from attncnn.runs import PREDICTIONS_FILE, WITHHELD_FILE, RunFolder, is_data_name, load_checkpoint, write_checkpoint
from attncnn.runs.checkpoint import read_metadata
from attncnn.runs.lock import RunLock

log = logging.getLogger("tools.ship")

__all__ = ["trim_run", "folder_bytes", "share_run_folder", "share_run_folders", "shareable_config", "weights_only",
           "ABSOLUTE_PATH"]

#: an absolute path where JSON or a command line would put one (after a quote, a space, ``=``, ``(``):
#: a slash followed by at least one folder (``/home/me/x``), or a Windows drive (``C:\``)
ABSOLUTE_PATH = re.compile(r"""(?:^|(?<=[\s"'`(=,\[]))(?:/(?:[\w.+-]+/)+[\w.+-]*|[A-Za-z]:\\)""", re.M)

#: held_out.json: a sweep run's validation accuracy (:mod:`attncnn.reproduce.running.measurements`),
#: measured once; predictions.json: a shipped model's per-image test predictions
#: (:mod:`attncnn.runs.predictions`), recorded once;
#: weights-withheld.json: what the weights of a run shipped without them were (:mod:`withhold`)
_KEEP_FILES = {"config.json", "metrics.jsonl", "finished.json", "machine.json", "held_out.json", PREDICTIONS_FILE,
               WITHHELD_FILE}


def folder_bytes(path: str | Path) -> int:
    """Total size of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def weights_only(path: Path) -> None:
    """Rewrite a checkpoint without its optimiser state (about half the size; not resumable)."""
    ckpt = load_checkpoint(path)
    if ckpt.optimizer_state is not None:
        ckpt.optimizer_state = None
        write_checkpoint(path, ckpt)


def trim_run(folder: str | Path, *, keep_epochs: bool, lean: bool = False) -> tuple[int, int]:
    """Trim one finished run folder in place; returns its size in bytes before and after.

    Args:
        keep_epochs: keep the periodic checkpoints (weights only) instead of deleting them.
        lean: keep ``last`` alone, never ``best`` (a grid of many cells reports the last epoch).

    Raises:
        InputError: the run is not finished (its folder is needed to resume).
        RunFolderError: a process is training in the folder (its lock is held).
    """
    folder = Path(folder)
    run = RunFolder(folder, mode="read")
    if not run.finished:
        raise InputError(f"{folder} is not finished; only finished runs are trimmed (the rest resume)")
    # the folder's lock, as every writer of a run folder takes it: a process training there is refused
    # (RunFolderError naming it); its file goes with the rest, the lock held until the trim ends
    lock = RunLock.take(folder)
    try:
        return _trim(folder, run, keep_epochs, lean)
    finally:
        lock.release()


def _trim(folder: Path, run: RunFolder, keep_epochs: bool, lean: bool) -> tuple[int, int]:
    before = folder_bytes(folder)
    for entry in folder.iterdir():
        if entry.is_dir() and entry.name != "checkpoints":
            shutil.rmtree(entry)
        elif entry.is_file() and entry.name not in _KEEP_FILES:
            entry.unlink()
    last, best = run.checkpoint_path("last"), run.checkpoint_path("best")
    same = best.exists() and last.exists() and read_metadata(best).get("epoch") == read_metadata(last).get("epoch")
    if best.exists() and (same or lean):
        best.unlink()                                    # the same weights twice, or not wanted
    for kept in (last, best):
        if kept.exists():
            weights_only(kept)
    for _, path in run.periodic_checkpoints():
        if keep_epochs:
            weights_only(path)
        else:
            path.unlink()
    share_run_folder(folder)
    after = folder_bytes(folder)
    log.info("trimmed %s: %.1f MB -> %.1f MB", folder, before / 1e6, after / 1e6)
    return before, after


def shareable_config(config: dict) -> dict:
    """A run's training configuration without local paths: ``data`` as its file name (``cifar10``
    and ``cifar100`` kept), ``data_dir`` None, ``init_from`` as its file name."""
    out = dict(config)
    data = out.get("data")
    if isinstance(data, str) and not is_data_name(data):
        out["data"] = Path(data).name
    if out.get("data_dir") is not None:
        out["data_dir"] = None
    if isinstance(out.get("init_from"), str):
        out["init_from"] = Path(out["init_from"]).name
    return out


def _local_paths(config: dict) -> dict[str, str]:
    """``{path as recorded (and resolved): file name}`` for the paths in a run's configuration."""
    found: dict[str, str] = {}
    for key in ("data", "data_dir", "init_from"):
        value = config.get(key)
        if not isinstance(value, str) or is_data_name(value) or Path(value).name == value:
            continue                                     # a name, not a path
        for form in {value, str(Path(value).expanduser().resolve())}:
            found[form] = Path(value).name
    return found


def _replaced(value: Any, paths: dict[str, str]) -> Any:
    """``value`` (JSON) with every occurrence of a key of ``paths`` replaced by its name, longest first."""
    if isinstance(value, str):
        for old in sorted(paths, key=len, reverse=True):
            value = value.replace(old, paths[old])
        return value
    if isinstance(value, list):
        return [_replaced(v, paths) for v in value]
    if isinstance(value, dict):
        return {k: _replaced(v, paths) for k, v in value.items()}
    return value


def _shared(meta: dict, paths: dict[str, str]) -> dict:
    out = _replaced(meta, paths)
    if isinstance(out.get("config"), dict):
        out["config"] = shareable_config(out["config"])
    return out


def share_run_folder(folder: str | Path, *, unfinished: bool = False) -> list[Path]:
    """Remove the local paths a finished run folder records, so that it can be committed and
    shared (``results/``): see the module's description. Safe to run again (then nothing changes).

    Args:
        folder: a finished run folder (``config.json`` and ``finished.json``).
        unfinished: accept a run without ``finished.json`` too (an unfinished run shipped to be
            resumed elsewhere, :func:`unfinished.ship_unfinished`: the resume
            is then told where its data set is).

    Returns:
        The files rewritten (atomically, through the project's own writers).

    Raises:
        InputError: the folder is not a finished run (its paths are still needed to resume; not
            raised with ``unfinished`` for a folder with ``config.json``), or an absolute path would
            remain in one of its files (named, with the path); nothing is written then.
        RunFolderError: a process is training in the folder (its lock is held); nothing is written.
    """
    folder = Path(folder)
    RunFolder.check_not_in_use(folder)          # a process training there: refused, nothing written
    run = RunFolder(folder, mode="read")
    if not (folder / "config.json").is_file() or not (run.finished or unfinished):
        raise InputError(f"{folder} is not a finished run folder (config.json and finished.json); only finished "
                         "runs are shared, the others still need their paths to resume")
    config = run.read_config()
    checkpoints = {path: load_checkpoint(path) for path in sorted((folder / "checkpoints").glob("*.safetensors"))}
    paths = _local_paths(config)
    for ckpt in checkpoints.values():
        paths.update(_local_paths(ckpt.metadata.get("config") or {}))
    texts = {folder / "config.json": shareable_config(_replaced(config, paths))}
    if run.finished:
        texts[folder / "finished.json"] = _replaced(json.loads((folder / "finished.json").read_text()), paths)
    metas = {path: _shared(ckpt.metadata, paths) for path, ckpt in checkpoints.items()}
    for path, content in [*texts.items(), *metas.items()]:           # check everything, then write
        left = ABSOLUTE_PATH.findall(json.dumps(content))
        if left:
            raise InputError(f"{path} would still record the absolute path {left[0]!r}; remove it by hand "
                             "(nothing was written)")
    changed = []
    for path, content in texts.items():
        if content != json.loads(path.read_text()):
            atomic_write_json(path, content)
            changed.append(path)
    for path, meta in metas.items():
        if meta != checkpoints[path].metadata:
            checkpoints[path].metadata = meta
            write_checkpoint(path, checkpoints[path])       # same tensors, so the same digest
            changed.append(path)
    if changed:
        log.info("%s: local paths removed from %s", folder, ", ".join(p.name for p in changed))
    return changed


def share_run_folders(root: str | Path) -> list[Path]:
    """:func:`share_run_folder` on every finished run folder under ``root`` (``root`` included);
    unfinished ones are left as they are. Returns every file rewritten."""
    changed = []
    for config in sorted(Path(root).rglob("config.json")):
        if (config.parent / "finished.json").is_file():
            changed += share_run_folder(config.parent)
    return changed
