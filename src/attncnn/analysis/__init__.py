"""See what attention learned: maps from real activations, per-head metrics, figures, reports.

* :mod:`.maps`: capture attention probabilities/scores through forward hooks on real inputs;
* :mod:`.metrics`: per-head distance, peak, entropy, quadratic parameters, degenerate heads,
  distance to a convolution's grid of shifts; :func:`epoch_metrics` for the training log;
* :mod:`.locality`: mean attention distance and normalised entropy per head (ViT Fig. 7);
  :mod:`.rollout`: attention rollout (Abnar & Zuidema 2020); :mod:`.locality_figure`: ViT's Fig. 7;
* :mod:`.figures`: the paper's figures (matplotlib, Agg);
* :mod:`.report`: Table 1 for trained runs;
* :mod:`.pruning`: degenerate heads removed; :mod:`.pruned_run`: a run pruned, then fine-tuned
  (``attncnn prune``);
* :mod:`.viewer`: the offline interactive page (``attncnn viewer``);
* :mod:`.plotting`, :mod:`.inspection`: the figures and metrics of runs that ``attncnn plot`` and
  ``attncnn inspect`` write (the command line is :mod:`attncnn.cli`).
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
