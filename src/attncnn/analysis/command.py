"""``attncnn plot | inspect | report``: figures, per-head metrics, Table 1.

Registered by :mod:`attncnn.cli`; each handler returns the exit status. Errors are raised as
attncnn.AttncnnError and its subclasses (the CLI turns them into one stderr line and exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
from pathlib import Path

from ..errors import InputError
from ..perf.precision import running_at
from ..runs.options import add_precision_option

__all__ = ["register", "FIGURES"]

log = logging.getLogger(__name__)

#: Figure names for ``attncnn plot --figures``.
FIGURES = ("centers", "evolution", "maps", "average", "accuracy")


def register(subparsers) -> None:
    """Add the ``plot``, ``inspect`` and ``report`` subcommands."""
    p = subparsers.add_parser(
        "plot", help="the paper's figures from run folders or checkpoints (PNG and PDF)",
        description="Write every figure that applies to each run: quadratic models: 'centers' (all layers' "
                    "50%/90% mass contours, paper Fig. 4) and 'evolution' (one layer across the periodic "
                    "checkpoints, Fig. 3); learned position-only models: 'maps' (layers x heads, Fig. 5); "
                    "content models: 'maps' for one test image and 'average' over N test images (Fig. 6); "
                    "and 'accuracy' (test accuracy vs epoch of all runs on one plot, Fig. 2).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder or checkpoint file")
    p.add_argument("--out", default="figures", help="output folder (default: figures)")
    p.add_argument("--figures", default="all",
                   help=f"comma-separated subset of {', '.join(FIGURES)} (default: all that apply)")
    p.add_argument("--layer", type=int,
                   help="layer (1-based) for 'evolution' (default: 4 as in the paper, or the last if fewer)")
    p.add_argument("--query", help="query token ROW,COL (default: the grid centre)")
    p.add_argument("--image", type=int, default=0, help="test image index for 'maps' of content models")
    p.add_argument("--average", type=int, default=100, help="test images averaged for 'average' (default 100)")
    p.add_argument("--zoom", type=int, help="show only the (2 ZOOM+1)^2 tokens around the query (paper: 3)")
    p.add_argument("--labels", help="comma-separated curve labels for 'accuracy' (default: '<preset> seed <seed>' of "
                                    "each run, with the end of its path when two runs share one)")
    p.add_argument("--formats", default="png,pdf", help="comma-separated file formats (default: png,pdf)")
    p.add_argument("--data", help="dataset for content-model figures (default: the run's)")
    p.add_argument("--data-dir")
    p.set_defaults(handler=cmd_plot)

    i = subparsers.add_parser("inspect", help="per-layer and per-head attention metrics of a run",
                              description="Mean attention distance, peak probability and entropy per head "
                                          "(from hooked real activations), quadratic centres/spreads and "
                                          "degenerate heads, and each layer's distance to a KxK grid of shifts.")
    i.add_argument("run", metavar="RUN", help="run folder or checkpoint file")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--images", type=int, default=100,
                   help="test images for models whose attention depends on the input (default 100)")
    i.add_argument("--margin", type=int, default=0,
                   help="average only over queries at least this many tokens from the border (default 0: all)")
    i.add_argument("--condition-number", type=float, default=1000.0,
                   help="degenerate-head threshold (default: the reference code's)")
    i.add_argument("--min-eigenvalue", type=float, default=1e-5,
                   help="degenerate-head threshold (default: the reference code's)")
    i.add_argument("--data")
    i.add_argument("--data-dir")
    add_precision_option(i)
    i.set_defaults(handler=cmd_inspect)

    r = subparsers.add_parser("report", help="Table 1: accuracy, parameters, MACs, images/s beside the paper",
                              description="One row per run: last and best test accuracy (best = selected on the "
                                          "test set, as the reference), parameters, multiply-accumulates per "
                                          "image, training and inference images/s on this machine, epochs, "
                                          "dataset, and the paper's Table 1 numbers.")
    r.add_argument("runs", nargs="*", metavar="RUN", help="run folders or checkpoint files")
    r.add_argument("--preset", action="append", default=[], metavar="NAME",
                   help="also add an untrained preset's row (sizes only; repeatable)")
    r.add_argument("--json", action="store_true", help="print JSON")
    r.add_argument("--markdown", action="store_true", help="print a Markdown table")
    r.add_argument("--no-speed", action="store_true", help="skip the images/s measurements")
    r.add_argument("--batch-size", type=int, default=32, help="batch for the images/s measurements")
    r.add_argument("--image-size", type=int, default=32)
    r.add_argument("--out", help="also write the table to this file (.json, .md or text)")
    add_precision_option(r)
    r.set_defaults(handler=cmd_report)


@contextlib.contextmanager
def _quiet_logs(quiet: bool):
    """Keep the package's INFO lines (which the CLI sends to stdout) out of machine-readable output."""
    logger = logging.getLogger("attncnn")
    level = logger.level
    if quiet:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


