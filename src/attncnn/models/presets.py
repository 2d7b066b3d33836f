"""Named model presets after the paper's runs (``runs/*`` of the reference code), and the builder.

Each preset fixes the network (``arch`` + configuration keywords) and the training recipe
that goes with it (keys of :class:`attncnn.runs.TrainConfig`), plus the paper's Table 1
numbers for comparison. Parameter counts for 10 classes are pinned by tests (counted from the reference code's modules).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .._typecheck import check_options
from ..errors import InputError
from .image_transformer import ImageTransformer, ImageTransformerConfig
from .resnet import ResNet, ResNetConfig

__all__ = ["Preset", "PRESETS", "ARCHITECTURES", "get_preset", "list_presets", "build_model",
           "build_model_from_config", "preset_model_config", "count_parameters"]

#: architecture name (the model class's ``arch``, stored in checkpoints) -> (config dataclass, model class)
ARCHITECTURES: dict[str, tuple[type, type[nn.Module]]] = {
    cls.arch: (config, cls) for config, cls in ((ImageTransformerConfig, ImageTransformer), (ResNetConfig, ResNet))
}


@dataclass(frozen=True)
class Preset:
    """A named network + training recipe.

    Attributes:
        name: preset name, e.g. ``"quadratic"``.
        description: one line for ``attncnn presets``.
        arch: key of :data:`ARCHITECTURES`.
        model: configuration keywords of the architecture.
        train: training-recipe overrides (keys of ``attncnn.runs.TrainConfig``).
        paper: the paper's Table 1 entry (``accuracy`` as a fraction or None, ``params`` text).
    """

    name: str
    description: str
    arch: str
    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    paper: dict = field(default_factory=dict)


_PAPER_RECIPE = {"epochs": 300, "batch_size": 100, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
                 "schedule": "cosine", "warmup_ratio": 0.05}

PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("resnet18", "CIFAR ResNet18 baseline (runs/resnet)", "resnet", {},
           {**_PAPER_RECIPE, "schedule": "multistep", "milestones": [80, 150, 250]},
           {"accuracy": 0.938, "params": "11.2 M", "note": "accuracy recalled, unconfirmed"}),
    Preset("quadratic", "SA quadratic emb.: 9 isotropic Gaussian heads (runs/quadratic)", "image-transformer",
           {"attention": "quadratic"}, _PAPER_RECIPE,
           {"accuracy": 0.938, "params": "12.1 M"}),
    Preset("quadratic-generalized", "SA quadratic emb., full 2x2 covariance (runs/quadratic-generalized)",
           "image-transformer", {"attention": "quadratic-generalized"}, _PAPER_RECIPE,
           {"accuracy": None, "params": "-", "note": "paper: no gain over isotropic"}),
    Preset("learned", "SA learned emb., position only, 400-d tables per axis (runs/learned)",
           "image-transformer", {"attention": "learned"}, _PAPER_RECIPE,
           {"accuracy": 0.918, "params": "12.3 M", "note": "accuracy recalled, unconfirmed"}),
    Preset("learned-content", "SA learned emb. + content-based att. (q.k + q.r, 200-d tables)",
           "image-transformer", {"attention": "learned-content"}, _PAPER_RECIPE,
           {"accuracy": 0.871, "params": "29.5 M", "note": "accuracy recalled, unconfirmed"}),
    Preset("learned-content-9ffaa", "SA learned emb. + content in the reference repository's form at 9ffaa30 "
           "(w.r + q.k/sqrt(D), 400-d tables, per-head key vectors; 29.6 M)",
           "image-transformer", {"attention": "learned-content-9ffaa"}, _PAPER_RECIPE,
           {"accuracy": None, "params": "-", "note": "Table 1's row (29.5 M) counts the q.r form: learned-content"}),
    Preset("many-heads", "SA quadratic emb. with 16 heads (runs/many-heads)", "image-transformer",
           {"attention": "quadratic", "num_heads": 16}, _PAPER_RECIPE,
           {"accuracy": None, "params": "-"}),
    Preset("demo", "small quadratic model and short schedule: trains in minutes on 2 CPU cores",
           "image-transformer",
           {"attention": "quadratic", "num_layers": 2, "num_heads": 4, "dim": 64, "mlp_dim": 128,
            "pooling": 4, "dropout": 0.0, "attn_dropout": 0.0},
           {**_PAPER_RECIPE, "epochs": 5, "checkpoint_every": 1, "keep_checkpoints": 0},
           {"accuracy": None, "params": "-", "note": "not in the paper"}),
]}


# The CPU-scale study (`attncnn reproduce mini`): the paper's geometry and recipe shape at width 64
# and 6 epochs, so that the suite fits in hours on 2 CPU cores (benchmarks/results/HISTORY.md).
# Dropout is off: a few epochs underfit, there is nothing to regularise. The ResNet's widths
# (11, 22, 44, 88) give a parameter count comparable to the attention models' (332 k vs 349 k).
_MINI_MODEL = {"num_layers": 6, "num_heads": 9, "dim": 64, "mlp_dim": 128, "pooling": 2,
               "dropout": 0.0, "attn_dropout": 0.0}
_MINI_RECIPE = {**_PAPER_RECIPE, "epochs": 6, "checkpoint_every": 1, "keep_checkpoints": 0,
                "checkpoint_every_steps": 100}
_MINI_NOTE = {"accuracy": None, "params": "-", "note": "CPU-scale version of a Table 1 model"}

PRESETS.update({p.name: p for p in [
    Preset("quadratic-mini", "CPU-scale quadratic: width 64, MLP 128, no dropout, 6 epochs (see `reproduce mini`)",
           "image-transformer", {**_MINI_MODEL, "attention": "quadratic"}, _MINI_RECIPE, _MINI_NOTE),
    Preset("quadratic-generalized-mini", "CPU-scale quadratic with full 2x2 covariance (width 64, 6 epochs)",
           "image-transformer", {**_MINI_MODEL, "attention": "quadratic-generalized"}, _MINI_RECIPE, _MINI_NOTE),
    Preset("learned-mini", "CPU-scale learned position-only: 64-d tables per axis (width 64, 6 epochs)",
           "image-transformer", {**_MINI_MODEL, "attention": "learned"}, _MINI_RECIPE, _MINI_NOTE),
    Preset("learned-content-mini", "CPU-scale learned + content attention (width 64, 6 epochs; the slowest mini "
           "model to train: its maps are computed per image)",
           "image-transformer", {**_MINI_MODEL, "attention": "learned-content"}, _MINI_RECIPE, _MINI_NOTE),
    Preset("learned-content-9ffaa-mini", "CPU-scale learned + content attention in the reference repository's "
           "9ffaa30 form (w.r + q.k/sqrt(D), 64-d tables; width 64, 6 epochs)",
           "image-transformer", {**_MINI_MODEL, "attention": "learned-content-9ffaa"}, _MINI_RECIPE, _MINI_NOTE),
    Preset("resnet18-mini", "CPU-scale CIFAR ResNet18: widths 11/22/44/88 (332 k parameters), 6 epochs, "
           "cosine like the attention models", "resnet", {"widths": [11, 22, 44, 88]}, _MINI_RECIPE, _MINI_NOTE),
]})


# Convolutional initialisation and ConViT's gated positional self-attention (GPSA, d'Ascoli et al.
# 2021), which starts with ConViT's local init. `gpsa-mini` splits its width like ConViT (heads of
# width 16), for a step cheap enough for the sample-efficiency grid. The `*-conv-mini` presets are
# the mini quadratic and learned models with every head starting on one shift of the 3x3 kernel.
_INIT_NOTE = {"accuracy": None, "params": "-", "note": "not in the paper (local init, GPSA)"}

PRESETS.update({p.name: p for p in [
    Preset("gpsa", "ConViT's gated positional self-attention, 9 locally initialised heads, paper geometry and "
           "recipe", "image-transformer", {"attention": "gpsa", "init": "conv"}, _PAPER_RECIPE, _INIT_NOTE),
    Preset("gpsa-mini", "CPU-scale GPSA (ConViT), local init, 9 heads of width 16 (width 64, 6 epochs)",
           "image-transformer", {**_MINI_MODEL, "attention": "gpsa", "init": "conv", "head_dim": 16}, _MINI_RECIPE,
           _INIT_NOTE),
    Preset("quadratic-conv", "SA quadratic emb. whose heads start on the 3x3 kernel's shifts (init=conv, "
           "Theorem 1 as an initialisation), paper geometry and recipe", "image-transformer",
           {"attention": "quadratic", "init": "conv"}, _PAPER_RECIPE, _INIT_NOTE),
    Preset("learned-conv", "SA learned emb., position only, heads start on the 3x3 kernel's shifts (init=conv), "
           "paper geometry and recipe", "image-transformer", {"attention": "learned", "init": "conv"},
           _PAPER_RECIPE, _INIT_NOTE),
    Preset("quadratic-conv-mini", "CPU-scale quadratic, heads start on the 3x3 kernel's shifts (init=conv, "
           "width 64, 6 epochs)", "image-transformer", {**_MINI_MODEL, "attention": "quadratic", "init": "conv"},
           _MINI_RECIPE, _INIT_NOTE),
    Preset("learned-conv-mini", "CPU-scale learned position-only, heads start on the 3x3 kernel's shifts "
           "(init=conv, width 64, 6 epochs)", "image-transformer",
           {**_MINI_MODEL, "attention": "learned", "init": "conv"}, _MINI_RECIPE, _INIT_NOTE),
]})


# ConViT's claim as ConViT states it: `deit-mini` is the DeiT-style baseline (content attention and
# a learned absolute position embedding); `convit-mini` is GPSA with ConViT's choices (9 heads of 8
# on width 72, so the local init sets the value projection to the identity; queries and keys without
# bias, std 0.02). Both train with ConViT's AdamW recipe; `convit-mini --set init=random` is
# ConViT's ablation without local init.
_CONVIT_MODEL = {**_MINI_MODEL, "dim": 72, "mlp_dim": 144, "head_dim": 8}
_CONVIT_RECIPE = {**_MINI_RECIPE, "optimizer": "adamw", "lr": 5e-4, "weight_decay": 0.05}
_CONVIT_NOTE = {"accuracy": None, "params": "-", "note": "not in the paper (ConViT's setup)"}

PRESETS.update({p.name: p for p in [
    Preset("deit-mini", "DeiT-style baseline: content attention + learned absolute position embedding, 9 heads of "
           "width 8 (width 72, AdamW, 6 epochs)", "image-transformer",
           {**_CONVIT_MODEL, "attention": "content", "pos_embed": "learned"}, _CONVIT_RECIPE, _CONVIT_NOTE),
    Preset("convit-mini", "GPSA as ConViT sets it up: 9 heads of width 8 (width 72), identity value projection, "
           "q/k without bias at std 0.02, local init (AdamW, 6 epochs)", "image-transformer",
           {**_CONVIT_MODEL, "attention": "gpsa", "init": "conv", "qk_bias": False, "qk_init_std": 0.02},
           _CONVIT_RECIPE, _CONVIT_NOTE),
]})


def list_presets() -> list[str]:
    """Names of all presets, in the order of the paper's Table 1 then extras."""
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """Look a preset up by name.

    Raises:
        InputError: unknown name (the message lists the valid ones).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def _make_config(arch: str, kwargs: dict):
    """Build the architecture's config dataclass, rejecting unknown or ill-typed keys by name."""
    if arch not in ARCHITECTURES:
        raise InputError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    cls = ARCHITECTURES[arch][0]
    check_options(kwargs, cls, "model option", owner=arch)
    return cls(**kwargs)


