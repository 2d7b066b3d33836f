"""``attncnn evaluate``: test accuracy and loss of a run folder or checkpoint
(:func:`attncnn.api.evaluation.evaluate_run`)."""

from __future__ import annotations

import argparse
import json

from ..runs.config import PRECISIONS
from ._parsing import run_or_model

__all__ = ["register", "handle"]


def register(sub) -> None:
    """Add ``evaluate``."""
    e = sub.add_parser("evaluate", help="test accuracy and loss of a run folder or checkpoint")
    e.add_argument("path", metavar="RUN_OR_CHECKPOINT", type=run_or_model,
                   help="run folder, checkpoint file, or a trained model's name (quadratic-mini)")
    e.add_argument("--checkpoint", metavar="NAME",
                   help="which checkpoint of a run folder: last (default: the final weights, the epoch the "
                        "reports quote), best (the epoch of highest test accuracy), epoch_0010, ...")
    e.add_argument("--data", help="dataset (default: the run's own: its recorded path, or for an older or shared "
                                  "run a relative one looked for from here, the run folder and the folders above "
                                  "it; never another data set)")
    e.add_argument("--data-dir", help="cache folder for official archives (default: $ATTNCNN_DATA_DIR or "
                                      "~/.cache/attncnn)")
    e.add_argument("--download", action="store_true", help="download official archives if missing")
    e.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    e.add_argument("--batch-size", type=int, default=500, help="images per forward pass")
    e.add_argument("--precision", choices=PRECISIONS,
                   help="default: the run's own (its machine.json), but fp32 for a bf16 run on a device without "
                        "fast bf16 (a CPU without AVX512-BF16 or AMX), and fp32 where it is not known (a checkpoint "
                        "outside its run folder, a run from before --precision existed); auto: the device's choice. "
                        "The result names the precision and where it came from")
    e.add_argument("--sample", type=int, metavar="N",
                   help="evaluate a fixed sample of N test images, as equally many of each class as possible "
                        "(the same images every time: seed 0), instead of all of them")
    e.add_argument("--predictions", metavar="FILE",
                   help="also write the top-1 class predicted for each evaluated image to FILE (JSON; beside a "
                        "run: its folder's predictions.json, which checks of the run compare a --sample with)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--no-progress", action="store_true",
                   help="no progress bar (without a terminal: no progress lines, which a pass of half a minute or "
                        "more writes about every tenth of the test set)")

    e.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Run ``attncnn evaluate``; prints the result and returns the exit status."""
    from ..api.evaluation import evaluate_run

    out = evaluate_run(args.path, checkpoint=args.checkpoint, data=args.data, data_dir=args.data_dir,
                       download=args.download, device=args.device, batch_size=args.batch_size,
                       precision=args.precision, sample=args.sample, predictions=args.predictions,
                       progress=not args.no_progress)
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
