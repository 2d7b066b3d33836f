"""``attncnn evaluate``: test accuracy and loss of a run folder or checkpoint
(:func:`attncnn.api.evaluation.evaluate_run`)."""

from __future__ import annotations

import argparse
import json

from ._run_arguments import add_run_arguments, run_keywords

__all__ = ["register", "handle"]


def register(sub) -> None:
    e = sub.add_parser("evaluate", help="test accuracy and loss of a run folder or checkpoint")
    add_run_arguments(
        e, "RUN_OR_CHECKPOINT", "--checkpoint", "--data", "--data-dir", "--download", "--device", "--batch-size",
        "--precision",
        path="run folder, checkpoint file, or a trained model's name (quadratic-mini)",
        checkpoint="which checkpoint of a run folder: last (default: the final weights, the epoch the reports "
                   "quote), best (the epoch of highest test accuracy), epoch_0010, ...",
        data="dataset (default: the run's own: its recorded path, or for an older or shared run a relative one "
             "looked for from here, the run folder and the folders above it; never another data set)",
        data_dir="cache folder for official archives (default: $ATTNCNN_DATA_DIR or ~/.cache/attncnn)",
        batch_size={"default": 500, "help": "images per forward pass"},
        precision="default: the run's own (its machine.json), but fp32 for a bf16 run on a device without fast "
                  "bf16 (a CPU without AVX512-BF16 or AMX), and fp32 where it is not known (a checkpoint outside "
                  "its run folder, a run from before --precision existed); auto: the device's choice. The result "
                  "names the precision and where it came from")
    e.add_argument("--sample", type=int, metavar="N",
                   help="evaluate a fixed sample of N test images, as equally many of each class as possible "
                        "(the same images every time: seed 0), instead of all of them")
    e.add_argument("--predictions", metavar="FILE",
                   help="also write the top-1 class predicted for each evaluated image to FILE (JSON; beside a "
                        "run: its folder's predictions.json, which checks of the run compare a --sample with)")
    add_run_arguments(e, "--json", "--no-progress",
                      no_progress="no progress bar (without a terminal: no progress lines, which a pass of half a "
                                  "minute or more writes about every tenth of the test set)")

    e.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..api.evaluation import evaluate_run

    out = evaluate_run(args.path, sample=args.sample, predictions=args.predictions, **run_keywords(args))
    if args.json:
        print(json.dumps(out))
        return 0
    sampled = "sampled " if args.sample is not None else ""
    print(f"test accuracy: {out['test_accuracy']:.4f}  test loss: {out['test_loss']:.4f}  "
          f"({out['examples']} {sampled}images of {out['dataset']}, epoch {out['epoch']}, {out['precision']})")
    print(f"checkpoint: {out['checkpoint']}")
    print(f"precision: {out['precision']} ({out['precision_from']})")
    if args.predictions is not None:
        print(f"predictions: {args.predictions}")
    return 0
