"""Our run or checkpoint out as a reference checkpoint (:func:`export_reference`): a ``torch.save``
file of ``{"epoch", "test_accuracy", "model_state_dict"}`` under the reference's names, with the
buffers its ``store_checkpoint`` keeps (``attention_mask``; learned layers' ``relative_indices``) and
without those it drops (the Gaussian layers' ``R``), and ``config.yaml`` beside it; converting it back
(:func:`~attncnn.reference.convert_reference`) gives identical tensors.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from .._io import atomic_write_text
from ..errors import InputError, OutputError
from ..runs import TrainConfig, checkpoint_of, load_checkpoint, load_model
from ..runs.torch_file import write_torch_file
from .kinds import REFERENCE_KINDS
from .recipe import reference_config_of
from .weights import to_reference

__all__ = ["export_reference"]

log = logging.getLogger(__name__)


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
