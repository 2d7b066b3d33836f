"""Figures of the sample-efficiency grid (the drawing code is :mod:`attncnn.analysis.figures`):

* ``efficiency-accuracy``: final test accuracy against training-set size, one line per model;
* ``efficiency-seen-<pct>``: test accuracy against seen images in one training-set size;
* ``efficiency-distance-<pct>``: per-layer attention distance over training of each position-only
  model (logged every epoch), for one training-set size;
* ``efficiency-gates``: GPSA's mean gate per layer over training, one panel per GPSA row and
  training-set size.

Curves are means over the finished seeds of a cell, against seen images (epoch x subset size);
``efficiency-accuracy`` also marks each seed of the cells that have several.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from ..analysis.figures import accuracy_figure, layer_curves_figure, save_figure
from .grid import row_of
from .grid_report import Cells
from .suites import Job
from .summary import layer_curves

__all__ = ["grid_figures"]


def _subset(results: Cells, key: tuple[str, str]) -> int:
    return dict(results[key][0].job.overrides)["train_subset"]


def _accuracy_curve(results: Cells, key: tuple[str, str]) -> tuple[list[int], list[float]]:
    """(seen images, mean test accuracy) at the evaluated epochs common to the cell's seeds."""
    per_seed = [{r["epoch"]: r["test_accuracy"] for r in run.records} for run in results[key]]
    epochs = sorted(set.intersection(*(set(s) for s in per_seed)))
    return [e * _subset(results, key) for e in epochs], [statistics.fmean(s[e] for s in per_seed) for e in epochs]


def _per_seen(curves: dict, subset: int) -> dict:
    return {layer: ([e * subset for e in epochs], values) for layer, (epochs, values) in curves.items()}


def grid_figures(jobs: Sequence[Job], results: Cells, out: str | Path, *, formats: Sequence[str] = ("png",),
                 gate_rows: Sequence[str] = ("gpsa-mini",)) -> dict[str, Path]:
    """Draw every figure the finished cells allow into ``out``; returns ``key -> first file``.

    ``gate_rows``: the GPSA rows whose gates ``efficiency-gates`` draws (the grid's ``gate_rows``).
    """
    out, written = Path(out), {}
    presets = list(dict.fromkeys(row_of(j) for j in jobs))
    cells = list(dict.fromkeys(j.cell for j in jobs))
    slug = {c: c.replace(" %", "pct") for c in cells}

    def save(fig, name: str) -> None:
        written[name] = save_figure(fig, out / name, formats)[0]

    by_size, seeds = {}, {}
    for preset in presets:
        finished = [(preset, c) for c in cells if (preset, c) in results]
        done = [(_subset(results, key), statistics.fmean(r.final_accuracy for r in results[key])) for key in finished]
        if done:
            by_size[preset] = tuple(zip(*done))
        # every seed of a cell with several, so a mean drawn from a wide spread shows it
        spread = [(_subset(results, key), r.final_accuracy) for key in finished if len(results[key]) > 1
                  for r in results[key]]
        if spread:
            seeds[preset] = tuple(zip(*spread))
    if by_size:
        title = "Final test accuracy, equal seen images per cell" + (" (line: mean; circles: each seed)"
                                                                      if seeds else "")
        save(accuracy_figure(by_size, title=title, xlabel="training images (class-balanced subset)", logx=True,
                             points=seeds), "efficiency-accuracy")
    for cell in cells:
        curves = {p: _accuracy_curve(results, (p, cell)) for p in presets if (p, cell) in results}
        if curves:
            save(accuracy_figure(curves, title=f"Test accuracy on {cell} of the training set", xlabel="seen images"),
                 f"efficiency-seen-{slug[cell]}")
        panels = {}
        for p in presets:
            if (p, cell) in results:
                distances = layer_curves(results[(p, cell)], "distance")
                if distances:
                    panels[f"{p}: attention distance (tokens)"] = _per_seen(distances, _subset(results, (p, cell)))
        if panels:
            save(layer_curves_figure(panels, title=f"Attention distance per layer over training ({cell} of the "
                                                   "training set)", xlabel="seen images"),
                 f"efficiency-distance-{slug[cell]}")
    named = (lambda row: "GPSA") if len(gate_rows) == 1 else (lambda row: row)
    gates = {f"{named(row)} gate sigmoid(lambda), {c}": _per_seen(layer_curves(results[(row, c)], "gate"),
                                                                 _subset(results, (row, c)))
             for row in gate_rows for c in cells if (row, c) in results}
    if gates and all(gates.values()):
        save(layer_curves_figure(gates, title="GPSA: weight of the positional attention per layer (layer mean)",
                                 xlabel="seen images"), "efficiency-gates")
    return written
