"""``attncnn plot``: the paper's figures from run folders or checkpoints
(:func:`attncnn.analysis.plotting.plot_runs`)."""

from __future__ import annotations

import argparse

from ..analysis.plotting import FIGURES
from ._parsing import RUN_HELP, run_or_model

__all__ = ["register", "handle"]


def register(sub) -> None:
    p = sub.add_parser(
        "plot", help="the paper's figures from run folders or checkpoints (PNG and PDF)",
        description="Write every figure that applies to each run: quadratic models: 'centers' (all layers' "
                    "50%/90% mass contours, paper Fig. 4) and 'evolution' (one layer across the periodic "
                    "checkpoints, Fig. 3); learned position-only models: 'maps' (layers x heads, Fig. 5); "
                    "content models: 'maps' for one test image and 'average' over N test images (Fig. 6); "
                    "and 'accuracy' (test accuracy vs epoch of all runs on one plot, Fig. 2).")
    p.add_argument("runs", nargs="+", metavar="RUN", type=run_or_model, help=RUN_HELP)
    p.add_argument("--out", default="figures", help="output folder (default: figures)")
    p.add_argument("--figures", default="all",
                   help=f"comma-separated subset of {', '.join(FIGURES)} (default: all that apply)")
    p.add_argument("--layer", type=int,
                   help="layer (1-based) for 'evolution' (default: 4 as in the paper, or the last if fewer)")
    p.add_argument("--query", help="query token ROW,COL (default: the grid center)")
    p.add_argument("--image", type=int, default=0, help="test image index for 'maps' of content models")
    p.add_argument("--average", type=int, default=100, help="test images averaged for 'average' (default 100)")
    p.add_argument("--zoom", type=int, help="show only the (2 ZOOM+1)^2 tokens around the query (paper: 3)")
    p.add_argument("--labels", help="comma-separated curve labels for 'accuracy' (default: '<preset> seed <seed>' of "
                                    "each run, with the end of its path when two runs share one)")
    p.add_argument("--formats", default="png,pdf", help="comma-separated file formats (default: png,pdf)")
    p.add_argument("--data", help="dataset for content-model figures (default: the run's)")
    p.add_argument("--data-dir")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..analysis.plotting import plot_runs

    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    written = plot_runs(args.runs, args.out, figures=args.figures, layer=args.layer, query=args.query,
                        image=args.image, average=args.average, zoom=args.zoom, labels=labels, formats=args.formats,
                        data=args.data, data_dir=args.data_dir)
    for path in written:
        print(path)
    return 0
