"""A suite's runs followed over epochs, from ``metrics.jsonl`` alone (no checkpoint needed).

Position-only models log every layer's grid distance (``attn/layerL/grid_distance``, tokens) and,
for quadratic heads, every head's centre and spread (``attn/layerL/headH/center_row``,
``center_col``, ``alpha`` or ``inverse_covariance_rr/_rc/_cc``) after each epoch
(:func:`~attncnn.analysis.metrics.epoch_metrics`). From them:

* :func:`settled_rows` / :func:`settled_table`: the criterion fixed before the long runs were trained:
  **a layer has settled on a grid when its grid distance is below** :data:`SETTLED_BELOW` **= 0.5
  tokens**, per layer and seed at chosen epochs;
* :func:`seed_layer_curves`: a metric per layer over epochs, one curve per seed;
* :func:`accuracy_bands`: test accuracy over epochs as the mean and the min/max over seeds;
* :func:`quadratic_heads`: one layer's centres and Sigma^-1 at one epoch (paper Fig. 3).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import numpy as np

from ..studies.shapes import SETTLED_BELOW
from .results import RunResult

__all__ = ["SETTLED_BELOW", "layer_values", "settled_rows", "settled_table", "seed_layer_curves", "accuracy_bands",
           "quadratic_heads", "evolution_epochs"]


def layer_values(record: dict, key: str) -> list[float]:
    """``attn/layer{l}/{key}`` of one record for layers 1, 2, ... in order (``[]`` when not logged)."""
    found = {}
    for name, value in record.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "attn" and parts[2] == key and isinstance(value, (int, float)):
            found[int(parts[1].removeprefix("layer"))] = float(value)
    return [found[layer] for layer in sorted(found)]


def settled_rows(records: Sequence[dict], epochs: Sequence[int], threshold: float = SETTLED_BELOW) -> list[dict]:
    """Per chosen epoch that the run has and that logs grid distances: ``{"epoch", "grid_distance":
    [per layer, tokens], "settled": [per layer: grid distance < threshold], "settled_layers": count}``.

    Args:
        records: the run's ``metrics.jsonl`` records.
        epochs: the epochs to judge (e.g. 6, 20, 40, 60); those the run does not have are left out.
        threshold: tokens (default :data:`SETTLED_BELOW`).
    """
    by_epoch = {r["epoch"]: r for r in records if isinstance(r.get("epoch"), int)}
    rows = []
    for epoch in epochs:
        distances = layer_values(by_epoch.get(epoch, {}), "grid_distance")
        if distances:
            settled = [math.isfinite(d) and d < threshold for d in distances]
            rows.append({"epoch": epoch, "grid_distance": distances, "settled": settled,
                         "settled_layers": sum(settled)})
    return rows


def settled_table(results: dict[str, list[RunResult]], epochs: Sequence[int],
                  threshold: float = SETTLED_BELOW) -> list[dict]:
    """:func:`settled_rows` of every finished run that logs grid distances, each row with its
    ``preset`` and ``seed`` added (suite order, then seed order, then epoch)."""
    table = []
    for preset, runs in results.items():
        for result in runs:
            table += [{"preset": preset, "seed": result.job.seed, **row}
                      for row in settled_rows(result.epoch_records, epochs, threshold)]
    return table


def seed_layer_curves(results: Sequence[RunResult], key: str) -> dict[int, dict[int, tuple[list[int], list[float]]]]:
    """``{layer: {seed: (epochs, values)}}`` of ``attn/layer{l}/{key}`` (e.g. ``"grid_distance"``)."""
    curves: dict[int, dict[int, tuple[list[int], list[float]]]] = {}
    for result in results:
        for record in result.epoch_records:
            for layer, value in enumerate(layer_values(record, key), start=1):
                epochs, values = curves.setdefault(layer, {}).setdefault(result.job.seed, ([], []))
                epochs.append(record["epoch"])
                values.append(value)
    return curves


def accuracy_bands(results: Sequence[RunResult]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Test accuracy over the epochs every run evaluated: ``(epochs, mean, min, max)`` over the
    runs (fractions). One run gives its own curve three times."""
    per_run = [{r["epoch"]: r["test_accuracy"] for r in result.records} for result in results]
    epochs = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    values = [[p[e] for p in per_run] for e in epochs]
    return epochs, [statistics.fmean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def quadratic_heads(record: dict, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Centres ``(N_h, 2)`` (row, col shift in tokens) and Sigma^-1 ``(N_h, 2, 2)`` of one quadratic
    layer as ``record`` logged them (isotropic heads: ``2 alpha I``); None when the record holds no
    centres for that layer, or no spreads (full-covariance runs logged before the matrix was)."""
    base = f"attn/layer{layer}/head"
    centers, invs, head = [], [], 1
    while f"{base}{head}/center_row" in record:
        prefix = f"{base}{head}/"
        centers.append([record[prefix + "center_row"], record[prefix + "center_col"]])
        if prefix + "alpha" in record:
            invs.append(2 * record[prefix + "alpha"] * np.eye(2))
        elif prefix + "inverse_covariance_rr" in record:
            rr, rc, cc = (record[prefix + f"inverse_covariance_{k}"] for k in ("rr", "rc", "cc"))
            invs.append(np.array([[rr, rc], [rc, cc]]))
        else:
            return None
        head += 1
    if not centers:
        return None
    return np.asarray(centers, dtype=np.float64), np.asarray(invs, dtype=np.float64)


def evolution_epochs(available: Sequence[int], chosen: Sequence[int]) -> list[int]:
    """The epochs drawn over training: the first one, those of ``chosen`` that exist, the last."""
    have = sorted(set(available))
    if not have:
        return []
    return sorted({have[0], have[-1], *(e for e in chosen if e in have)})