# -- plot -----------------------------------------------------------------------------------------

def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"


def _figure_set(text: str) -> set[str]:
    if text == "all":
        return set(FIGURES)
    chosen = {t.strip() for t in text.split(",") if t.strip()}
    unknown = chosen - set(FIGURES)
    if unknown or not chosen:
        raise InputError(f"unknown figure(s) {', '.join(sorted(unknown)) or text!r}; choose from {', '.join(FIGURES)}")
    return chosen


def _formats(text: str) -> list[str]:
    formats = [f.strip().lower().lstrip(".") for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        raise InputError(f"unsupported figure format(s) {bad or text!r}; use png, pdf or svg")
    return formats


def cmd_plot(args: argparse.Namespace) -> int:
    from ..runs import load_model
    from .figures import (accuracy_figure, attention_grid_figure, quadratic_epochs_figure,
                          quadratic_layers_figure, save_figure)
    from .maps import attention_layers, attention_maps, default_grid_size, position_maps
    from .runs import label_runs, open_run, parse_query, test_images

    wanted = _figure_set(args.figures)
    formats = _formats(args.formats)
    out = Path(args.out)
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        raise InputError(f"--labels gives {len(labels)} labels for {len(args.runs)} runs")
    if labels is not None and len(set(labels)) != len(labels):
        raise InputError(f"--labels must be distinct (one curve each), got {args.labels!r}")
    runs = label_runs([open_run(path) for path in args.runs])     # "<preset> seed <seed>", made distinct
    written: list[Path] = []
    curves = {}
    for n, run in enumerate(runs):
        stem = out / _safe(run.name)
        label = labels[n] if labels else run.name
        records = [r for r in run.metrics if isinstance(r.get("test_accuracy"), (int, float))]
        if records:
            curves[label] = ([r["epoch"] for r in records], [r["test_accuracy"] for r in records])
        try:
            layers = attention_layers(run.model)
        except ValueError:
            log.info("%s: no attention layers (%s); only the accuracy curve applies", run.name, run.kind)
            continue
        quadratic = all(layer.has_centers for layer in layers)
        position_only = all(layer.position_only for layer in layers)
        epoch = run.metadata.get("epoch")
        if quadratic and "centers" in wanted:
            fig = quadratic_layers_figure(run.model, title=f"{run.name}: epoch {epoch}")
            written += save_figure(fig, f"{stem}-centers", formats)
        if quadratic and "evolution" in wanted:
            layer = min(4, len(layers)) if args.layer is None else args.layer
            if not 1 <= layer <= len(layers):
                raise InputError(f"--layer {layer} does not exist: {run.name} has layers 1..{len(layers)}")
            snapshots = [(e, load_model(p)[0]) for e, p in run.periodic_checkpoints()]
            if not snapshots:
                log.warning("%s: no periodic checkpoints (train with --checkpoint-every); skipping 'evolution'",
                            run.name)
            else:
                fig = quadratic_epochs_figure(snapshots, layer, title=f"{run.name}: layer {layer}")
                written += save_figure(fig, f"{stem}-layer{layer}-evolution", formats)
        want_maps = "maps" in wanted and (not quadratic or args.figures != "all")
        if position_only and want_maps:
            maps = position_maps(run.model)
            query = parse_query(args.query) if args.query else tuple(s // 2 for s in (maps[0].height, maps[0].width))
            fig = attention_grid_figure(maps, query, zoom=args.zoom,
                                        title=f"{run.name}: attention probabilities, query {query}")
            written += save_figure(fig, f"{stem}-maps", formats)
        elif not position_only and ({"maps", "average"} & wanted):
            images, raw = test_images(run, [args.image], data=args.data, data_dir=args.data_dir)
            # the middle token of these images' grid (the data set's size, not necessarily the model's default)
            rows, cols = (default_grid_size(run.model, side)[0] for side in images.shape[-2:])
            query = parse_query(args.query) if args.query else (rows // 2, cols // 2)
            if "maps" in wanted:
                fig = attention_grid_figure(attention_maps(run.model, images), query, image=raw[0], zoom=args.zoom,
                                            title=f"{run.name}: test image {args.image}, query {query}")
                written += save_figure(fig, f"{stem}-maps-image{args.image}", formats)
            if "average" in wanted:
                count = _available_images(run, args)
                images, _ = test_images(run, list(range(count)), data=args.data, data_dir=args.data_dir)
                fig = attention_grid_figure(attention_maps(run.model, images, average=True), query, zoom=args.zoom,
                                            title=f"{run.name}: average over {count} test images, query {query}")
                written += save_figure(fig, f"{stem}-maps-average{count}", formats)
    if "accuracy" in wanted:
        if curves:
            written += save_figure(accuracy_figure(curves), out / "accuracy", formats)
        else:
            log.warning("no run has logged test accuracies; skipping 'accuracy'")
    if not written:
        raise InputError("no figure applies to these runs and --figures; see `attncnn plot --help`")
    for path in written:
        print(path)
    return 0


def _available_images(run, args) -> int:
    from .runs import test_count

    return max(1, min(args.average, test_count(run, data=args.data, data_dir=args.data_dir)))


# -- inspect --------------------------------------------------------------------------------------

def cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect_text import inspect_text
    from .maps import attention_layers
    from .metrics import model_metrics
    from .runs import open_run, test_images

    with _quiet_logs(args.json):
        run = open_run(args.run)
        layers = attention_layers(run.model)
        images = None
        if not all(layer.position_only for layer in layers):
            count = _available_images(run, argparse.Namespace(average=args.images, data=args.data,
                                                              data_dir=args.data_dir))
            images, _ = test_images(run, list(range(count)), data=args.data, data_dir=args.data_dir)
        with running_at(args.precision):
            result = model_metrics(run.model, images, margin=args.margin, condition_number=args.condition_number,
                                   min_eigenvalue=args.min_eigenvalue)
    result = {"run": run.name, "checkpoint": str(run.checkpoint), "epoch": run.metadata.get("epoch"),
              "kind": run.kind, **result}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(inspect_text(result))
    return 0


# -- report ---------------------------------------------------------------------------------------

def cmd_report(args: argparse.Namespace) -> int:
    from .._io import atomic_write_text
    from .report import markdown_table, preset_row, run_row, text_table
    from .runs import label_runs, open_run

    if not args.runs and not args.preset:
        raise InputError("give at least one RUN or --preset NAME")
    if args.json and args.markdown:
        raise InputError("--json and --markdown exclude each other")
    kwargs = {"speed": not args.no_speed, "batch_size": args.batch_size, "image_size": args.image_size}
    with _quiet_logs(args.json), running_at(args.precision):
        rows = [run_row(run, **kwargs) for run in label_runs([open_run(path) for path in args.runs])]
        rows += [preset_row(name, **kwargs) for name in args.preset]
    if args.json:
        text = json.dumps(rows, indent=2) + "\n"
    elif args.markdown:
        text = markdown_table(rows)
    else:
        text = text_table(rows)
    if args.out:
        atomic_write_text(args.out, text)
    print(text, end="")
    return 0


# -- prune ----------------------------------------------------------------------------------------
