"""Networks from checkpoint files: rebuild a model (``load_model``), check weights against a
model, start a run from another run's weights (``--init-from``).

A stored configuration is never trusted with memory: :func:`build_checked` builds the network on
PyTorch's ``meta`` device, compares every tensor's name, shape and dtype with the file's headers
and the total size with the device's memory, and only then allocates. Every command that reads a
model from a file goes through here. The file format is in :mod:`attncnn.runs.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from pathlib import Path

import torch
from torch import nn

from ..errors import InputError, MissingFileError
from ..layers import dense_attention
from ..models import build_model_from_config
from .checkpoint import load_checkpoint, read_metadata, tensor_specs
from .config import TrainConfig, recipe_from_dict, without_paths
from .folder import RunFolder
from .machine_file import MACHINE_FILE, recorded_precision, run_precision
from .withheld import read_withheld, withheld_message

__all__ = ["OLD_MACHINE_FIELDS", "load_model", "trained_precision", "precision_source", "resumable_config",
           "resumable_recipe", "check_weights", "check_images", "check_options_take_images", "file_specs",
           "checkpoint_of", "DEFAULT_CHECKPOINT", "build_checked", "specs_of"]

#: safetensors dtype names (file headers) -> torch dtypes
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}

Specs = dict  # {name: (torch dtype, shape tuple)}

log = logging.getLogger(__name__)

#: (file dtype, model dtype) pairs that load by widening exactly (bfloat16 weights into float32
#: parameters); nothing narrows on load
_WIDENED = {(torch.bfloat16, torch.float32)}


def specs_of(state: dict[str, torch.Tensor]) -> Specs:
    """``{name: (dtype, shape)}`` of a state dict (real or meta tensors)."""
    return {name: (t.dtype, tuple(t.shape)) for name, t in state.items()}


def file_specs(path: str | Path) -> Specs:
    """``{name: (dtype, shape)}`` of a checkpoint's model tensors, from its header alone."""
    return {name: (_DTYPES.get(dtype, dtype), tuple(shape)) for name, (dtype, shape) in tensor_specs(path).items()}


#: the key of :func:`load_model`'s metadata that holds the machine fields an older checkpoint's
#: ``"config"`` stored beside the recipe (e.g. ``{"precision": "bf16"}``); read, never written
OLD_MACHINE_FIELDS = "old_machine_fields"