def build_model_from_config(arch: str, config: dict) -> nn.Module:
    """Build a network from an architecture name and its configuration keywords.

    Raises:
        InputError: unknown architecture, unknown or ill-typed option (named in the message).
    """
    cfg = _make_config(arch, config)
    return ARCHITECTURES[arch][1](cfg)


def preset_model_config(name: str, num_classes: int = 10, **overrides):
    """The configuration dataclass of a preset network, without building it (no weights allocated):
    everything :func:`build_model` would reject for these arguments is rejected here.

    Returns:
        ``(arch, config)``: the key of :data:`ARCHITECTURES` and its configuration dataclass.

    Raises:
        InputError: unknown preset or override, ill-typed or out-of-range value (named in the message).
    """
    preset = get_preset(name)
    return preset.arch, _make_config(preset.arch, {**preset.model, "num_classes": num_classes, **overrides})


def build_model(name: str, num_classes: int = 10, **overrides) -> nn.Module:
    """Build a preset network.

    Args:
        name: a preset name (see :func:`list_presets`).
        num_classes: size of the classifier output.
        **overrides: configuration keywords replacing the preset's (e.g. ``num_heads=16``).

    Returns:
        A module mapping normalised images ``(B, 3, H, W)`` to logits ``(B, num_classes)``,
        with PyTorch's default initialisation (as the reference code).

    Raises:
        InputError: unknown preset or override (the message lists the valid names).
    """
    arch, config = preset_model_config(name, num_classes, **overrides)
    return ARCHITECTURES[arch][1](config)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameter values (the paper's "# params")."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
