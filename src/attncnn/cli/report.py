"""``attncnn report``: Table 1 (accuracy, parameters, MACs, images/s) of runs beside the paper's
(:func:`attncnn.analysis.report.report_rows`)."""

from __future__ import annotations

import argparse
import json

from ..errors import InputError
from ._parsing import quiet_logs
from ._run_arguments import add_run_arguments, run_keywords

__all__ = ["register", "handle"]


def register(sub) -> None:
    r = sub.add_parser("report", help="Table 1: accuracy, parameters, MACs, images/s beside the paper",
                              description="One row per run: last and best test accuracy (best = selected on the "
                                          "test set, as the reference), parameters, multiply-accumulates per "
                                          "image, training and inference images/s on this machine, epochs, "
                                          "dataset, and the paper's Table 1 numbers.")
    add_run_arguments(r, "RUN...")
    r.add_argument("--preset", action="append", default=[], metavar="NAME",
                   help="also add an untrained preset's row (sizes only; repeatable)")
    add_run_arguments(r, "--json", json="print JSON")
    r.add_argument("--markdown", action="store_true", help="print a Markdown table")
    r.add_argument("--no-speed", action="store_true", help="skip the images/s measurements")
    add_run_arguments(r, "--batch-size", batch_size={"default": 32, "help": "batch for the images/s measurements"})
    r.add_argument("--image-size", type=int, default=32)
    r.add_argument("--out", help="also write the table to this file (.json, .md or text)")
    add_run_arguments(r, "--precision=measure")
    r.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from .._io import atomic_write_text
    from ..analysis.report import markdown_table, report_rows, text_table

    if args.json and args.markdown:
        raise InputError("--json and --markdown exclude each other")
    with quiet_logs(args.json):
        rows = report_rows(args.runs, args.preset, speed=not args.no_speed, image_size=args.image_size,
                           **run_keywords(args))
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
