"""Hyperparameters between the reference's flat ``config.yaml`` and our model options and recipe.

Network sizes map one to one (``hidden_size`` -> ``dim``, ``num_hidden_layers`` -> ``num_layers``,
``num_attention_heads`` -> ``num_heads``, ``intermediate_size`` -> ``mlp_dim``,
``pooling_concatenate_size`` -> ``pooling``, the dropouts and ``layer_norm_eps``; per kind:
:mod:`.kinds`). The recipe maps the reference's SGD with per-epoch LR updates
(``lr_stepping="epoch"``; its cosine schedule is stepped once per epoch with the number of batches
taken so far), its multistep schedule (``optimizer_decay_at_epochs``, ``gamma = 1 /
optimizer_decay_with_factor``), and its Adam without weight decay or schedule (``adamw``, weight
decay 0, constant LR: the same update).
"""

from __future__ import annotations

from pathlib import Path

from .._recorded_data import is_data_name
from ..errors import InputError
from ..models import get_preset
from ..runs import TrainConfig
from .config import REFERENCE_DEFAULTS
from .kinds import ReferenceKind

__all__ = ["model_options", "recipe_from_reference", "reference_config_of", "CIFAR10_CLASSES", "DATASETS"]

#: the reference's dataset names -> our data names
DATASETS = {"Cifar10": "cifar10", "Cifar100": "cifar100"}
#: CIFAR-10's class names in label order (as attncnn.data has them), stored with a converted CIFAR-10 model
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def model_options(config: dict, entry: ReferenceKind, heads: list[int], num_classes: int) -> dict:
    """Our ``ImageTransformerConfig`` keywords for a reference configuration (``num_classes`` included;
    ``layer_heads`` for a pruned reference model)."""
    num_heads = int(config["num_attention_heads"])
    options = {"attention": entry.kind, "num_layers": int(config["num_hidden_layers"]), "num_heads": num_heads,
               "dim": int(config["hidden_size"]), "mlp_dim": int(config["intermediate_size"]),
               "pooling": int(config["pooling_concatenate_size"]), "num_classes": num_classes,
               "dropout": float(config["hidden_dropout_prob"]),
               "attn_dropout": float(config["attention_probs_dropout_prob"]),
               "layer_norm_eps": float(config["layer_norm_eps"]),
               "layer_heads": None if all(h == num_heads for h in heads) else list(heads)}
    options.update(entry.options(config))
    return options


def _schedule(config: dict) -> dict:
    optimizer = config["optimizer"]
    if optimizer == "Adam":
        return {"optimizer": "adamw", "lr": float(config["optimizer_learning_rate"]), "weight_decay": 0.0,
                "schedule": "constant"}
    if optimizer != "SGD":
        raise InputError(f"the configuration's optimizer {optimizer!r} is neither SGD nor Adam (the reference's two)")
    recipe = {"optimizer": "sgd", "lr": float(config["optimizer_learning_rate"]),
              "momentum": float(config["optimizer_momentum"]), "weight_decay": float(config["optimizer_weight_decay"])}
    if config["optimizer_cosine_lr"]:
        return {**recipe, "schedule": "cosine", "warmup_ratio": float(config["optimizer_warmup_ratio"])}
    return {**recipe, "schedule": "multistep", "milestones": [int(m) for m in config["optimizer_decay_at_epochs"]],
            "gamma": 1.0 / float(config["optimizer_decay_with_factor"])}