def check_weights(path: str | Path, model: nn.Module, specs: Specs) -> None:
    """The tensors described by ``specs`` (:func:`specs_of`, :func:`file_specs`) must match
    ``model.state_dict()`` by name, shape and dtype (a bfloat16 tensor fits a float32 one: it
    widens exactly on load); ``model`` may live on the meta device.

    Raises:
        InputError: missing or unexpected names (the first five of each), or a shape or dtype
            mismatch (the key and both values); the message names ``path``.
    """
    expected = specs_of(model.state_dict())
    missing = sorted(set(expected) - set(specs))
    unexpected = sorted(set(specs) - set(expected))
    if missing or unexpected:
        raise InputError(f"checkpoint {path} does not fit its configuration: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, (dtype, shape) in specs.items():
        if shape != expected[name][1]:
            raise InputError(f"checkpoint {path}: weight {name!r} has shape {shape}, "
                             f"the configuration needs {expected[name][1]}")
        if dtype != expected[name][0] and (dtype, expected[name][0]) not in _WIDENED:
            raise InputError(f"checkpoint {path}: weight {name!r} is {dtype}, the configuration needs "
                             f"{expected[name][0]}")


def _memory_of(device: torch.device) -> int:
    """Bytes of memory on ``device``: physical RAM for the CPU, the GPU's total memory for CUDA."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_images(model: nn.Module, images: tuple[int, int, int], source: str = "the model") -> None:
    """Raise unless ``model`` takes images of shape ``images = (C, H, W)``: one forward of a batch of
    one on the meta device (shapes only; attention layers on their explicit path, as a fused kernel
    may lack a meta implementation), catching whatever
    the network checks of its input (pooling width, position embedding or table size).

    Raises:
        InputError: the network refuses such images: ``"{source} cannot take CxHxW images: ..."``
            with the network's own message, which names the fix.
    """
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    if first is not None and first.device.type != "meta":
        return
    probe = torch.empty(1, *images, device="meta")
    try:
        with torch.no_grad(), dense_attention(model):
            was = model.training
            model.eval()
            try:
                model(probe)
            finally:
                model.train(was)
    except ValueError as err:
        raise InputError(f"{source} cannot take {'x'.join(map(str, images))} images: {err}") from None
    except Exception as err:    # noqa: BLE001 - an operator without a meta kernel says nothing about the input
        log.debug("the meta-device check of %s on %s images did not run (%s: %s)", source, images,
                  type(err).__name__, err)


def check_options_take_images(arch: str, config, images: tuple[int, int, int],
                              source: str = "the configuration") -> None:
    """:func:`check_images` for the network of ``arch`` and ``config`` (options dict or dataclass),
    built on the meta device; a process remembers the networks and image shapes that passed.

    Raises:
        InputError: as :func:`check_images`; unknown or ill-typed options.
    """
    config = _as_dict(config)
    key = (arch, json.dumps(config, sort_keys=True, default=str), tuple(images))
    if key in _TAKEN:
        return
    check_images(_shape_only(arch, config), images, source)
    _TAKEN.add(key)


#: (arch, options, image shape) that :func:`check_options_take_images` passed in this process
_TAKEN: set[tuple[str, str, tuple[int, ...]]] = set()


def _as_dict(config) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def _shape_only(arch: str, config: dict) -> nn.Module:
    """The network of ``arch`` and ``config`` on the meta device: shapes only, nothing allocated."""
    with torch.device("meta"):
        return build_model_from_config(arch, dict(config))


def build_checked(arch: str, config: dict, *, weights: str | Path | None = None,
                  device: str | torch.device = "cpu", source: str = "the configuration") -> nn.Module:
    """Build a network only after checking, on the meta device, that it fits ``weights`` and memory.

    Args:
        arch, config: as :func:`attncnn.models.build_model_from_config` (``config`` may also be
            the configuration dataclass).
        weights: a checkpoint whose model tensors the network must match (names, shapes, dtypes),
            read from its header only; None checks the size alone.
        device: where the network is built (and whose memory bounds its size).
        source: what the configuration came from, for the size error (e.g. a file name).

    Returns:
        The network on ``device``, with its usual initialisation.

    Raises:
        InputError: unknown or ill-typed option; a tensor that does not match ``weights`` (named);
            parameters and buffers larger than the device's memory.
        FileNotFoundError, CheckpointError: ``weights`` missing or unreadable.
    """
    config, device = _as_dict(config), torch.device(device)
    shape_only = _shape_only(arch, config)
    if weights is not None:
        check_weights(weights, shape_only, file_specs(weights))
    size = sum(t.numel() * t.element_size() for t in itertools.chain(shape_only.parameters(), shape_only.buffers()))
    if size > _memory_of(device):
        raise InputError(f"{source} asks for a model of {size / 2**30:,.1f} GiB of weights, more than the "
                         f"{_memory_of(device) / 2**30:,.1f} GiB of memory on {device} (model options: "
                         f"{_short(config)}); check the model options")
    return build_model_from_config(arch, dict(config)).to(device)


def _short(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items() if k in ("dim", "num_layers", "num_heads", "mlp_dim",
                                                                     "head_dim", "widths", "blocks"))


#: The checkpoint every command and :func:`load_model` take from a run folder unless told otherwise:
#: the final weights. ``best`` is selected on the test set itself, so it is taken only when asked for.
DEFAULT_CHECKPOINT = "last"


def checkpoint_of(path: str | Path, checkpoint: str | None = None) -> Path:
    """``path`` itself if it is a file, or for a run folder its ``checkpoints/<checkpoint>.safetensors``
    (default :data:`DEFAULT_CHECKPOINT`, ``"last"``).

    Args:
        path: a checkpoint file or a run folder.
        checkpoint: for a run folder, which of its checkpoints: ``"last"``, ``"best"``, ``"epoch_0010"``...

    Raises:
        FileNotFoundError: no such file, or a run folder without that checkpoint (the message lists
            the checkpoints it holds, or says the run was shipped without its weights).
        InputError: ``checkpoint`` given with a checkpoint file, or not a plain name.
    """
    path = Path(path)
    if path.is_dir():
        folder = RunFolder(path, mode="read")
        name = checkpoint or DEFAULT_CHECKPOINT
        path = folder.checkpoint_path(name)
        if not path.exists():
            withheld = read_withheld(folder.path)
            if withheld is not None:
                raise MissingFileError(withheld_message(folder.path, withheld))
            held = sorted(p.stem for p in (folder.path / "checkpoints").glob("*.safetensors"))
            hint = (f"it holds {', '.join(held)}: name one (--checkpoint NAME, or checkpoint=NAME in Python) or "
                    f"give its file, e.g. {folder.path / 'checkpoints' / (held[0] + '.safetensors')}") if held else \
                "it holds none yet; train (or resume) the run until it writes one"
            raise MissingFileError(f"run folder {folder.path} holds no {name!r} checkpoint; {hint}")
    elif checkpoint is not None:
        raise InputError(f"{path} is a checkpoint file, and a checkpoint name ({checkpoint!r}) chooses among a run "
                         "folder's checkpoints; give the run folder, or the file alone")
    if not path.exists():
        raise MissingFileError(f"no checkpoint at {path}")
    return path


def _checked_metadata(path: Path, meta) -> dict:
    """The checkpoint's metadata, with ``arch``, ``model_config`` and ``config`` validated and read as a
    checkpoint of today (:func:`~attncnn.runs.config.recipe_from_dict`); an older ``config``'s machine
    fields under :data:`OLD_MACHINE_FIELDS`."""
    if not isinstance(meta, dict):
        raise InputError(f"checkpoint {path}: its metadata is not a JSON object; it was not written by attncnn train")
    for key, kind in (("arch", str), ("model_config", dict)):
        if key not in meta:
            raise InputError(f"checkpoint {path} has no {key!r} entry; it was not written by attncnn train")
        if not isinstance(meta[key], kind):
            raise InputError(f"checkpoint {path}: {key!r} must be a {kind.__name__}, got {meta[key]!r}")
    meta = {k: v for k, v in meta.items() if k != "attention_paths"}
    meta["model_config"] = without_paths(meta["model_config"])
    if "config" in meta:
        if not isinstance(meta["config"], dict):
            raise InputError(f"checkpoint {path}: 'config' must be a JSON object, got {meta['config']!r}")
        try:
            recipe, old = recipe_from_dict(meta["config"])
        except ValueError as err:
            raise InputError(f"checkpoint {path}: invalid stored training configuration: {err}") from err
        meta["config"] = recipe.to_dict()
        if old:
            meta[OLD_MACHINE_FIELDS] = old
    return meta


def load_model(path: str | Path, device: str | torch.device = "cpu",
               checkpoint: str | None = None) -> tuple[nn.Module, dict]:
    """Rebuild a network from a checkpoint file, or from a run folder's ``checkpoint`` (default
    ``last``, the final weights; see :func:`checkpoint_of`; the checkpoint taken is logged).

    The stored configuration is validated and checked on the meta device against the file's tensors
    (:func:`build_checked`) before anything is allocated. The network takes the fastest exact
    attention path for ``device`` (``impl="auto"``): paths an older checkpoint recorded are not used.

    Returns:
        ``(model in eval mode, checkpoint metadata)``: the metadata as :func:`_checked_metadata`
        reads it (an older checkpoint's machine fields under :data:`OLD_MACHINE_FIELDS`).

    Raises:
        FileNotFoundError: no checkpoint at ``path``, or not the one asked for in a run folder.
        attncnn.runs.checkpoint.CheckpointError: not a safe attncnn checkpoint, or corrupt.
        InputError: configuration or weights that do not fit, or a model larger than memory (the
            message names the key); ``checkpoint`` given with a checkpoint file.
    """
    given = Path(path)
    path = checkpoint_of(given, checkpoint)
    meta = _checked_metadata(path, read_metadata(path))     # the header only: no tensor is read yet
    if given.is_dir():
        log.info("run folder %s: using %s (epoch %s)", given, path, meta.get("epoch", "?"))
    try:
        model = build_checked(meta["arch"], dict(meta["model_config"]), weights=path, device="cpu",
                              source=f"checkpoint {path}")
    except TypeError as err:
        raise InputError(f"checkpoint {path}: invalid stored model configuration: {err}") from err
    except ValueError as err:
        if str(path) in str(err):
            raise
        raise InputError(f"checkpoint {path}: invalid stored model configuration: {err}") from err
    model.load_state_dict(load_checkpoint(path).model_state)
    return model.to(device).eval(), meta


def trained_precision(checkpoint: str | Path, meta: dict) -> str | None:
    """The precision the run of ``checkpoint`` trained at when it started (``"fp32"`` or ``"bf16"``):
    its run folder's ``machine.json`` (:func:`~attncnn.runs.machine_file.run_precision`), else the
    ``"precision"`` an older checkpoint's configuration stored, else None (not known: run it in fp32)."""
    return precision_source(checkpoint, meta)[0]


def precision_source(checkpoint: str | Path, meta: dict) -> tuple[str | None, str]:
    """:func:`trained_precision` and where it was found, in words for a user (``"the run's
    machine.json"``, ``"the checkpoint's configuration"``), or why it is not known."""
    checkpoint = Path(checkpoint)
    folder = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    found = run_precision(folder) if folder is not None else None
    if found is not None:
        return found, "the run's machine.json"
    old = meta.get(OLD_MACHINE_FIELDS, {}).get("precision")
    if isinstance(old, str):
        return old, "the checkpoint's configuration"
    if folder is None:
        return None, "no run folder"
    unknown = recorded_precision(folder)
    if unknown is not None:             # e.g. "fp64" in a hand-edited file: not "none", and not used
        return None, f"{folder / MACHINE_FILE} records precision {unknown!r}, which attncnn does not know"
    return None, f"{folder} records none"


def resumable_config(path: str | Path) -> TrainConfig:
    """The recipe of the run in folder ``path`` (:func:`resumable_recipe` without the machine fields).

    Raises:
        RunFolderError: no resumable run there. ValueError: an invalid stored configuration.
    """
    return resumable_recipe(path)[0]


def resumable_recipe(path: str | Path) -> tuple[TrainConfig, dict]:
    """The recipe of the run in folder ``path`` and the machine fields its ``config.json`` stored
    beside it when written before the two were kept apart (``{}`` for a run of today; see
    :func:`~attncnn.runs.config.recipe_from_dict`).

    Raises:
        RunFolderError: no resumable run there. ValueError: an invalid stored configuration (named
            with the file).
    """
    return recipe_from_dict(RunFolder.resumable_config(path), source=Path(path) / "config.json")
