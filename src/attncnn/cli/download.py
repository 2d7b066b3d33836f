"""``attncnn download NAME --from URL_OR_FOLDER``: fetch a width-400 trained model into the user cache
(:func:`attncnn.api.downloads.download`).
"""

from __future__ import annotations

import argparse
import math

__all__ = ["register"]


def register(subparsers) -> None:
    d = subparsers.add_parser(
        "download", help="fetch a width-400 trained model into the user cache, each file checked by sha256",
        description="Copy a trained model that does not come with the package (the width-400 runs of "
                    "results/paper-long: quadratic, quadratic-generalized, learned, resnet18) into the user cache "
                    "($ATTNCNN_CACHE_DIR, else $XDG_CACHE_HOME/attncnn, else ~/.cache/attncnn), where "
                    "attncnn.pretrained(NAME) finds it. Every file is checked against the size and sha256 the "
                    "package records, and moved into place only when all of them match: a failed or wrong download "
                    "leaves nothing behind.")
    d.add_argument("name", metavar="NAME", help="the model: quadratic, quadratic-generalized, learned or resnet18")
    d.add_argument("--from", dest="source", required=True, metavar="URL_OR_FOLDER",
                   help="a copy of a clone's results/ folder: a local folder, or an http(s) address serving the "
                        "same paths (the files of NAME are at paper-long/NAME/seed0/... under it)")
    d.add_argument("--timeout", type=_seconds, default=60.0, metavar="SECONDS",
                   help="seconds to wait for the server on each connection or read (default: 60)")
    d.add_argument("--deadline", type=_seconds, metavar="SECONDS",
                   help="seconds the whole download may take (default: --timeout plus the model's size at 32 KiB/s, "
                        "so a server that trickles bytes cannot hold it)")
    d.set_defaults(handler=_download)


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse turns the error into one usage line)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:          # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds, e.g. 60")
    return value


def _download(args: argparse.Namespace) -> int:
    from ..api.downloads import download

    folder = download(args.name, args.source, timeout=args.timeout, deadline=args.deadline)
    print(f"{args.name}: {folder} (load it with attncnn.pretrained({args.name!r}))")
    return 0
