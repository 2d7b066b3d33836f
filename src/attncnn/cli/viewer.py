"""``attncnn viewer``: the paper's interactive website as one offline HTML file
(:func:`attncnn.analysis.viewer.page.write_viewer`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError, MissingFileError
from ._parsing import RUN_HELP, run_or_model
from ._run_arguments import add_run_arguments

__all__ = ["register", "handle"]


def register(sub) -> None:
    v = sub.add_parser(
        "viewer", help="one self-contained offline HTML page to explore the attention maps of runs",
        description="Write one HTML file (no network needed, data embedded and compressed) in which you pick a "
                    "run and a test image or the batch average, click a query token on the image, and see every "
                    "layer x head attention map for it: probabilities, positional (q.r) or content (q.k) scores, "
                    "with or without softmax; quadratic runs also show each head's center of attention and its "
                    "50%/90% ellipses. Open it in a current Chromium, Firefox or Safari.")
    v.add_argument("runs", nargs="+", metavar="RUN", type=run_or_model, help=RUN_HELP + " (several: one page)")
    v.add_argument("--images", default="2,3,19,56",
                   help="comma-separated test image indices, counted from 0 (default: 2,3,19,56 as on the "
                        "paper's website)")
    v.add_argument("--average", type=int, default=100,
                   help="content models: also show maps averaged over the first N test images (default 100 as "
                        "in the paper; 0: none)")
    v.add_argument("--out", default="viewer.html", help="HTML file to write (default: viewer.html)")
    v.add_argument("--title", help="page title (default: names the runs)")
    v.add_argument("--data", help="dataset for the images (default: each run's own)")
    v.add_argument("--data-dir", help="cache folder for official archives (default: each run's)")
    v.add_argument("--batch-size", type=int, default=50, help="images per forward pass (default 50)")
    add_run_arguments(v, "--precision=measure")
    v.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..analysis.runs import parse_indices
    from ..analysis.viewer.page import write_viewer
    from ..perf.precision import running_at

    indices = parse_indices(args.images)
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    missing = [r for r in args.runs if not Path(r).exists()]
    if missing:
        raise MissingFileError(f"no run folder or checkpoint at {', '.join(missing)}; pass the folder that "
                                "`attncnn train --out` wrote (or one of its .safetensors checkpoints)")
    with running_at(args.precision):
        out = write_viewer(args.runs, args.out, indices=indices, data=args.data, data_dir=args.data_dir,
                           average=args.average, batch_size=args.batch_size, title=args.title)
    size = out.stat().st_size
    print(f"viewer: {out} ({size / 1e6:.1f} MB, {len(args.runs)} run(s)); open it in a browser, no network needed")
    return 0
