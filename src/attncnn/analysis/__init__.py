"""See what attention learned: maps from real activations, per-head metrics, figures, reports.

:mod:`.maps` (forward hooks on real inputs), :mod:`.metrics` (per-head statistics, degenerate
heads, distance to a convolution's grid of shifts), :mod:`.locality` and :mod:`.locality_figure`
(ViT Fig. 7), :mod:`.rollout` (Abnar & Zuidema 2020), :mod:`.figures` (the paper's figures),
:mod:`.report` (Table 1), :mod:`.pruning` and :mod:`.pruned_run` (``attncnn prune``: degenerate
heads removed, then a fine-tuning run), :mod:`.viewer` (``attncnn viewer``), :mod:`.plotting` and
:mod:`.inspection` (``attncnn plot`` and ``attncnn inspect``).
"""

from __future__ import annotations

from .locality import LayerLocality, Locality, head_locality, model_locality
from .maps import (VALUE_KINDS, LayerMaps, attention_layers, attention_maps, attention_maps_by_kind,
                   default_grid_size, layer_values, layer_values_by_kind, position_maps, record_attention)
from .metrics import (DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE, degenerate_heads, epoch_metrics,
                      flatten_metrics, grid_distance, head_statistics, kernel_grids, model_metrics,
                      optimal_assignment, quadratic_head_parameters)
from .rollout import attention_rollout, model_rollout

__all__ = [
    "VALUE_KINDS", "LayerMaps", "attention_layers", "attention_maps", "attention_maps_by_kind", "default_grid_size",
    "layer_values", "layer_values_by_kind", "position_maps", "record_attention", "DEFAULT_CONDITION_NUMBER",
    "DEFAULT_MIN_EIGENVALUE", "degenerate_heads", "epoch_metrics", "flatten_metrics", "grid_distance",
    "head_statistics", "kernel_grids", "model_metrics", "optimal_assignment", "quadratic_head_parameters",
    "LayerLocality", "Locality", "head_locality", "model_locality", "attention_rollout", "model_rollout",
]
