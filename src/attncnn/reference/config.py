"""The reference's run configuration (``config.yaml``) read, inferred from tensors, and written.

The reference keeps every hyperparameter in one flat dictionary written as ``config.yaml`` beside
its checkpoints. A conversion takes them from that file (or a given one), and from the tensors'
shapes where the file is missing or silent; values neither tells are an error naming them.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import stat
from pathlib import Path

import torch

from ..errors import InputError, MissingFileError
from .kinds import FLAG_KEYS, ReferenceKind, kind_of_flags

__all__ = ["REFERENCE_DEFAULTS", "read_reference_config", "infer_from_tensors", "resolve_reference_config",
           "LAYER_PREFIX", "MAX_CONFIG_BYTES"]

log = logging.getLogger(__name__)

#: the largest config.yaml read (the reference writes about 2 KB)
MAX_CONFIG_BYTES = 1 << 20

#: the reference's configuration keys at 9ffaa30 with the defaults of its train.py, in its order
#: (the order its config.yaml is written in)
REFERENCE_DEFAULTS: dict = {
    "dataset": "Cifar10", "model": "bert", "load_checkpoint_file": None, "no_cuda": False,
    "optimizer": "SGD", "optimizer_cosine_lr": False, "optimizer_warmup_ratio": 0.0,
    "optimizer_decay_at_epochs": [80, 150, 250], "optimizer_decay_with_factor": 10.0,
    "optimizer_learning_rate": 0.1, "optimizer_momentum": 0.9, "optimizer_weight_decay": 0.0001,
    "batch_size": 300, "num_epochs": 300, "seed": 42,
    "vocab_size_or_config_json_file": -1, "hidden_size": 128, "position_encoding_size": -1,
    "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 512, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 16,
    "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "add_positional_encoding_to_input": False, "use_learned_2d_encoding": False, "share_position_encoding": False,
    "use_attention_data": False, "use_gaussian_attention": True, "attention_isotropic_gaussian": False,
    "prune_degenerated_heads": False, "reset_degenerated_heads": False, "fix_original_heads_position": False,
    "fix_original_heads_weights": False, "gaussian_spread_regularizer": 0.0,
    "gaussian_init_sigma_std": 0.01, "gaussian_init_mu_std": 2.0, "attention_gaussian_blur_trick": False,
    "pooling_concatenate_size": 2, "pooling_use_resnet": False,
    "only_list_parameters": False, "num_keep_checkpoints": 0, "plot_attention_positions": True,
    "output_dir": "./output.tmp",
}

#: a reference layer's tensors: ``encoder.layer.{i}.``
LAYER_PREFIX = "encoder.layer.{}."
_SELF = "attention.self."
#: sizes the shapes tell, and what tells them (for messages)
_SHAPE_KEYS = {"hidden_size": "features_upscale.weight", "pooling_concatenate_size": "features_upscale.weight",
               "num_hidden_layers": "encoder.layer.N", "intermediate_size": "intermediate.dense.weight",
               "num_attention_heads": "the attention tensors", "max_position_embeddings": "the position tables",
               "position_encoding_size": "the position tables", "num_classes": "classifier.weight"}
_CLASSES = {"Cifar10": 10, "Cifar100": 100}


def _loader():
    """PyYAML's SafeLoader without aliases (built on first use: PyYAML is imported only to read a file)."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        """PyYAML's safe loader, refusing every alias as it meets it, before anything is expanded."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise _AliasFound(f"line {event.start_mark.line + 1} uses the YAML alias *{event.anchor}")
            return super().compose_node(parent, index)
    return NoAliasLoader


class _AliasFound(Exception):
    """A YAML alias met while composing (caught by :func:`read_reference_config`)."""


def _type_words(default) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, list):
        return "a list of integers"
    return "a string" if isinstance(default, str) else "a path or null"


