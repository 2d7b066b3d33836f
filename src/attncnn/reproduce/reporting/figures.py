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
from ..running.runner import Job, row_of
from ..studies import Grid, Study, Suite
from .epochs import accuracy_bands, evolution_epochs, quadratic_heads, seed_layer_curves
from .locality import run_locality
from .results import Cells, RunResult, layer_curves

log = logging.getLogger("attncnn.reproduce")

__all__ = ["draw_figures", "suite_figures", "grid_figures", "EVOLUTION_LAYERS"]

#: layers drawn across epochs (paper Fig. 3): the first, where the grid forms, and a deeper one
EVOLUTION_LAYERS = (1, 4)


def _figure(fig, path: Path, formats: Sequence[str], written: dict[str, Path], key: str) -> None:
    written[key] = save_figure(fig, path, formats)[0]


def _weights_withheld(result: RunResult, written: dict[str, Path], formats, figures: dict[str, Path]) -> bool:
    """Whether ``result``'s run was shipped without its weights. Then ``figures`` (figure key ->
    path without suffix), drawn from those weights, are not drawn again: each one's file drawn
    before they were withheld stays, and is listed in ``written`` where it is there."""
    if result.run.model is not None:
        return False
    kept = {key: path.with_suffix(f".{formats[0]}") for key, path in figures.items()}
    kept = {key: path for key, path in kept.items() if path.is_file()}
    written.update(kept)
    log.info("%s: shipped without its weights, so %s %s not drawn again (%d of %d drawn before and kept)",
             result.run.path, " and ".join(figures), "is" if len(figures) == 1 else "are", len(kept), len(figures))
    return True


def _fig4(result: RunResult, out: Path, formats, written: dict[str, Path], *, seed_in_name: bool = False) -> None:
    preset, run = result.job.preset, result.run
    seed = f" seed {result.job.seed}" if seed_in_name else ""
    path, key = out / f"fig4-{preset}{seed.replace(' ', '-')}-centers", f"fig4 {preset}{seed}"
    if _weights_withheld(result, written, formats, {key: path}):
        return
    _figure(quadratic_layers_figure(run.model, title=f"{preset}{seed}: every layer after epoch "
                                                     f"{len(result.epoch_records)} (50 % solid, 90 % dotted mass)"),
            path, formats, written, key)


def _quadratic(result: RunResult, out: Path, formats, written: dict[str, Path]) -> None:
    _fig4(result, out, formats, written)
    _checkpoint_evolution(result, out, formats, written)


