"""Reference checkpoints in (:func:`convert_reference`) and ours out (:func:`export_reference`).

The reference's ``train.py`` saves ``{"epoch", "test_accuracy", "model_state_dict"}`` with
``torch.save`` (``best.checkpoint``, ``final.checkpoint``, ``NNNN.checkpoint``) and its
hyperparameters as ``config.yaml`` beside them. A conversion reads both (the pickle with
``weights_only``) and writes an ordinary attncnn run folder: ``config.json``,
``checkpoints/last.safetensors``, ``finished.json`` and ``reference.json`` (where the weights came from).

An export writes such a file under the reference's names, with the buffers its ``store_checkpoint``
keeps (``attention_mask``; learned layers' ``relative_indices``) and without those it drops (the
Gaussian layers' ``R``), and ``config.yaml`` beside it; converting it back gives identical tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
from pathlib import Path

import torch

from .._io import atomic_write_json, atomic_write_text, file_sha256
from ..errors import InputError, OutputError
from ..models import build_model_from_config, count_parameters
from ..runs import Checkpoint, RunFolder, TrainConfig, checkpoint_of, load_checkpoint, load_model, write_checkpoint
from ..runs.config import without_paths
from ..runs.lock import LOCK_FILE, RunLock
from ..runs.torch_file import read_torch_file, write_torch_file
from .config import read_reference_config, resolve_reference_config
from .kinds import REFERENCE_KINDS
from .recipe import CIFAR10_CLASSES, model_options, recipe_from_reference, reference_config_of
from .weights import to_ours, to_reference

__all__ = ["convert_reference", "export_reference", "PROVENANCE_FILE", "read_reference_checkpoint",
           "reference_kinds"]

log = logging.getLogger(__name__)

#: the file of a converted run folder that says where its weights came from
PROVENANCE_FILE = "reference.json"
_MODULE = "module."
#: the entries of a reference checkpoint that a conversion reads
_ENTRIES = ("model_state_dict", "epoch", "test_accuracy")


def read_reference_checkpoint(path: str | os.PathLike[str]) -> tuple[dict, int | None, float | None]:
    """``(model_state_dict, epoch, test_accuracy)`` of a reference checkpoint, tensors on the CPU,
    without the ``module.`` prefix of ``torch.nn.DataParallel``. Any other entry of the file (an
    optimiser state) is ignored, with one INFO line naming them: a converted run starts no training.

    Raises:
        MissingFileError, CheckpointError: as :func:`attncnn.runs.torch_file.read_torch_file`
            (which also refuses views that declare more values than the file stores).
        InputError: a file that is not a reference checkpoint (named: what it holds instead), or
            weights holding NaN or infinite values (the tensors named).
    """
    payload = read_torch_file(path)
    if not isinstance(payload, dict) or not isinstance(payload.get("model_state_dict"), dict):
        what = f"a dict with keys {sorted(map(str, payload))[:8]}" if isinstance(payload, dict) else \
            f"a {type(payload).__name__}"
        raise InputError(f"{path} is not a reference checkpoint: it holds {what}, not the "
                         "{'epoch', 'test_accuracy', 'model_state_dict'} that the reference's train.py saves")
    state = payload["model_state_dict"]
    bad = [str(k) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise InputError(f"{path}: model_state_dict entries {bad[:5]} are not named tensors; it is not a model's "
                         "state_dict")
    _check_finite(path, state)
    extra = sorted(str(k) for k in payload if k not in _ENTRIES)
    if extra:
        log.info("%s: ignored the entries %s (a conversion reads only %s)", path, ", ".join(extra), ", ".join(_ENTRIES))
    if state and all(k.startswith(_MODULE) for k in state):
        state = {k[len(_MODULE):]: v for k, v in state.items()}
    epoch, accuracy = payload.get("epoch"), payload.get("test_accuracy")
    if isinstance(accuracy, torch.Tensor) and accuracy.numel() == 1:
        accuracy = accuracy.item()
    epoch = int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None
    accuracy = float(accuracy) if isinstance(accuracy, (int, float)) and not isinstance(accuracy, bool) else None
    return state, epoch, accuracy


def _check_finite(path, state: dict) -> None:
    """Refuse weights holding NaN or infinite values: the converted model would compute NaN for
    every image (a run saved after its loss diverged)."""
    bad = [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise InputError(f"{path}: the weights {', '.join(bad[:4])}{more} hold NaN or infinite values, so the model "
                         "computes NaN for every image (a run saved after its loss diverged); convert a checkpoint "
                         "from before that")



def _network(state: dict, options: dict, entry, heads: list[int]) -> torch.nn.Module:
    """Our network with the reference tensors, checked name by name and shape by shape."""
    with torch.device("meta"):
        model = build_model_from_config("image-transformer", dict(options))
    ours = to_ours(state, entry, heads, options["dim"])
    expected = model.state_dict()
    wrong = [f"{name}: {tuple(ours[name].shape)} in the file, {tuple(t.shape)} here" for name, t in expected.items()
             if name in ours and tuple(ours[name].shape) != tuple(t.shape)]
    if wrong or set(ours) != set(expected):
        missing = sorted(set(expected) - set(ours))
        raise InputError("the checkpoint's tensors do not fit the network its configuration describes: "
                         + "; ".join(wrong[:4] + ([f"no tensor for {', '.join(missing[:4])}"] if missing else []))
                         + "; give the config.yaml of the run that wrote this checkpoint")
    dtype = expected["embed.weight"].dtype
    model.load_state_dict({k: v.to(dtype).contiguous() for k, v in ours.items()}, assign=True)
    return model.eval()


def convert_reference(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
                      config: str | os.PathLike[str] | dict | None = None, data: str | None = None,
                      overwrite: bool = False) -> Path:
    """Convert a reference checkpoint into an attncnn run folder.

    Args:
        checkpoint: a reference ``*.checkpoint`` file (``torch.save`` of ``{"epoch", "test_accuracy",
            "model_state_dict"}``), saved on any device, with or without ``DataParallel``'s ``module.``;
            other entries are ignored (one INFO line names them).
        out: the run folder to write; it must not exist (or be empty) unless ``overwrite``.
        config: the run's ``config.yaml`` (a path) or its values (a dict); default: ``config.yaml``
            beside ``checkpoint`` if there is one, else the sizes are inferred from the tensors.
        data: the data set the recipe records (default: the configuration's CIFAR-10 / CIFAR-100).
        overwrite: replace an existing ``out``.

    Returns:
        ``out``: ``config.json``, ``checkpoints/last.safetensors`` (its ``epoch`` + 1 as our count of
        finished epochs), ``finished.json`` and :data:`PROVENANCE_FILE` (source file, sha256, epoch,
        test accuracy, the configuration used and which values were inferred).

    Raises:
        MissingFileError: no checkpoint or configuration file there.
        CheckpointError: an unreadable file, one holding more than tensors and plain values, or
            tensors declaring more values than the file stores.
        InputError: not a reference checkpoint, weights holding NaN or infinite values, tensors that
            disagree with the configuration, a bad configuration value, a YAML alias, a value neither
            gives, or a kind attncnn does not have (named).
        OutputError, RunFolderError: ``out`` exists or cannot be written, or a live training holds
            its lock. Nothing is left behind on any error.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    _check_out(out, overwrite)
    state, epoch, accuracy = read_reference_checkpoint(checkpoint)
    if config is None and (checkpoint.parent / "config.yaml").is_file():
        config = checkpoint.parent / "config.yaml"
    given, source = (None, None) if config is None else read_reference_config(config)
    ref_config, entry, heads, inferred = resolve_reference_config(state, given)
    num_classes = state["classifier.weight"].shape[0]
    options = model_options(ref_config, entry, heads, num_classes)
    recipe = recipe_from_reference(ref_config if given is not None else None, entry, options, data)
    model = _network(state, options, entry, heads)
    known = given is not None
    provenance = {"source": str(checkpoint.resolve()), "sha256": file_sha256(checkpoint), "epoch": epoch,
                  "test_accuracy": accuracy, "config_source": source, "config": ref_config if known else None,
                  "inferred": inferred if known else ["every size, from the tensors' shapes"], "kind": entry.kind}
    finished = None if epoch is None else epoch + 1
    meta = {"arch": model.arch, "model_config": without_paths(dataclasses.asdict(model.config)),
            "config": recipe.to_dict(), "epoch": finished, "step_in_epoch": 0,
            "metrics": {"epoch": finished, "test_accuracy": accuracy}, "parameters": count_parameters(model),
            "image_size": [32, 32] if recipe.data in ("cifar10", "cifar100") else None, "reference": provenance}
    if recipe.data == "cifar10" and num_classes == 10:
        meta["classes"] = list(CIFAR10_CLASSES)
    summary = {"preset": recipe.preset, "epochs": recipe.epochs, "parameters": meta["parameters"],
               "dataset": recipe.data, "final": meta["metrics"], "converted_from": provenance["source"]}
    with _new_folder(out, overwrite) as tmp:
        folder = RunFolder(tmp, mode="new")
        try:
            folder.write_config(recipe.to_dict())
            with folder.writing(folder.checkpoint_path("last")):
                write_checkpoint(folder.checkpoint_path("last"), Checkpoint(model.state_dict(), None, {}, meta))
            with folder.writing(tmp / PROVENANCE_FILE):
                atomic_write_json(tmp / PROVENANCE_FILE, provenance)
            folder.mark_finished(summary)
        finally:
            folder.close()
    log.info("converted %s (reference %s, epoch %s) into %s", checkpoint, entry.kind, epoch, out)
    return out


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a folder; choose another output folder")
    if out.is_dir():
        RunFolder.check_not_in_use(out)         # a live training's folder: refused before any work
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputError(f"{out} already exists and is not empty; choose another output folder or overwrite it "
                          "(--overwrite)")


@contextlib.contextmanager
def _new_folder(out: Path, overwrite: bool):
    """A temporary folder beside ``out``, renamed to ``out`` when the block succeeds and removed
    (with everything in it) when it fails: no half-written run folder is ever at ``out``."""
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".{out.name}.converting-{secrets.token_hex(4)}"
        tmp.mkdir(0o777)             # the umask applies, as to any folder a command creates
    except OSError as err:
        raise OutputError(f"cannot create a folder in {parent} ({err.strerror or err}); choose a writable output "
                          "folder") from err
    lock = None
    try:
        yield tmp
        _check_out(out, overwrite)
        if out.is_dir():
            # the folder's own lock, as train --overwrite takes it: a training that starts in it now
            # is refused until the converted folder is in place
            lock = RunLock.take(out)
            if overwrite:
                shutil.rmtree(out)
            else:                               # empty but for the lock file just made
                with contextlib.suppress(FileNotFoundError):
                    (out / LOCK_FILE).unlink()
                out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.release()


def reference_kinds() -> list[str]:
    """Our attention kinds that reference checkpoints convert to and from."""
    return [entry.kind for entry in REFERENCE_KINDS]


def _entry(model):
    if getattr(model, "arch", None) != "image-transformer":
        raise InputError(f"the reference has no {getattr(model, 'arch', type(model).__name__)!r} network of attncnn's "
                         "kind; only image-transformer models export")
    for entry in REFERENCE_KINDS:
        if entry.kind == model.config.attention:
            return entry
    kinds = ", ".join(entry.kind for entry in REFERENCE_KINDS)
    raise InputError(f"the reference has no counterpart of attncnn's {model.config.attention!r} attention; the kinds "
                     f"that export are {kinds}")


def export_reference(run: str | os.PathLike[str], out: str | os.PathLike[str], *, checkpoint: str | None = None,
                     overwrite: bool = False) -> Path:
    """Write a run folder's (or checkpoint file's) network as a reference checkpoint.

    Args:
        run: a run folder (its ``checkpoint``, default ``last``) or an attncnn checkpoint file.
        out: the reference checkpoint to write (e.g. ``final.checkpoint``); ``config.yaml`` goes beside it.
        checkpoint: which checkpoint of a run folder (``"last"``, ``"best"``, ``"epoch_0010"``...).
        overwrite: replace an existing ``out`` or ``config.yaml``.

    Returns:
        ``out``. Its ``epoch`` is ours less one (the reference counts from 0 the epoch just
        finished), its ``test_accuracy`` the checkpoint's own (None when it holds none).

    Raises:
        FileNotFoundError, CheckpointError: as :func:`attncnn.runs.load_model`.
        InputError: a network the reference cannot build (named).
        OutputError: ``out`` or ``config.yaml`` exists (without ``overwrite``) or cannot be written;
            neither file is left half-written, and a failure on the second removes the first.
    """
    out = Path(out)
    yaml_path = out.parent / "config.yaml"
    for path in (out, yaml_path):
        if path.exists() and not overwrite:
            raise OutputError(f"{path} already exists; choose another output or overwrite it (--overwrite)")
    source = checkpoint_of(run, checkpoint)
    model, meta = load_model(source)
    entry = _entry(model)
    recipe = TrainConfig(**meta["config"]) if isinstance(meta.get("config"), dict) else None
    config = reference_config_of(model.config, entry, recipe, str(out.parent))
    state = to_reference(load_checkpoint(source).model_state, entry, model.config)
    epoch = meta.get("epoch")
    metrics = meta.get("metrics") if isinstance(meta.get("metrics"), dict) else {}
    payload = {"epoch": epoch - 1 if isinstance(epoch, int) else None, "test_accuracy": metrics.get("test_accuracy"),
               "model_state_dict": state}
    import yaml

    existed = out.exists()
    write_torch_file(out, payload)
    try:
        atomic_write_text(yaml_path, yaml.safe_dump(config, sort_keys=False))
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                out.unlink()
        raise
    log.info("exported %s (%s) as the reference checkpoint %s with %s", source, entry.kind, out, yaml_path)
    return out
