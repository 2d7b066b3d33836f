"""Any study's figures: :func:`draw_figures` draws those of the shape the study declares (the
figure code is :mod:`attncnn.analysis.figures`; this module only chooses which run feeds which figure).

A Table 1 suite's, from its trained models (the paper's Figs. 2-6): Fig. 2, test accuracy against
epoch (first finished seed of each model); Fig. 3, the centres of one quadratic layer after each
epoch (periodic checkpoints); Fig. 4, every layer's Gaussian contours of the trained quadratic
models; Fig. 5, layers x heads maps of the learned position-only model for the central query;
Fig. 6, layers x heads maps of the content model for one test image and averaged over 100; the
per-layer attention distance and distance to the grid of shifts against epoch (mean over the
finished seeds); ``locality-<model>``: ViT's Fig. 7 after training, one colour per seed.

A suite followed over epochs (``settle_epochs``, e.g. ``mini-long``) draws instead, or besides:
Fig. 2 with every seed (mean line, min/max band); Fig. 3 from the centres and spreads that
``metrics.jsonl`` logged every epoch when the suite's ``evolution_from`` is ``"metrics"`` (every
layer at the first epoch, the ``settle_epochs`` and the last, beside the last epoch of the same run
of the ``baseline`` suite where its folder is there); Fig. 4 of every seed; and the grid distance per
layer over epochs, one line per seed, with the 0.5-token line of "settled".

A sample-efficiency grid's, from its cells' logs, as means over a cell's finished seeds against seen
images (epoch x subset size): ``efficiency-accuracy`` (final test accuracy against training-set size,
one line per model, each seed marked where a cell has several); ``efficiency-seen-<pct>`` (test
accuracy against seen images); ``efficiency-distance-<pct>`` (per-layer attention distance of each
position-only model); ``efficiency-gates`` (GPSA's mean gate per layer, one panel per GPSA row and
training-set size)."""

from __future__ import annotations

import logging
import statistics
import textwrap
from pathlib import Path
from typing import Sequence

from ...analysis.epoch_figures import centers_over_epochs_figure, seed_curves_figure
from ...analysis.figures import (accuracy_figure, attention_grid_figure, layer_curves_figure, quadratic_epochs_figure,
                                 quadratic_layers_figure, save_figure)
from ...analysis.locality import Locality
from ...analysis.locality_figure import locality_figure
from ...analysis.maps import attention_layers, attention_maps, default_grid_size, position_maps
from ...analysis.runs import test_count, test_images
from ...runs import RunFolder, load_model
from ..running.runner import Job, rows_and_cells
from ..studies import Grid, Study, Suite
from .epochs import accuracy_bands, evolution_epochs, quadratic_heads, seed_layer_curves
from .locality import run_locality
from .results import Cells, RunResult, layer_curves

log = logging.getLogger("attncnn.reproduce")

__all__ = ["draw_figures", "EVOLUTION_LAYERS"]

#: layers drawn across epochs (paper Fig. 3): the first, where the grid forms, and a deeper one
EVOLUTION_LAYERS = (1, 4)
#: Fig. 6: the test image of the single-image content map, and how many test images the averaged one uses
#: (the paper's 100)
FIG6_IMAGE, FIG6_AVERAGE = 0, 100


class _Figures(dict):
    """Figure key -> first file (of ``formats``) of each figure drawn into ``out``."""

    def __init__(self, out: Path, formats: Sequence[str]):
        super().__init__()
        self.out, self.formats = out, formats

    def save(self, fig, name: str, key: str | None = None) -> None:
        self[key or name] = save_figure(fig, self.out / name, self.formats)[0]

    def withheld(self, result: RunResult, names: dict[str, str]) -> bool:
        """Whether ``result``'s run was shipped without its weights. Then ``names`` (figure key ->
        file name without suffix), drawn from those weights, are not drawn again: each one's file drawn
        before they were withheld stays, and is listed where it is there."""
        if result.run.model is not None:
            return False
        kept = {key: (self.out / name).with_suffix(f".{self.formats[0]}") for key, name in names.items()}
        kept = {key: path for key, path in kept.items() if path.is_file()}
        self.update(kept)
        log.info("%s: shipped without its weights, so %s %s not drawn again (%d of %d drawn before and kept)",
                 result.run.path, " and ".join(names), "is" if len(names) == 1 else "are", len(kept), len(names))
        return True


def _fig4(result: RunResult, figs: _Figures, *, seed_in_name: bool = False) -> None:
    preset = result.job.preset
    seed = f" seed {result.job.seed}" if seed_in_name else ""
    name, key = f"fig4-{preset}{seed.replace(' ', '-')}-centers", f"fig4 {preset}{seed}"
    if not figs.withheld(result, {key: name}):
        figs.save(quadratic_layers_figure(result.run.model, title=f"{preset}{seed}: every layer after epoch "
                                          f"{len(result.epoch_records)} (50 % solid, 90 % dotted mass)"), name, key)