def _fits(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if isinstance(default, str):
        return isinstance(value, str)
    return value is None or isinstance(value, str)


def _recordable(value) -> bool:
    """Whether a run folder's JSON files can record ``value`` as it is."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_recordable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _recordable(v) for k, v in value.items())
    return False


def _checked(values: dict, where: str) -> dict:
    """``values`` with each known key's value of its default's type (a number written as text,
    ``1e-12``, which YAML 1.1 reads as a string, taken as the number), every other value one a
    run folder records; else InputError naming ``where``, the key, the value and what to write."""
    checked = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise InputError(f"{where}: the key {key!r} is not an option name (text); the reference's config.yaml "
                             "maps option names to values")
        default = REFERENCE_DEFAULTS.get(key, _UNKNOWN)
        if isinstance(default, float) and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if default is not _UNKNOWN and not _fits(value, default):
            raise InputError(f"{where}: {key} is {value!r}, not {_type_words(default)}; write e.g. "
                             f"{key}: {default if default is not None else 'null'} (the reference's default)")
        if default is _UNKNOWN and not _recordable(value):
            what = "a date" if isinstance(value, (datetime.date, datetime.datetime)) else \
                f"a {type(value).__name__}"
            raise InputError(f"{where}: {key} is {what} ({value!r}), which a run folder cannot record; quote it "
                             f"({key}: \"{value}\") or remove the key")
        checked[key] = value
    return checked


_UNKNOWN = object()


def read_reference_config(config: str | os.PathLike[str] | dict) -> tuple[dict, str]:
    """A reference configuration as a dict, and where it came from (the file, or ``"given"``),
    each value of a known key checked against the type of the reference's default. The YAML loader
    refuses aliases before they are expanded (nested aliases can expand a kilobyte into gigabytes;
    the reference writes none), and files over :data:`MAX_CONFIG_BYTES`.

    Raises:
        MissingFileError: no such file.
        InputError: not YAML, an alias, a file too large or not a regular file, not a mapping of
            names to values, a value of the wrong type for its key, or one a run folder cannot record
            (a YAML date): each names the file, the key and the fix.
    """
    if isinstance(config, dict):
        return _checked(dict(config), "the given configuration"), "given"
    import yaml

    path = Path(config)
    if not path.exists():
        raise MissingFileError(f"no reference configuration at {path}")
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):          # a FIFO or device would block or never end
        raise InputError(f"{path} is not a regular file; give the config.yaml the reference's train.py wrote")
    if info.st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{path} is {info.st_size:,} bytes, not a reference config.yaml (about 2 KB; at most "
                         f"{MAX_CONFIG_BYTES:,} read); give the config.yaml the reference's train.py wrote")
    try:
        values = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader())      # a SafeLoader
    except _AliasFound as err:
        raise InputError(f"{path}: {err}; the reference's config.yaml has none, and aliases can expand a small "
                         "file into gigabytes: write the values out") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is not a readable YAML file ({err}); give the config.yaml the reference's "
                         "train.py wrote beside the checkpoint") from err
    if not isinstance(values, dict):
        raise InputError(f"{path} holds {type(values).__name__}, not the mapping of option names to values that "
                         "the reference's config.yaml is")
    return _checked(values, str(path)), str(path)


def _layer_count(state: dict) -> int:
    found = {int(k.split(".")[2]) for k in state if k.startswith("encoder.layer.") and k.split(".")[2].isdigit()}
    if not found:
        raise InputError("the checkpoint holds no encoder.layer.N tensors; it is not a reference BertImage model")
    missing = sorted(set(range(max(found) + 1)) - found)
    if missing:
        raise InputError(f"the checkpoint's layers are not numbered 0..{max(found)}: layer(s) {missing} missing; "
                         "the file is incomplete")
    return max(found) + 1


def _flags_of(layer: dict) -> dict:
    """The attention flags that a layer's tensor names tell."""
    if _SELF + "attention_centers" in layer:
        spreads = layer.get(_SELF + "attention_spreads")
        return {"use_gaussian_attention": True, "use_learned_2d_encoding": False, "use_attention_data": False,
                "attention_isotropic_gaussian": spreads is not None and spreads.dim() == 1}
    learned = _SELF + "row_embeddings.weight" in layer
    if learned or _SELF + "query.weight" in layer:
        return {"use_gaussian_attention": False, "use_learned_2d_encoding": learned,
                "use_attention_data": learned and _SELF + "query.weight" in layer,
                "attention_isotropic_gaussian": False}
    raise InputError("layer 0 has none of the reference's attention tensors (attention.self.attention_centers, "
                     "row_embeddings, query); it is not a reference BertImage checkpoint")


def _layer(state: dict, i: int) -> dict:
    prefix = LAYER_PREFIX.format(i)
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _shape(state: dict, name: str, dims: int) -> tuple[int, ...]:
    if name not in state:
        raise InputError(f"the checkpoint has no {name} tensor; it is not a reference BertImage model (or not all "
                         "of it)")
    tensor = state[name]
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != dims:
        raise InputError(f"{name} should be a {dims}-d tensor, got {getattr(tensor, 'shape', type(tensor).__name__)}")
    return tuple(tensor.shape)


def _head_count(layer: dict, name: str, index: int) -> int:
    tensor = layer.get(name)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise InputError(f"layer {index} has no {name} tensor (or not a tensor); the checkpoint is incomplete or "
                         "its layers are of different kinds")
    return tensor.shape[0]


def infer_from_tensors(state: dict) -> tuple[dict, list[int] | None]:
    """The reference configuration values that ``state`` (a reference ``model_state_dict``) tells,
    and the head count of each layer where the kind's tensors tell it (None for plain content).

    Raises:
        InputError: tensors missing, of the wrong rank, or not those of a reference BertImage.
    """
    dim, features = _shape(state, "features_upscale.weight", 2)
    pooling = round((features / 3) ** 0.5)
    if 3 * pooling * pooling != features:
        raise InputError(f"features_upscale takes {features} features per token, not 3 p^2 for an integer pooling "
                         "p (RGB images); a ResNet stem (pooling_use_resnet) is not supported")
    layers = _layer_count(state)
    first = _layer(state, 0)
    found = {"hidden_size": dim, "pooling_concatenate_size": pooling, "num_hidden_layers": layers,
             "num_classes": _shape(state, "classifier.weight", 2)[0],
             "intermediate_size": _shape(first, "intermediate.dense.weight", 2)[0], **_flags_of(first)}
    entry = kind_of_flags({k: found[k] for k in FLAG_KEYS})
    heads = None
    if entry.heads_tensor is not None:
        heads = [_head_count(_layer(state, i), _SELF + entry.heads_tensor, i) for i in range(layers)]
        found["num_attention_heads"] = max(heads)
    if found["use_learned_2d_encoding"]:
        rows, width = _shape(first, _SELF + "row_embeddings.weight", 2)
        if rows % 2 == 0:
            raise InputError(f"the learned tables have {rows} rows, not 2 M - 1 for a largest grid side M")
        found["max_position_embeddings"] = (rows + 1) // 2
        found["position_encoding_size"] = -1 if width == dim else width
    return found, heads


def resolve_reference_config(state: dict, given: dict | None) -> tuple[dict, ReferenceKind, list[int], list[str]]:
    """The configuration a conversion uses: ``given`` (a config.yaml), checked against what the
    tensors tell and completed by it; the reference's defaults for what neither tells.

    Returns:
        ``(configuration, kind entry, heads per layer, keys not given but inferred or defaulted)``.

    Raises:
        InputError: a value of ``given`` that the tensors contradict (named, with both values); a
            value neither gives (the content head count: named, with the fix); options the
            conversion cannot reproduce (a ResNet stem, the Gaussian blur approximation, another
            activation than GELU).
    """
    found, heads = infer_from_tensors(state)
    given = dict(given or {})
    given.pop("num_classes", None)
    unknown = sorted(k for k in given if k not in REFERENCE_DEFAULTS)
    if unknown:
        log.info("the configuration's %s %s not options of the reference's train.py: recorded in the run's "
                 "reference.json, not used", ", ".join(unknown), "is" if len(unknown) == 1 else "are")
    for key, value in found.items():
        if key == "num_classes" or key not in given:
            continue
        expected = value
        if key == "num_attention_heads" and heads is not None and given.get("prune_degenerated_heads"):
            expected = given[key] if max(heads) <= given[key] else value      # a pruned model keeps fewer
        if _differs(given[key], expected):
            raise InputError(f"the configuration says {key}={given[key]!r} but the checkpoint's tensors have "
                             f"{key}={value!r} (from {_SHAPE_KEYS.get(key, 'the tensor names')}); give the "
                             "config.yaml of the run that wrote this checkpoint")
    config = {**REFERENCE_DEFAULTS, **found, **given}
    if "dataset" not in given:        # the class count tells CIFAR-100 from CIFAR-10
        config["dataset"] = {100: "Cifar100"}.get(found["num_classes"], REFERENCE_DEFAULTS["dataset"])
    config.pop("num_classes", None)
    if "num_attention_heads" not in given and "num_attention_heads" not in found:
        raise InputError("the head count of plain content attention cannot be inferred from the tensors (its query, "
                         "key and value maps are D x D for any count); give the run's config.yaml, or a config "
                         "with num_attention_heads")
    inferred = sorted(k for k in config if k not in given)
    entry = kind_of_flags({k: config[k] for k in FLAG_KEYS})
    if heads is None:
        heads = [int(config["num_attention_heads"])] * int(config["num_hidden_layers"])
    _check_reproducible(config, found["num_classes"] if "dataset" in given else None)
    return config, entry, heads, inferred


def _differs(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) != bool(b)
    return a != b


def _check_reproducible(config: dict, num_classes: int | None) -> None:
    for key, fix in (("pooling_use_resnet", "a ResNet-50 stem, which attncnn does not have"),
                     ("attention_gaussian_blur_trick", "its 7x7 convolution approximation of the Gaussian attention, "
                                                       "not the exact attention attncnn computes")):
        if config.get(key):
            raise InputError(f"the run used {key}=True: {fix}; it cannot be converted")
    if config.get("hidden_act", "gelu") != "gelu":
        raise InputError(f"the run used hidden_act={config['hidden_act']!r}; attncnn's blocks use GELU (the "
                         "reference's default, erf form) only")
    if config.get("model", "bert") != "bert":
        raise InputError(f"the run trained model={config['model']!r}; only the reference's attention model "
                         "(model: bert, BertImage) converts")
    expected = _CLASSES.get(config.get("dataset"))
    if num_classes is not None and expected is not None and expected != num_classes:
        raise InputError(f"the configuration trains on {config['dataset']} ({expected} classes) but classifier.weight "
                         f"has {num_classes} outputs; give the config.yaml of the run that wrote this checkpoint")

