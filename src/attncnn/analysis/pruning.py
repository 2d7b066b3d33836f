"""Pruning degenerate quadratic heads (the paper's pruning; reference runs quadratic-generalized -> -pruned).

A head is degenerate when its attention is nearly uniform or a thin stripe
(:func:`~attncnn.analysis.metrics.degenerate_heads`). Pruning removes its row of ``centers`` and
``spreads`` and its block of input columns of ``value`` (and of output rows of ``value_in``);
queries, keys and the output projection are untouched, as in the reference. The model's
configuration records the new per-layer counts in ``ImageTransformerConfig.layer_heads``, so a
pruned model is saved (:func:`pruned_metadata`) and rebuilt like any other. Fine-tuning
(:func:`attncnn.analysis.pruned_run.finetune_pruned`) follows the reference
``runs/quadratic-generalized-pruned``: a new run with a fresh optimiser and a restarted warm-up +
cosine schedule, 100 epochs at lr 0.01 (10x smaller than the original run), other options unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch
from torch import nn

from ..data import run_data
from ..errors import InputError
from ..layers import QuadraticAttention
from ..models import ImageTransformerConfig, count_parameters
from ..runs import resolve_config
from ..runs.config import recipe_from_dict, without_paths
from .maps import attention_layers
from .metrics import DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE, degenerate_heads

__all__ = ["PruneResult", "prune_layer", "prune_degenerate_heads", "pruned_metadata",
           "finetune_config", "PRUNED_CHECKPOINT", "FINETUNE_LR"]

log = logging.getLogger(__name__)

#: Name of the pruned starting weights inside a fine-tuned run folder (``checkpoints/pruned.safetensors``).
PRUNED_CHECKPOINT = "pruned"
#: Peak learning rate of the reference's fine-tune, 10x below the original run's 0.1
#: (``runs/quadratic-generalized-pruned/run.sh``; it runs 100 epochs).
FINETUNE_LR = 0.01


@dataclass
class PruneResult:
    """What :func:`prune_degenerate_heads` did.

    Attributes:
        pruned: per layer, the 0-based indices of the removed heads.
        heads_before, heads_after: per layer head counts.
        parameters_before, parameters_after: trainable parameter counts of the model.
    """

    pruned: list[list[int]]
    heads_before: list[int]
    heads_after: list[int]
    parameters_before: int
    parameters_after: int

    def to_dict(self) -> dict:
        return {"pruned": self.pruned, "pruned_per_layer": [len(p) for p in self.pruned],
                "heads_before": self.heads_before, "heads_after": self.heads_after,
                "parameters_before": self.parameters_before, "parameters_after": self.parameters_after}


@torch.no_grad()
def prune_layer(layer: QuadraticAttention, keep: torch.Tensor) -> QuadraticAttention:
    """A copy of ``layer`` with only the heads where ``keep`` is true.

    Args:
        layer: a quadratic attention layer.
        keep: bool ``(N_h,)``; at least one head must be kept.

    Returns:
        A new layer (same device, dtype, training mode) whose output equals the original's
        whenever the removed heads contribute nothing (e.g. their value columns are zero).

    Raises:
        TypeError: not a quadratic layer. ValueError: wrong mask shape or no head kept.
    """
    if not layer.has_centers:
        raise TypeError(f"only quadratic layers can be pruned, got {type(layer).__name__}")
    keep = torch.as_tensor(keep, dtype=torch.bool).cpu()
    if keep.shape != (layer.num_heads,):
        raise InputError(f"keep mask must have shape ({layer.num_heads},), got {tuple(keep.shape)}")
    kept = int(keep.sum())
    if kept == 0:
        raise InputError("cannot prune every head of a layer: the layer would have no output")
    new = QuadraticAttention(layer.dim, kept, full_covariance=layer.full_covariance,
                             center_init_std=layer.center_init_std, spread_init_std=layer.spread_init_std,
                             head_dim=layer.head_dim, out_dim=layer.out_dim, attn_drop=layer.attn_drop.p)
    param = layer.centers
    new = new.to(device=param.device, dtype=param.dtype)
    idx = keep.nonzero().squeeze(1).to(param.device)
    new.centers.copy_(layer.centers[idx])
    new.spreads.copy_(layer.spreads[idx])
    dh = layer.head_dim
    columns = (idx[:, None] * dh + torch.arange(dh, device=param.device)).reshape(-1)   # head blocks
    new.value.weight.copy_(layer.value.weight[:, columns])
    new.value.bias.copy_(layer.value.bias)
    if layer.value_in is not None:
        new.value_in.weight.copy_(layer.value_in.weight[columns])
        new.value_in.bias.copy_(layer.value_in.bias[columns])
    new.train(layer.training)
    return new


def prune_degenerate_heads(model: nn.Module, *, condition_number: float = DEFAULT_CONDITION_NUMBER,
                           min_eigenvalue: float = DEFAULT_MIN_EIGENVALUE) -> PruneResult:
    """Remove every degenerate head of a quadratic image transformer, in place, as the reference code prunes them.

    A layer whose heads are all degenerate keeps its least degenerate head (largest eigenvalue of
    Sigma^-1). Afterwards ``model.config.layer_heads`` holds the per-layer head counts, so the model's
    configuration builds a network that takes ``model.state_dict()`` as it is.

    Raises:
        InputError: the model has no attention blocks or non-quadratic ones.
    """
    layers = attention_layers(model)
    if not all(layer.has_centers for layer in layers):
        raise InputError("pruning degenerate heads needs a quadratic-attention model (a quadratic or "
                         "quadratic-generalized preset)")
    before = count_parameters(model)
    pruned, heads_before, heads_after = [], [], []
    for block, layer in zip(model.blocks, layers):
        bad = degenerate_heads(layer, condition_number=condition_number, min_eigenvalue=min_eigenvalue)
        if bool(bad.all()):
            eig = torch.linalg.eigvalsh(layer.inverse_covariance.detach().double().cpu()).abs().amax(-1)
            bad[int(eig.argmax())] = False
        heads_before.append(layer.num_heads)
        pruned.append(bad.nonzero().squeeze(1).tolist())
        if bool(bad.any()):
            block.attention = prune_layer(layer, ~bad)
        heads_after.append(block.attention.num_heads)
    if isinstance(getattr(model, "config", None), ImageTransformerConfig):
        # replace() re-runs the config's validation; the model itself already has these shapes.
        model.config = dataclasses.replace(model.config, layer_heads=list(heads_after))
    return PruneResult(pruned, heads_before, heads_after, before, count_parameters(model))


def pruned_metadata(model: nn.Module, result: PruneResult, source_metadata: dict, *, source: str,
                    condition_number: float, min_eigenvalue: float) -> dict:
    """Checkpoint metadata for a pruned image transformer, so that ``attncnn.runs.load_model``
    rebuilds it like a network written by the trainer: the source checkpoint's metadata with the
    pruned ``model_config`` (``layer_heads`` set, also in the training config's model options), the
    new parameter count, and a ``pruning`` entry (source, thresholds, removed heads). Write it with
    ``attncnn.runs.save_checkpoint(path, model=model, metadata=...)``.

    Args:
        model: the pruned network (after :func:`prune_degenerate_heads`).
        result: what :func:`prune_degenerate_heads` returned.
        source_metadata: metadata of the checkpoint the model was loaded from.
        source: the run folder or checkpoint the model came from (recorded only).
        condition_number, min_eigenvalue: the thresholds used (recorded only).

    Raises:
        InputError: ``model`` is not an image transformer.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ImageTransformerConfig):
        raise InputError(f"only image transformers can be saved as pruned checkpoints, got {type(model).__name__}")
    # The source's last metrics are left out: they describe the unpruned network.
    meta = {k: v for k, v in source_metadata.items()
            if k in ("epoch", "classes", "dataset", "dataset_name", "image_size", "config")}
    if isinstance(meta.get("config"), dict):
        train_config = dict(meta["config"])
        train_config["model"] = {**(train_config.get("model") or {}), "layer_heads": config.heads()}
        meta["config"] = train_config
    meta.update(arch="image-transformer", model_config=without_paths(dataclasses.asdict(config)), step_in_epoch=0,
                parameters=count_parameters(model),
                pruning={"source": str(source), "source_epoch": source_metadata.get("epoch"),
                         "condition_number": condition_number, "min_eigenvalue": min_eigenvalue,
                         **result.to_dict()})
    return meta


def finetune_config(source_config: dict, layer_heads: list[int], **overrides):
    """The training configuration that fine-tunes a pruned run (reference ``runs/quadratic-generalized-pruned``):
    the source run's stored recipe with ``layer_heads`` added to the model options, ``init_from``
    cleared, and ``overrides`` (None means "keep") on top.

    Returns:
        An ``attncnn.runs.TrainConfig``.

    Raises:
        InputError: the stored configuration is not valid (the message names the key).
    """
    if not isinstance(source_config, dict) or "preset" not in source_config:
        raise InputError("the run stores no training configuration (config.json or the checkpoint's 'config'); "
                         "pruning can only fine-tune runs written by `attncnn train`")
    source_config = recipe_from_dict(source_config)[0].to_dict()
    stored = {k: v for k, v in source_config.items() if k not in ("preset", "model", "init_from")}
    stored["data"] = run_data(stored.get("data"), overrides.get("data"))   # shipped runs store a name only
    model = {**(source_config.get("model") or {}), "layer_heads": list(layer_heads)}
    return resolve_config(source_config["preset"], **{**stored, **{k: v for k, v in overrides.items()
                                                                   if v is not None}}, model=model)