def _checkpoint_evolution(result: RunResult, out: Path, formats, written: dict[str, Path]) -> None:
    """Fig. 3 from the run's periodic checkpoints."""
    preset, run = result.job.preset, result.run
    drawn = {f"fig3 {preset} layer {layer}": out / f"fig3-{preset}-layer{layer}-epochs" for layer in EVOLUTION_LAYERS}
    if _weights_withheld(result, written, formats, drawn):
        return
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
    average = min(average, test_count(run, data=data, data_dir=data_dir))   # a small data set has fewer
    if _weights_withheld(result, written, formats, {f"fig6 {preset} image": out / f"fig6-{preset}-image{image}",
                                                    f"fig6 {preset} average": out / f"fig6-{preset}-average{average}"}):
        return
    images, raw = test_images(run, [image], data=data, data_dir=data_dir)
    maps = attention_maps(run.model, images)
    # the middle token of the grid of these images (the data set's size, which need not be the model's default)
    query = (maps[0].height // 2, maps[0].width // 2)
    fig = attention_grid_figure(maps, query, image=raw[0], title=f"{preset}: test image {image}, query {query}")
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


def _locality(preset: str, results: Sequence[RunResult], out: Path, formats, written: dict[str, Path], *,
              data: str | None, data_dir: str | None) -> None:
    """ViT's Fig. 7: every head's mean attention distance and normalised entropy per layer, one colour
    per seed (the numbers of the report's locality section)."""
    measured = [m for r in results if (m := run_locality(r, data=data, data_dir=data_dir)) is not None]
    if measured:
        runs = {f"seed {m['seed']}": Locality.from_dict(m) for m in measured}
        fig = locality_figure(runs, title=f"{preset}: mean attention distance and normalised entropy of every head "
                                          "after training")
        _figure(fig, out / f"locality-{preset}", formats, written, f"locality {preset}")


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


def _logged_evolution(result: RunResult, suite: Suite, out: Path, formats, written: dict[str, Path]) -> None:
    """Fig. 3 from the centres and spreads logged every epoch (no checkpoints): every layer at the first
    epoch, the settle epochs and the last, and beside them the last epoch of the baseline suite's run of
    the same model and seed where it is beside this suite's folder (another schedule's end)."""
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
    _figure(fig, out / f"fig3-{preset}-layers-epochs", formats, written, f"fig3 {preset}")


def _epoch_study(suite: Suite, preset: str, runs: Sequence[RunResult], out: Path, formats,
                 written: dict[str, Path]) -> None:
    """The figures of a suite followed over epochs, for one preset: Fig. 3 from the logs, Fig. 4
    of every seed, the grid distance of every seed."""
    if _figure_kind(runs[0]) == "centers":
        if suite.evolution_from == "metrics":
            _logged_evolution(runs[0], suite, out, formats, written)
        else:
            _checkpoint_evolution(runs[0], out, formats, written)
        for result in runs:
            _fig4(result, out, formats, written, seed_in_name=True)
    curves = seed_layer_curves(runs, "grid_distance")
    if curves:
        fig = seed_curves_figure(curves, ylabel="grid distance (tokens)", threshold=suite.settled_below,
                                 threshold_label=f"settled: below {suite.settled_below}",
                                 title=f"{preset}: distance of each layer's heads to the nearest 3x3 grid of shifts")
        _figure(fig, out / f"grid-distance-seeds-{preset}", formats, written, f"grid distance seeds {preset}")


def _accuracy(results: dict[str, list[RunResult]], suite: Suite | None, out: Path, formats,
              written: dict[str, Path]) -> None:
    if suite is not None and suite.settle_epochs:
        curves, bands = {}, {}
        for preset, runs in results.items():
            if runs:
                epochs, mean, low, high = accuracy_bands(runs)
                label = f"{preset} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"
                curves[label], bands[label] = (epochs, mean), (low, high)
        fig = accuracy_figure(curves, bands=bands, title="Test accuracy: mean over seeds, band from min to max")
        _figure(fig, out / "fig2-accuracy", formats, written, "fig2")
        return
    curves = {preset: ([r["epoch"] for r in runs[0].records], [r["test_accuracy"] for r in runs[0].records])
              for preset, runs in results.items() if runs}
    if curves:
        _figure(accuracy_figure(curves, title="Test accuracy (first seed of each model)"), out / "fig2-accuracy",
                formats, written, "fig2")

def draw_figures(study: Study, jobs: Sequence[Job], results: dict, out: str | Path, *,
                 formats: Sequence[str] = ("png",), data: str | None = None,
                 data_dir: str | None = None) -> dict[str, Path]:
    """Draw every figure a study's finished runs allow into ``out``: :func:`grid_figures` of a grid,
    :func:`suite_figures` of a suite; returns ``{figure key: first file}``.

    Args:
        jobs: the study's planned jobs (a grid's rows and cells, in plan order).
        results: the finished runs (:func:`~attncnn.reproduce.reporting.results.finished_results`).
        formats: matplotlib formats (the first one's file is returned).
        data, data_dir: data set of a suite's test images (default: each run's own).

    Raises:
        attncnn.data.DataError: the test images of a content model cannot be read.
    """
    if isinstance(study, Grid):
        return grid_figures(jobs, results, out, formats=formats, gate_rows=study.gate_rows)
    return suite_figures(results, out, formats=formats, data=data, data_dir=data_dir, suite=study)


def suite_figures(results: dict[str, list[RunResult]], out: str | Path, *, formats: Sequence[str] = ("png",),
                  image: int = 0, average: int = 100, data: str | None = None,
                  data_dir: str | None = None, suite: Suite | None = None) -> dict[str, Path]:
    """Draw every figure the finished runs allow into ``out``; returns ``{figure key: first file}``.

    Args:
        results: preset -> finished runs (:func:`~attncnn.reproduce.reporting.results.finished_results`).
        formats: matplotlib formats (the first one's file is returned).
        image: test image of the single-image content map (Fig. 6).
        average: number of test images the averaged content map uses (paper: 100).
        data, data_dir: data set for the test images (default: each run's own).
        suite: the suite; one with ``settle_epochs`` gets the figures of a study over epochs (see
            the module's description). None: the figures of a Table 1 suite.

    Raises:
        attncnn.data.DataError: the test images of a content model cannot be read.
    """
    out = Path(out)
    written: dict[str, Path] = {}
    over_epochs = suite is not None and bool(suite.settle_epochs)
    _accuracy(results, suite, out, formats, written)
    for preset, runs in results.items():
        first = runs[0]
        kind = _figure_kind(first)
        if over_epochs:
            _epoch_study(suite, preset, runs, out, formats, written)
        elif kind == "centers":
            _quadratic(first, out, formats, written)
        key, path = f"fig5 {preset}", out / f"fig5-{preset}-maps"
        if kind == "position maps" and not _weights_withheld(first, written, formats, {key: path}):
            grid = default_grid_size(first.run.model)
            fig = attention_grid_figure(position_maps(first.run.model), (grid[0] // 2, grid[1] // 2),
                                        title=f"{preset}: attention probabilities of the central query")
            _figure(fig, path, formats, written, key)
        if kind == "score terms":
            _content(first, out, formats, written, image=image, average=average, data=data, data_dir=data_dir)
        _distances(preset, runs, out, formats, written)
        _locality(preset, runs, out, formats, written, data=data, data_dir=data_dir)
    return written


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
    """Draw every figure a grid's finished cells allow into ``out`` (see the module's description);
    returns ``key -> first file``.

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
