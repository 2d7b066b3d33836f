"""The paper's figures drawn from a suite's trained models (PAPER.md 5.3; the figure code is
:mod:`attncnn.analysis.figures`, this module only chooses which run feeds which figure).

* Fig. 2: test accuracy against epoch of every model (first finished seed of each);
* Fig. 3: the centres of one quadratic layer after each epoch (periodic checkpoints);
* Fig. 4: every layer's Gaussian contours of the trained quadratic models;
* Fig. 5: layers x heads maps of the learned position-only model for the central query;
* Fig. 6: layers x heads maps of the content model for one test image and averaged over 100;
* per-layer attention distance and distance to the grid of shifts against epoch (position-only
  models log them every epoch; the curve is the mean over the finished seeds).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from ..analysis.figures import (accuracy_figure, attention_grid_figure, layer_curves_figure,
                                quadratic_epochs_figure, quadratic_layers_figure, save_figure)
from ..analysis.maps import attention_layers, attention_maps, default_grid_size, position_maps
from ..analysis.runs import test_count, test_images
from ..training import load_model
from .summary import RunResult, layer_curves

log = logging.getLogger("attncnn.reproduce")

__all__ = ["suite_figures", "EVOLUTION_LAYERS"]

#: layers drawn across epochs (paper Fig. 3): the first, where the grid forms, and a deeper one
EVOLUTION_LAYERS = (1, 4)


def _figure(fig, path: Path, formats: Sequence[str], written: dict[str, Path], key: str) -> None:
    written[key] = save_figure(fig, path, formats)[0]


def _quadratic(result: RunResult, out: Path, formats, written: dict[str, Path]) -> None:
    preset, run = result.job.preset, result.run
    _figure(quadratic_layers_figure(run.model, title=f"{preset}: every layer after epoch "
                                                     f"{len(result.epoch_records)} (50 % solid, 90 % dotted mass)"),
            out / f"fig4-{preset}-centers", formats, written, f"fig4 {preset}")
    snapshots = [(epoch, load_model(path)[0]) for epoch, path in run.periodic_checkpoints()]
    if not snapshots:
        log.warning("%s: no periodic checkpoints, so no figure of the centres over epochs", run.path)
        return
    for layer in EVOLUTION_LAYERS:
        if layer <= run.model.config.num_layers:
            fig = quadratic_epochs_figure(snapshots, layer, title=f"{preset}: layer {layer} after each epoch")
            _figure(fig, out / f"fig3-{preset}-layer{layer}-epochs", formats, written, f"fig3 {preset} layer {layer}")


def _content(result: RunResult, out: Path, formats, written: dict[str, Path], *, image: int, average: int,
             data: str | None, data_dir: str | None) -> None:
    preset, run = result.job.preset, result.run
    grid = default_grid_size(run.model)
    query = (grid[0] // 2, grid[1] // 2)
    average = min(average, test_count(run, data=data, data_dir=data_dir))   # a small data set has fewer
    images, raw = test_images(run, [image], data=data, data_dir=data_dir)
    fig = attention_grid_figure(attention_maps(run.model, images), query, image=raw[0],
                                title=f"{preset}: test image {image}, query {query}")
    _figure(fig, out / f"fig6-{preset}-image{image}", formats, written, f"fig6 {preset} image")
    images, _ = test_images(run, list(range(average)), data=data, data_dir=data_dir)
    fig = attention_grid_figure(attention_maps(run.model, images, average=True), query,
                                title=f"{preset}: average over {average} test images, query {query}")
    _figure(fig, out / f"fig6-{preset}-average{average}", formats, written, f"fig6 {preset} average")


def _distances(preset: str, results: Sequence[RunResult], out: Path, formats, written: dict[str, Path]) -> None:
    panels = {"attention distance (tokens)": layer_curves(results, "distance"),
              "distance to the 3x3 grid of shifts (tokens)": layer_curves(results, "grid_distance")}
    if all(panels.values()):
        seeds = len(results)
        fig = layer_curves_figure(panels, title=f"{preset}: per layer, after each epoch "
                                                f"(mean over {seeds} seed{'s' if seeds > 1 else ''})")
        _figure(fig, out / f"distances-{preset}", formats, written, f"distances {preset}")


def _figure_kind(model) -> str | None:
    """Which figure a model's attention gets, asked of its layers: ``"centres"`` (quadratic heads),
    ``"position maps"`` (other position-only heads), ``"score terms"`` (content + positional scores,
    not gated), None otherwise (ResNet, plain content, GPSA)."""
    try:
        layers = attention_layers(model)
    except ValueError:
        return None
    if all(layer.has_centers for layer in layers):
        return "centres"
    if all(layer.position_only for layer in layers):
        return "position maps"
    if all(layer.has_positional_term and not layer.position_only and not layer.has_gates for layer in layers):
        return "score terms"
    return None


def suite_figures(results: dict[str, list[RunResult]], out: str | Path, *, formats: Sequence[str] = ("png",),
                  image: int = 0, average: int = 100, data: str | None = None,
                  data_dir: str | None = None) -> dict[str, Path]:
    """Draw every figure the finished runs allow into ``out``; returns ``{figure key: first file}``.

    Args:
        results: preset -> finished runs (:func:`~attncnn.reproduce.summary.finished_runs`).
        formats: matplotlib formats (the first one's file is returned).
        image: test image of the single-image content map (Fig. 6).
        average: number of test images the averaged content map uses (paper: 100).
        data, data_dir: data set for the test images (default: each run's own).

    Raises:
        attncnn.data.DataError: the test images of a content model cannot be read.
    """
    out = Path(out)
    written: dict[str, Path] = {}
    curves = {preset: ([r["epoch"] for r in runs[0].records], [r["test_accuracy"] for r in runs[0].records])
              for preset, runs in results.items() if runs}
    if curves:
        _figure(accuracy_figure(curves, title="Test accuracy (first seed of each model)"), out / "fig2-accuracy",
                formats, written, "fig2")
    for preset, runs in results.items():
        first = runs[0]
        kind = _figure_kind(first.run.model)
        if kind == "centres":
            _quadratic(first, out, formats, written)
        if kind == "position maps":
            grid = default_grid_size(first.run.model)
            fig = attention_grid_figure(position_maps(first.run.model), (grid[0] // 2, grid[1] // 2),
                                        title=f"{preset}: attention probabilities of the central query")
            _figure(fig, out / f"fig5-{preset}-maps", formats, written, f"fig5 {preset}")
        if kind == "score terms":
            _content(first, out, formats, written, image=image, average=average, data=data, data_dir=data_dir)
        _distances(preset, runs, out, formats, written)
    return written
