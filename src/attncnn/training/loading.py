"""Networks from checkpoint files: rebuild a model (``load_model``), check weights against a
model, start a run from another run's weights (``--init-from``).

Every command that reads a model from a file (``evaluate``, ``inspect``, ``plot``, ``report``,
``viewer``, ``prune``, ``theorem --conv-from``, ``train --init-from`` and ``--resume``) goes through
here, so they all refuse the same bad files with the same messages. The file format itself is in
:mod:`attncnn.training.checkpoint`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..models import build_model_from_config
from .checkpoint import load_checkpoint
from .config import config_from_dict
from .errors import TrainingError
from .run_folder import RunFolder

__all__ = ["load_model", "check_weights", "load_weights", "checkpoint_of"]

log = logging.getLogger(__name__)


def check_weights(path: str | Path, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every tensor of ``state`` must match ``model.state_dict()`` by name and shape.

    Raises:
        ValueError: missing or unexpected names (the first five of each) or a shape mismatch (the
            key, both shapes); the message names ``path``.
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit its configuration: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"checkpoint {path}: weight {name!r} has shape {tuple(tensor.shape)}, "
                             f"the configuration needs {tuple(expected[name].shape)}")


def checkpoint_of(path: str | Path) -> Path:
    """``path`` itself, or for a run folder its ``best`` checkpoint (else ``last``).

    Raises:
        FileNotFoundError: no such file, or a run folder without either checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        folder = RunFolder(path, mode="read")
        best, last = folder.checkpoint_path("best"), folder.checkpoint_path("last")
        path = best if best.exists() else last
        if not path.exists():
            raise FileNotFoundError(f"run folder {folder.path} holds no 'best' or 'last' checkpoint")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return path


def _checked_metadata(path: Path, meta) -> dict:
    """The checkpoint's metadata, with ``arch``, ``model_config`` and ``config`` validated."""
    if not isinstance(meta, dict):
        raise ValueError(f"checkpoint {path}: its metadata is not a JSON object; it was not written by attncnn train")
    for key, kind in (("arch", str), ("model_config", dict)):
        if key not in meta:
            raise ValueError(f"checkpoint {path} has no {key!r} entry; it was not written by attncnn train")
        if not isinstance(meta[key], kind):
            raise ValueError(f"checkpoint {path}: {key!r} must be a {kind.__name__}, got {meta[key]!r}")
    if "config" in meta:
        if not isinstance(meta["config"], dict):
            raise ValueError(f"checkpoint {path}: 'config' must be a JSON object, got {meta['config']!r}")
        try:
            config_from_dict(meta["config"])
        except ValueError as err:
            raise ValueError(f"checkpoint {path}: invalid stored training configuration: {err}") from err
    return meta


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild a network from a checkpoint file (or a run folder: its ``best`` or ``last``).

    The stored configuration is validated before the model is built (unknown keys and wrong types
    are named), and every weight must match the built model's names and shapes.

    Returns:
        ``(model in eval mode, checkpoint metadata)``.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        attncnn.training.checkpoint.CheckpointError: not a safe attncnn checkpoint.
        ValueError: configuration or weights that do not fit (the message names the key).
    """
    path = checkpoint_of(path)
    ckpt = load_checkpoint(path)
    meta = _checked_metadata(path, ckpt.metadata)
    try:
        model = build_model_from_config(meta["arch"], dict(meta["model_config"]))
    except (ValueError, TypeError) as err:
        raise ValueError(f"checkpoint {path}: invalid stored model configuration: {err}") from err
    check_weights(path, model, ckpt.model_state)
    model.load_state_dict(ckpt.model_state)
    return model.to(device).eval(), meta


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a checkpoint's weights into a freshly built ``model`` (``TrainConfig.init_from``).

    Only the weights are taken: optimiser state, random state and epoch counters start anew, so
    the run is a fine-tune with its own schedule (the paper's pruned run, PAPER.md 3.8).

    Raises:
        CheckpointError: missing or unreadable file (message names it).
        TrainingError: the weights do not fit the model (names the mismatching tensors and the
            preset/model options to use).
    """
    path = Path(path)
    ckpt = load_checkpoint(path)
    try:
        check_weights(path, model, ckpt.model_state)
    except (ValueError, RuntimeError) as err:
        raise TrainingError(f"--init-from {path}: {err}. Build the same model as the checkpoint "
                            "(same --preset and --set options).") from err
    model.load_state_dict(ckpt.model_state)
    log.info("initialised the weights from %s", path)