def recipe_from_reference(config: dict | None, entry: ReferenceKind, options: dict, data: str | None) -> TrainConfig:
    """Our recipe for a converted run: the reference configuration's training options, or without
    a configuration (``config`` None) the preset's recipe (the paper's) with per-epoch LR steps.

    Raises:
        InputError: a data set that is neither CIFAR-10 nor CIFAR-100 and no ``data`` given, or an
            option our recipe cannot hold (named).
    """
    # every option written out, not only those that differ from the preset: the run describes its
    # network whatever the preset's defaults become
    model = {k: v for k, v in options.items() if k != "num_classes"}
    preset = get_preset(entry.preset)
    if config is None:
        recipe = {**preset.train, "lr_stepping": "epoch",
                  "data": data or {10: "cifar10", 100: "cifar100"}.get(options["num_classes"])}
        if recipe["data"] is None:
            raise InputError(f"a model of {options['num_classes']} classes without a config.yaml: give the data set it "
                             "was trained on (data=..., --data)")
        return TrainConfig(preset=entry.preset, model=model, **recipe)
    dataset = data or _recorded_data(config["dataset"])
    keep = int(config["num_keep_checkpoints"])
    epochs = int(config["num_epochs"])
    return TrainConfig(preset=entry.preset, model=model, data=dataset, epochs=epochs,
                       batch_size=int(config["batch_size"]), lr_stepping="epoch", seed=int(config["seed"]),
                       checkpoint_every=max(1, epochs // keep) if keep > 0 else 0, keep_checkpoints=0,
                       **_schedule(config))


def _recorded_data(dataset) -> str:
    """Our data name for the configuration's ``dataset``: the reference's ``Cifar10``/``Cifar100``,
    or what :func:`~attncnn.reference.export_reference` wrote for a run of ours (``cifar10``, or the
    path or file name of the folder or zip it trained on), kept as a run records it (later commands
    look for a relative one as for any run's).

    Raises:
        InputError: another name (the reference knows only the two CIFARs), with the fix.
    """
    if dataset in DATASETS:
        return DATASETS[dataset]
    text = dataset.strip() if isinstance(dataset, str) else ""
    if text and (is_data_name(text) or _path_like(text)):
        return text
    raise InputError(f"the run trained on {dataset!r}, which attncnn does not read (it reads CIFAR-10, CIFAR-100 "
                     "and image folders or zips); give the data set to record (data=..., --data)")


def _path_like(text: str) -> bool:
    """A folder or zip's path: a name ending in ``.zip``, one with a folder in it, or a folder here."""
    path = Path(text).expanduser()
    return path.suffix.lower() == ".zip" or len(path.parts) > 1 or path.is_dir()


def _reference_training(recipe: TrainConfig | None) -> dict:
    if recipe is None:
        return {}
    values = {"num_epochs": recipe.epochs, "batch_size": recipe.batch_size, "seed": recipe.seed,
              "optimizer_learning_rate": recipe.lr,
              "dataset": {v: k for k, v in DATASETS.items()}.get(recipe.data, recipe.data),
              "num_keep_checkpoints": recipe.epochs // recipe.checkpoint_every if recipe.checkpoint_every else 0}
    if recipe.optimizer == "adamw":
        return {**values, "optimizer": "Adam"}
    values.update(optimizer="SGD", optimizer_momentum=recipe.momentum, optimizer_weight_decay=recipe.weight_decay,
                  optimizer_cosine_lr=recipe.schedule == "cosine")
    if recipe.schedule == "cosine":
        return {**values, "optimizer_warmup_ratio": recipe.warmup_ratio}
    milestones = list(recipe.milestones) if recipe.schedule == "multistep" else []
    return {**values, "optimizer_decay_at_epochs": milestones, "optimizer_decay_with_factor": 1.0 / recipe.gamma}


def reference_config_of(model, entry: ReferenceKind, recipe: TrainConfig | None, output_dir: str) -> dict:
    """The reference's ``config.yaml`` for our network configuration ``model`` (an
    ``ImageTransformerConfig``) and recipe: every key of its train.py in its order, ours where we
    have one, its defaults elsewhere.

    Raises:
        InputError: a network the reference cannot build (named: heads narrower or wider than it
            makes them, a learned absolute position embedding, another input than RGB).
    """
    if model.pos_embed != "none":
        raise InputError("the model adds a learned absolute position embedding (pos_embed), which the reference's "
                         "BertImage does not have")
    if model.in_chans != 3:
        raise InputError(f"the reference's BertImage takes RGB images (3 channels); this model takes {model.in_chans}")
    if entry.kind != "content" and model.head_dim not in (None, model.dim):
        raise InputError(f"the reference's {entry.kind} heads are as wide as the model (head_dim = D = {model.dim}); "
                         f"this model has head_dim={model.head_dim}")
    flags = {"use_attention_data": False, "attention_isotropic_gaussian": False, **entry.flags}
    config = {**REFERENCE_DEFAULTS, **flags, **_reference_training(recipe), **entry.reference_values(model),
              "hidden_size": model.dim, "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_heads,
              "intermediate_size": model.mlp_dim, "hidden_dropout_prob": model.dropout,
              "attention_probs_dropout_prob": model.attn_dropout, "layer_norm_eps": model.layer_norm_eps,
              "pooling_concatenate_size": model.pooling, "output_dir": output_dir,
              "prune_degenerated_heads": any(h != model.num_heads for h in model.heads())}
    return config
