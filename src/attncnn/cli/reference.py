"""``attncnn convert-reference`` and ``attncnn export-reference``: reference checkpoints in and out."""

from __future__ import annotations

import argparse

from ._parsing import RUN_HELP, run_or_model

__all__ = ["register"]


def register(sub) -> None:
    """Add the two commands to the ``attncnn`` subparsers ``sub``."""
    c = sub.add_parser("convert-reference", help="turn a reference (epfml/attention-cnn) checkpoint into a run folder",
                       description="Convert a checkpoint written by the reference code's train.py (best.checkpoint, "
                                   "final.checkpoint, NNNN.checkpoint) into an attncnn run folder that evaluate, "
                                   "inspect, plot, viewer, theorem and prune read. Its hyperparameters come from "
                                   "the config.yaml beside it (or --config), else from the tensors' shapes.")
    c.add_argument("checkpoint", metavar="CHECKPOINT", help="the reference checkpoint file")
    c.add_argument("--out", required=True, metavar="RUN_FOLDER", help="the run folder to write (must not exist)")
    c.add_argument("--config", metavar="CONFIG_YAML", help="the run's config.yaml (default: the one beside CHECKPOINT)")
    c.add_argument("--data", help="the data set the run folder records (default: the configuration's CIFAR-10/100)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    c.set_defaults(handler=_convert)

    e = sub.add_parser("export-reference", help="write a run's network as a reference (epfml/attention-cnn) checkpoint",
                       description="Write a run folder's network (or a checkpoint file's) as the reference code's "
                                   "checkpoint format, with its config.yaml beside the file.")
    e.add_argument("run", metavar="RUN", type=run_or_model, help=RUN_HELP)
    e.add_argument("--out", required=True, metavar="CHECKPOINT", help="the reference checkpoint to write")
    e.add_argument("--checkpoint", metavar="NAME", help="which checkpoint of a run folder (default: last)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing CHECKPOINT and config.yaml")
    e.set_defaults(handler=_export)


def _convert(args: argparse.Namespace) -> int:
    from ..reference import PROVENANCE_FILE, convert_reference

    out = convert_reference(args.checkpoint, args.out, config=args.config, data=args.data, overwrite=args.overwrite)
    print(f"run folder: {out}")
    print(f"provenance: {out / PROVENANCE_FILE}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from ..reference import export_reference

    out = export_reference(args.run, args.out, checkpoint=args.checkpoint, overwrite=args.overwrite)
    print(f"reference checkpoint: {out}")
    print(f"config: {out.parent / 'config.yaml'}")
    return 0
