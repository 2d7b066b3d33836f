"""``attncnn inspect``: per-layer and per-head attention metrics of a run
(:func:`attncnn.analysis.inspection.inspect_run`)."""

from __future__ import annotations

import argparse
import json

from ._parsing import quiet_logs
from ._run_arguments import add_run_arguments, run_keywords

__all__ = ["register", "handle"]


def register(sub) -> None:
    i = sub.add_parser("inspect", help="per-layer and per-head attention metrics of a run",
                              description="Mean attention distance (in tokens and over the grid side), peak "
                                          "probability, entropy and normalised entropy per head (from hooked real "
                                          "activations, averaged over queries and test images), quadratic "
                                          "centers/spreads and degenerate heads, and each layer's distance to a "
                                          "KxK grid of shifts.")
    add_run_arguments(i, "RUN", "--json")
    i.add_argument("--images", type=int, default=1000,
                   help="test images the measures of models whose attention depends on the input are averaged "
                        "over (default 1000; position-only models need none)")
    i.add_argument("--margin", type=int, default=0,
                   help="average only over queries at least this many tokens from the border (default 0: all)")
    i.add_argument("--condition-number", type=float, default=1000.0,
                   help="degenerate-head threshold (default: the reference code's)")
    i.add_argument("--min-eigenvalue", type=float, default=1e-5,
                   help="degenerate-head threshold (default: the reference code's)")
    add_run_arguments(i, "--data", "--data-dir", "--precision=measure")
    i.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..analysis.inspection import inspect_run, inspect_text

    with quiet_logs(args.json):
        result = inspect_run(args.run, images=args.images, margin=args.margin,
                             condition_number=args.condition_number, min_eigenvalue=args.min_eigenvalue,
                             **run_keywords(args))
    print(json.dumps(result, indent=2) if args.json else inspect_text(result))
    return 0
