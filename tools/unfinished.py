"""Unfinished runs that travel: shipped for ``git add`` mid-way, resumed on another machine.

A long study outlives a working session. When work stops, ``python tools/ship.py results/<study>``
prepares the study's folder for committing: finished runs are trimmed (:mod:`trim`), and each
unfinished run folder is reduced by :func:`ship_unfinished` to what resuming needs:

* ``config.json``, ``metrics.jsonl`` (and ``machine.json`` if any);
* the newest resumable checkpoint (``checkpoints/last.safetensors``, refreshed every
  ``checkpoint_every_steps`` steps by the mini recipe, else the newest periodic one) **with** its
  optimiser state, random states and running sums: the resumed run continues exactly there;
* ``checkpoints/best.safetensors``, weights only, when it holds another point of training;
* the starting weights its ``init_from`` names, where they are in its ``checkpoints/`` (a pruned
  model's fine-tune);
* its periodic checkpoints, weights only, where a figure of the study is drawn from them
  (``keep_epochs``: the run whose centres a suite draws over the epochs, paper Fig. 3).

Other periodic checkpoints, TensorBoard events (``tb/``, rewritten by the resumed run) and the lock
file go, and the local paths the run records are replaced by file names
(:func:`trim.share_run_folder`). From a fresh clone, the same ``attncnn reproduce <study> --data
<data set>`` resumes it: :func:`attncnn.runs.point_at_data` first tells the shipped configuration
where its data set is on this machine (the file name must match), and
:func:`attncnn.perf.resume_plan` gives it this machine's device.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from trim import folder_bytes, share_run_folder, weights_only

from attncnn.errors import InputError
from attncnn.runs import RunFolder, load_checkpoint
from attncnn.runs.checkpoint import read_metadata

log = logging.getLogger("tools.ship")

__all__ = ["ship_unfinished"]

_KEEP_FILES = {"config.json", "metrics.jsonl", "machine.json"}


def _position(path: Path) -> tuple[int, int]:
    meta = read_metadata(path)
    return int(meta.get("epoch", -1)), int(meta.get("step_in_epoch", 0))


def _starting_weights(folder: RunFolder) -> Path | None:
    """The checkpoint in the run's own ``checkpoints/`` that its ``init_from`` names (a pruned
    model's fine-tune keeps its starting weights there, ``attncnn prune --finetune-epochs``): part
    of the run's record, so it travels with it. None where the run starts elsewhere or from scratch."""
    init_from = folder.read_config().get("init_from")
    if not isinstance(init_from, str) or not init_from.endswith(".safetensors"):
        return None
    # by name: a shipped run records a bare file name (share_run_folder), a copied one the path of
    # its first folder; the trainer's own checkpoints (last, best, epoch_NNNN) are never starting weights
    stem = Path(init_from).stem
    if stem in ("last", "best") or any(path.stem == stem for _, path in folder.periodic_checkpoints()):
        return None
    path = folder.checkpoint_path(stem)
    return path if path.is_file() else None


def ship_unfinished(path: str | Path, *, keep_epochs: bool = False) -> tuple[int, int]:
    """Reduce the started, unfinished run folder ``path`` to what resuming it elsewhere needs (see
    the module's description), and with ``keep_epochs`` its periodic checkpoints as weights;
    returns its size in bytes before and after. Safe to run again.

    Raises:
        InputError: the run is finished (trim it instead) or not a run folder, or its newest
            checkpoint has no optimiser state (it could not be resumed).
        RunFolderError: a process is training the run now (its lock is held).
    """
    path = Path(path)
    folder = RunFolder(path, mode="read")
    if not (path / "config.json").is_file() or folder.finished:
        raise InputError(f"{path} is {'finished' if folder.finished else 'not a run folder'}: only started, "
                         "unfinished runs are shipped this way")
    RunFolder.check_not_in_use(path)
    before = folder_bytes(path)
    resume_from = folder.latest_checkpoint()
    if resume_from is not None and load_checkpoint(resume_from).optimizer_state is None:
        raise InputError(f"{resume_from} holds no optimiser state, so {path} cannot be resumed from it")
    for entry in path.iterdir():
        if entry.is_dir() and entry.name != "checkpoints":
            shutil.rmtree(entry)
        elif entry.is_file() and entry.name not in _KEEP_FILES:
            entry.unlink()
    best = folder.checkpoint_path("best")
    start = _starting_weights(folder)
    periodic = {p for _, p in folder.periodic_checkpoints()} if keep_epochs else set()
    for ckpt in sorted((path / "checkpoints").glob("*.safetensors")) if resume_from else []:
        if ckpt in (resume_from, start):
            continue
        if (ckpt == best and _position(best) != _position(resume_from)) or ckpt in periodic:
            weights_only(ckpt)                       # another point of training: its weights stay
        else:
            ckpt.unlink()
    if resume_from is None:
        log.warning("%s: no checkpoint yet; resumed, it starts again from its first epoch", path)
    share_run_folder(path, unfinished=True)
    after = folder_bytes(path)
    log.info("shipped unfinished %s: %.1f MB -> %.1f MB (resumes from %s)", path, before / 1e6, after / 1e6,
             resume_from.name if resume_from else "the start")
    return before, after