def _checkpoint_evolution(result: RunResult, figs: _Figures) -> None:
    """Fig. 3 from the run's periodic checkpoints."""
    preset, run = result.job.preset, result.run
    drawn = {f"fig3 {preset} layer {layer}": f"fig3-{preset}-layer{layer}-epochs" for layer in EVOLUTION_LAYERS}
    if figs.withheld(result, drawn):
        return
    snapshots = [(epoch, load_model(path)[0]) for epoch, path in run.periodic_checkpoints()]
    if not snapshots:
        log.warning("%s: no periodic checkpoints, so no figure of the centres over epochs", run.path)
        return
    for layer in EVOLUTION_LAYERS:
        if layer <= run.model.config.num_layers:
            fig = quadratic_epochs_figure(snapshots, layer, title=f"{preset}: layer {layer} after each epoch")
            figs.save(fig, f"fig3-{preset}-layer{layer}-epochs", f"fig3 {preset} layer {layer}")


def _content(result: RunResult, figs: _Figures, data: str | None, data_dir: str | None) -> None:
    preset, run, image = result.job.preset, result.run, FIG6_IMAGE
    average = min(FIG6_AVERAGE, test_count(run, data=data, data_dir=data_dir))   # a small data set has fewer
    if figs.withheld(result, {f"fig6 {preset} image": f"fig6-{preset}-image{image}",
                              f"fig6 {preset} average": f"fig6-{preset}-average{average}"}):
        return
    images, raw = test_images(run, [image], data=data, data_dir=data_dir)
    maps = attention_maps(run.model, images)
    # the middle token of the grid of these images (the data set's size, which need not be the model's default)
    query = (maps[0].height // 2, maps[0].width // 2)
    fig = attention_grid_figure(maps, query, image=raw[0], title=f"{preset}: test image {image}, query {query}")
    figs.save(fig, f"fig6-{preset}-image{image}", f"fig6 {preset} image")
    images, _ = test_images(run, list(range(average)), data=data, data_dir=data_dir)
    fig = attention_grid_figure(attention_maps(run.model, images, average=True), query,
                                title=f"{preset}: average over {average} test images, query {query}")
    figs.save(fig, f"fig6-{preset}-average{average}", f"fig6 {preset} average")


def _distances(preset: str, results: Sequence[RunResult], figs: _Figures) -> None:
    panels = {"attention distance (tokens)": layer_curves(results, "distance"),
              "distance to the 3x3 grid of shifts (tokens)": layer_curves(results, "grid_distance")}
    if all(panels.values()):
        seeds = len(results)
        fig = layer_curves_figure(panels, title=f"{preset}: per layer, after each epoch "
                                                f"(mean over {seeds} seed{'s' if seeds > 1 else ''})")
        figs.save(fig, f"distances-{preset}", f"distances {preset}")


def _locality(preset: str, results: Sequence[RunResult], figs: _Figures, data: str | None,
              data_dir: str | None) -> None:
    """ViT's Fig. 7 (the numbers of the report's locality section)."""
    measured = [m for r in results if (m := run_locality(r, data=data, data_dir=data_dir)) is not None]
    if measured:
        runs = {f"seed {m['seed']}": Locality.from_dict(m) for m in measured}
        fig = locality_figure(runs, title=f"{preset}: mean attention distance and normalised entropy of every head "
                                          "after training")
        figs.save(fig, f"locality-{preset}", f"locality {preset}")


def _figure_kind(result: RunResult) -> str | None:
    """Which figure a run's attention gets, asked of its network's layers (the architecture
    decides, so a run shipped without its weights is asked too): ``"centers"`` (quadratic heads),
    ``"position maps"`` (other position-only heads), ``"score terms"`` (content + positional scores,
    not gated), None otherwise (ResNet, plain content, GPSA)."""
    try:
        layers = attention_layers(result.run.network())
    except ValueError:
        return None
    if all(layer.has_centers for layer in layers):
        return "centers"
    if all(layer.position_only for layer in layers):
        return "position maps"
    if all(layer.has_positional_term and not layer.position_only and not layer.has_gates for layer in layers):
        return "score terms"
    return None


def _logged_layers(records: Sequence[dict]) -> dict[int, list]:
    """``{layer: [(epoch, centres, Sigma^-1), ...]}`` of every layer whose centres and spreads the
    records log (layers 1, 2, ... while the last record has them)."""
    layers, layer = {}, 1
    while records and quadratic_heads(records[-1], layer) is not None:
        layers[layer] = [(r["epoch"], *heads) for r in records if (heads := quadratic_heads(r, layer)) is not None]
        layer += 1
    return layers


def _lr_note(record: dict, end: bool) -> str:
    lr = f"lr {record['lr']:.2g}" if isinstance(record.get("lr"), (int, float)) else ""
    return ", ".join(filter(None, [lr, "end of its schedule" if end else ""]))


def _baseline_run(result: RunResult, suite: Suite) -> tuple[str, list[dict], int] | None:
    """The same model and seed in the suite's baseline (``<suite folder>/../<baseline>/<preset>/seed<N>``):
    ``(baseline name, its epoch records, its planned epochs)``; None where it is not beside or logs
    no epoch."""
    if not suite.baseline:
        return None
    folder = result.job.folder.parent.parent.parent / suite.baseline / result.job.preset / result.job.folder.name
    if not (folder / "config.json").is_file():
        return None
    run = RunFolder(folder, mode="read")
    records = [r for r in run.read_metrics() if isinstance(r.get("epoch"), int)]
    return (suite.baseline, records, run.read_config().get("epochs")) if records else None


def _logged_evolution(result: RunResult, suite: Suite, figs: _Figures) -> None:
    """Fig. 3 from the centres and spreads logged every epoch (see the module's description)."""
    preset, records = result.job.preset, result.epoch_records
    layers = _logged_layers(records)
    if not layers:
        log.warning("%s: metrics.jsonl logs no centres and spreads per epoch, so no Fig. 3", result.run.path)
        return
    drawn: list = evolution_epochs([r["epoch"] for r in records], suite.settle_epochs)
    by_epoch = {r["epoch"]: r for r in records}
    notes = {epoch: _lr_note(by_epoch[epoch], epoch == records[-1]["epoch"]) for epoch in drawn}
    others, beside = {}, ""
    found = _baseline_run(result, suite)
    theirs = _logged_layers(found[1]) if found else {}
    if theirs:
        name, their_records, planned = found
        last = their_records[-1]
        column = (name, last["epoch"])
        others[name] = theirs
        drawn.insert(sum(1 for e in drawn if e <= last["epoch"]), column)
        notes[column] = _lr_note(last, last["epoch"] == planned)
        beside = (f"'{name} epoch {last['epoch']}': the {name} run of this model and seed "
                  + ("at the end of its schedule" if last["epoch"] == planned else f"(unfinished, of {planned})"))
    lines = [f"{preset} seed {result.job.seed}: every layer over the epochs of {suite.name}", beside,
             "(50 % solid, 90 % dotted mass; thin lines: each centre's path; lr: the learning rate at that "
             "epoch's end)"]
    # wrapped to the figure's width (2.5 inches a column): a title wider than three columns was cut
    title = "\n".join(textwrap.fill(line, width=max(45, 32 * len(drawn))) for line in lines if line)
    fig = centers_over_epochs_figure(layers, drawn, others=others, notes=notes, title=title)
    figs.save(fig, f"fig3-{preset}-layers-epochs", f"fig3 {preset}")


def _epoch_study(suite: Suite, preset: str, runs: Sequence[RunResult], figs: _Figures) -> None:
    """The figures of a suite followed over epochs (see the module's description), for one preset."""
    if _figure_kind(runs[0]) == "centers":
        if suite.evolution_from == "metrics":
            _logged_evolution(runs[0], suite, figs)
        else:
            _checkpoint_evolution(runs[0], figs)
        for result in runs:
            _fig4(result, figs, seed_in_name=True)
    curves = seed_layer_curves(runs, "grid_distance")
    if curves:
        fig = seed_curves_figure(curves, ylabel="grid distance (tokens)", threshold=suite.settled_below,
                                 threshold_label=f"settled: below {suite.settled_below}",
                                 title=f"{preset}: distance of each layer's heads to the nearest 3x3 grid of shifts")
        figs.save(fig, f"grid-distance-seeds-{preset}", f"grid distance seeds {preset}")


def _accuracy(results: dict[str, list[RunResult]], suite: Suite, figs: _Figures) -> None:
    if suite.settle_epochs:
        curves, bands = {}, {}
        for preset, runs in results.items():
            if runs:
                epochs, mean, low, high = accuracy_bands(runs)
                label = f"{preset} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"
                curves[label], bands[label] = (epochs, mean), (low, high)
        figs.save(accuracy_figure(curves, bands=bands, title="Test accuracy: mean over seeds, band from min to max"),
                  "fig2-accuracy", "fig2")
        return
    curves = {preset: ([r["epoch"] for r in runs[0].records], [r["test_accuracy"] for r in runs[0].records])
              for preset, runs in results.items() if runs}
    if curves:
        figs.save(accuracy_figure(curves, title="Test accuracy (first seed of each model)"), "fig2-accuracy", "fig2")


def draw_figures(study: Study, jobs: Sequence[Job], results: dict, out: str | Path, *,
                 formats: Sequence[str] = ("png",), data: str | None = None,
                 data_dir: str | None = None) -> dict[str, Path]:
    """Draw every figure a study's finished runs allow into ``out`` (see the module's description);
    returns ``{figure key: first file}``.

    Args:
        jobs: the study's planned jobs (a grid's rows and cells, in plan order).
        results: the finished runs (:func:`~attncnn.reproduce.reporting.results.finished_results`).
        formats: matplotlib formats (the first one's file is returned).
        data, data_dir: data set of a suite's test images (default: each run's own).

    Raises:
        attncnn.data.DataError: the test images of a content model cannot be read.
    """
    figs = _Figures(Path(out), formats)
    if isinstance(study, Grid):
        _grid_figures(study, jobs, results, figs)
    else:
        _suite_figures(study, results, figs, data, data_dir)
    return dict(figs)


def _suite_figures(suite: Suite, results: dict[str, list[RunResult]], figs: _Figures, data: str | None,
                   data_dir: str | None) -> None:
    _accuracy(results, suite, figs)
    for preset, runs in results.items():
        first = runs[0]
        kind = _figure_kind(first)
        if suite.settle_epochs:
            _epoch_study(suite, preset, runs, figs)
        elif kind == "centers":
            _fig4(first, figs)
            _checkpoint_evolution(first, figs)
        key, name = f"fig5 {preset}", f"fig5-{preset}-maps"
        if kind == "position maps" and not figs.withheld(first, {key: name}):
            grid = default_grid_size(first.run.model)
            fig = attention_grid_figure(position_maps(first.run.model), (grid[0] // 2, grid[1] // 2),
                                        title=f"{preset}: attention probabilities of the central query")
            figs.save(fig, name, key)
        if kind == "score terms":
            _content(first, figs, data, data_dir)
        _distances(preset, runs, figs)
        _locality(preset, runs, figs, data, data_dir)


def _subset(runs: Sequence[RunResult]) -> int:
    return dict(runs[0].job.overrides)["train_subset"]


def _per_seen(curves: dict, subset: int) -> dict:
    return {layer: ([e * subset for e in epochs], values) for layer, (epochs, values) in curves.items()}


def _grid_figures(grid: Grid, jobs: Sequence[Job], results: Cells, figs: _Figures) -> None:
    presets, cells = rows_and_cells(jobs)
    by_size, seeds = {}, {}
    for preset in presets:
        finished = [results[(preset, c)] for c in cells if (preset, c) in results]
        done = [(_subset(runs), statistics.fmean(r.final_accuracy for r in runs)) for runs in finished]
        if done:
            by_size[preset] = tuple(zip(*done))
        # every seed of a cell with several, so a mean drawn from a wide spread shows it
        spread = [(_subset(runs), r.final_accuracy) for runs in finished if len(runs) > 1 for r in runs]
        if spread:
            seeds[preset] = tuple(zip(*spread))
    if by_size:
        title = "Final test accuracy, equal seen images per cell" + (" (line: mean; circles: each seed)"
                                                                      if seeds else "")
        figs.save(accuracy_figure(by_size, title=title, xlabel="training images (class-balanced subset)", logx=True,
                                  points=seeds), "efficiency-accuracy")
    for cell in cells:
        curves, panels = {}, {}
        for preset in (p for p in presets if (p, cell) in results):
            runs = results[(preset, cell)]
            # seen images against the mean test accuracy at the evaluated epochs common to the cell's seeds
            epochs, mean, _, _ = accuracy_bands(runs)
            curves[preset] = ([e * _subset(runs) for e in epochs], mean)
            if distances := layer_curves(runs, "distance"):
                panels[f"{preset}: attention distance (tokens)"] = _per_seen(distances, _subset(runs))
        slug = cell.replace(" %", "pct")
        if curves:
            figs.save(accuracy_figure(curves, title=f"Test accuracy on {cell} of the training set",
                                      xlabel="seen images"), f"efficiency-seen-{slug}")
        if panels:
            figs.save(layer_curves_figure(panels, title=f"Attention distance per layer over training ({cell} of the "
                                                        "training set)", xlabel="seen images"),
                      f"efficiency-distance-{slug}")
    named = (lambda row: "GPSA") if len(grid.gate_rows) == 1 else (lambda row: row)
    gates = {f"{named(row)} gate sigmoid(lambda), {c}": _per_seen(layer_curves(results[(row, c)], "gate"),
                                                                 _subset(results[(row, c)]))
             for row in grid.gate_rows for c in cells if (row, c) in results}
    if gates and all(gates.values()):
        figs.save(layer_curves_figure(gates, title="GPSA: weight of the positional attention per layer (layer mean)",
                                      xlabel="seen images"), "efficiency-gates")
