"""The paper's figures for runs, as ``attncnn plot`` writes them: every figure that applies to each run
(:data:`FIGURES`: quadratic ``centers`` and ``evolution``, Figs. 4 and 3; ``maps``, Fig. 5, and for
content models ``average``, Fig. 6; ``accuracy``, Fig. 2).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Sequence

from ..errors import InputError

__all__ = ["FIGURES", "FORMATS", "figure_set", "figure_formats", "plot_runs"]

log = logging.getLogger(__name__)

#: Figure names for ``attncnn plot --figures``.
FIGURES = ("centers", "evolution", "maps", "average", "accuracy")
#: File formats the figures can be written in.
FORMATS = ("png", "pdf", "svg")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"


def figure_set(text: str) -> set[str]:
    """``"all"`` or comma-separated names of :data:`FIGURES` -> the set of names.

    Raises:
        InputError: an unknown name, or none.
    """
    if text == "all":
        return set(FIGURES)
    chosen = {t.strip() for t in text.split(",") if t.strip()}
    unknown = chosen - set(FIGURES)
    if unknown or not chosen:
        raise InputError(f"unknown figure(s) {', '.join(sorted(unknown)) or text!r}; choose from {', '.join(FIGURES)}")
    return chosen


def figure_formats(text: str) -> list[str]:
    """Comma-separated file formats (``"png,pdf"``) -> ``["png", "pdf"]``.

    Raises:
        InputError: a format not in :data:`FORMATS`, or none.
    """
    formats = [f.strip().lower().lstrip(".") for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise InputError(f"unsupported figure format(s) {bad or text!r}; use png, pdf or svg")
    return formats


def plot_runs(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, figures: str = "all",
              layer: int | None = None, query: str | None = None, image: int = 0, average: int = 100,
              zoom: int | None = None, labels: Sequence[str] | None = None, formats: str = "png,pdf",
              data: str | None = None, data_dir: str | None = None) -> list[Path]:
    """Write every figure of ``figures`` that applies to each run (see the module docstring).

    Args:
        paths: run folders or checkpoint files.
        out: the output folder.
        figures: ``"all"`` (every figure that applies) or comma-separated names of :data:`FIGURES`.
        layer: layer (1-based) of ``evolution``; default 4 as in the paper, or the last if fewer.
        query: the query token ``"ROW,COL"``; default the grid's center.
        image: test image index of a content model's ``maps``.
        average: test images averaged for ``average``.
        zoom: show only the ``(2 zoom + 1)^2`` tokens around the query (paper: 3).
        labels: one curve label per run for ``accuracy`` (default ``"<preset> seed <seed>"``).
        formats: comma-separated file formats (:data:`FORMATS`).
        data, data_dir: the data set of content models' images (default each run's own).

    Returns:
        The files written, in order.

    Raises:
        InputError: unknown figures or formats, labels that are not one distinct label per run, a
            layer that does not exist, or no figure that applies.
    """
    wanted = figure_set(figures)
    kinds = figure_formats(formats)
    if labels is not None and len(labels) != len(paths):
        raise InputError(f"--labels gives {len(labels)} labels for {len(paths)} runs")
    if labels is not None and len(set(labels)) != len(labels):
        raise InputError(f"--labels must be distinct (one curve each), got {','.join(labels)!r}")
    from .figures import accuracy_figure, save_figure
    from .runs import label_runs, open_run

    runs = label_runs([open_run(path) for path in paths])     # "<preset> seed <seed>", made distinct
    settings = dict(wanted=wanted, formats=kinds, every=figures == "all", layer=layer, query=query, image=image,
                    average=average, zoom=zoom, data=data, data_dir=data_dir)
    written: list[Path] = []
    curves = {}
    for n, run in enumerate(runs):
        records = [r for r in run.metrics if isinstance(r.get("test_accuracy"), (int, float))]
        if records:
            curves[labels[n] if labels else run.name] = ([r["epoch"] for r in records],
                                                         [r["test_accuracy"] for r in records])
        written += _run_figures(run, Path(out) / _safe(run.name), **settings)
    if "accuracy" in wanted:
        if curves:
            written += save_figure(accuracy_figure(curves), Path(out) / "accuracy", kinds)
        elif any(_packaged(run) for run in runs):
            log.warning("skipping 'accuracy': it draws each run's epoch records (metrics.jsonl), which the models "
                        "that come with the package do not carry (a clone's results/ has them)")
        else:
            log.warning("no run has logged test accuracies; skipping 'accuracy'")
    if not written:
        raise InputError("no figure applies to these runs and --figures; see `attncnn plot --help`")
    return written


def _run_figures(run, stem: Path, *, wanted: set[str], formats: list[str], every: bool, layer: int | None,
                 query: str | None, image: int, average: int, zoom: int | None, data: str | None,
                 data_dir: str | None) -> list[Path]:
    """The figures of one run (all but ``accuracy``); ``every``: no ``--figures`` given."""
    from ..runs import load_model
    from .figures import attention_grid_figure, quadratic_epochs_figure, quadratic_layers_figure, save_figure
    from .maps import attention_layers, attention_maps, default_grid_size, position_maps
    from .runs import default_query, parse_query, test_images

    try:
        layers = attention_layers(run.model)
    except ValueError:
        log.info("%s: no attention layers (%s); only the accuracy curve applies", run.name, run.kind)
        return []
    written: list[Path] = []
    quadratic = all(item.has_centers for item in layers)
    position_only = all(item.position_only for item in layers)
    if quadratic and "centers" in wanted:
        fig = quadratic_layers_figure(run.model, title=f"{run.name}: epoch {run.metadata.get('epoch')}")
        written += save_figure(fig, f"{stem}-centers", formats)
    if quadratic and "evolution" in wanted:
        chosen = min(4, len(layers)) if layer is None else layer
        if not 1 <= chosen <= len(layers):
            raise InputError(f"--layer {chosen} does not exist: {run.name} has layers 1..{len(layers)}")
        snapshots = [(e, load_model(p)[0]) for e, p in run.periodic_checkpoints()]
        if not snapshots:
            log.warning("%s: skipping 'evolution': it draws a run's periodic checkpoints, and %s", run.name,
                        _why_no_periodic_checkpoints(run))
        else:
            fig = quadratic_epochs_figure(snapshots, chosen, title=f"{run.name}: layer {chosen}")
            written += save_figure(fig, f"{stem}-layer{chosen}-evolution", formats)
    want_maps = "maps" in wanted and (not quadratic or not every)
    if position_only and want_maps:
        maps = position_maps(run.model)
        at = parse_query(query) if query else default_query(maps[0].height, maps[0].width)
        fig = attention_grid_figure(maps, at, zoom=zoom, title=f"{run.name}: attention probabilities, query {at}")
        written += save_figure(fig, f"{stem}-maps", formats)
    elif not position_only and ({"maps", "average"} & wanted):
        images, raw = test_images(run, [image], data=data, data_dir=data_dir)
        # the middle token of these images' grid (the data set's size, not necessarily the model's default)
        at = parse_query(query) if query else default_query(*default_grid_size(run.model, tuple(images.shape[-2:])))
        if "maps" in wanted:
            fig = attention_grid_figure(attention_maps(run.model, images), at, image=raw[0], zoom=zoom,
                                        title=f"{run.name}: test image {image}, query {at}")
            written += save_figure(fig, f"{stem}-maps-image{image}", formats)
        if "average" in wanted:
            count = available_images(run, average, data=data, data_dir=data_dir)
            images, _ = test_images(run, list(range(count)), data=data, data_dir=data_dir)
            fig = attention_grid_figure(attention_maps(run.model, images, average=True), at, zoom=zoom,
                                        title=f"{run.name}: average over {count} test images, query {at}")
            written += save_figure(fig, f"{stem}-maps-average{count}", formats)
    return written


def _packaged(run) -> bool:
    """A model that comes with the installed package: its ``finished.json`` says where it was made
    from (``"packaged"``; benchmarks/package_models.py writes it) and it keeps its final weights only."""
    import json

    if run.folder is None:
        return False
    try:
        summary = json.loads((run.folder.path / "finished.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and "packaged" in summary


def _why_no_periodic_checkpoints(run) -> str:
    """Why ``run`` has no periodic checkpoints, with what gives them, in words that fit the run."""
    if run.folder is None:
        return "a checkpoint file alone has none (give its run folder)"
    if _packaged(run):
        return "a model that comes with the package keeps only its final weights"
    return ("this run folder keeps none (the shipped runs keep their final weights only; a run of your own keeps "
            "them when trained with --checkpoint-every)")


def available_images(run, wanted: int, *, data: str | None = None, data_dir: str | None = None) -> int:
    """``wanted`` test images, or as many as the run's data set has (at least 1)."""
    from .runs import test_count

    return max(1, min(wanted, test_count(run, data=data, data_dir=data_dir)))
