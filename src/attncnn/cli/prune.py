"""``attncnn prune``: remove the degenerate heads of a quadratic run and, if asked, fine-tune the rest
(:func:`attncnn.analysis.pruned_run.prune_run`)."""

from __future__ import annotations

import argparse
import json

from ._run_arguments import add_run_arguments, run_keywords

__all__ = ["register", "handle"]


def register(sub) -> None:
    pr = sub.add_parser(
        "prune", help="remove degenerate quadratic heads; report counts; optionally save or fine-tune",
        description="Removes the degenerate heads of a quadratic run (the reference code's rule: isotropic s^2 < min "
                    "eigenvalue; full covariance: condition number of Sigma^-1 above the limit or largest "
                    "eigenvalue below the minimum) and reports the per-layer counts and parameters before/after. "
                    "With --finetune-epochs N it fine-tunes the pruned model into a new run folder like the "
                    "paper's quadratic-generalized-pruned run (the run's own recipe with a fresh optimiser and a "
                    "restarted warm-up + cosine schedule; paper: 100 epochs at lr 0.01). Without it, --out saves "
                    "the pruned model as a checkpoint file that evaluate, inspect and plot read.")
    add_run_arguments(pr, "RUN")
    pr.add_argument("--condition-number", type=float, default=1000.0,
                    help="prune full-covariance heads above this condition number (default 1000, the reference "
                         "code; the paper's text says 1e5)")
    pr.add_argument("--min-eigenvalue", type=float, default=1e-5,
                    help="prune heads whose largest eigenvalue of Sigma^-1 is below this (default 1e-5)")
    add_run_arguments(pr, "--json", json="print JSON")
    pr.add_argument("--finetune-epochs", type=int, default=0, metavar="N",
                    help="fine-tune the pruned model for N epochs into a new run folder (default 0: only report; "
                         "the paper fine-tunes for 100)")
    pr.add_argument("--out", metavar="PATH",
                    help="with --finetune-epochs N: the new run folder (default: RUN-pruned); without: write the "
                         "pruned model to this .safetensors checkpoint file")
    pr.add_argument("--overwrite", action="store_true", help="replace an existing --out folder or file")
    pr.add_argument("--lr", type=float,
                    help="peak learning rate of the fine-tune (default 0.01, 10x below the paper's 0.1)")
    add_run_arguments(
        pr, "--batch-size", "--data", "--data-dir", "--device", "--precision", "--no-progress",
        batch_size="fine-tune batch (default: the run's)", data="fine-tune data set (default: the run's)",
        data_dir="cache folder for official archives (default: the run's)",
        device={"default": None, "help": "fine-tune device: auto, cpu, cuda, cuda:N (default: the run's)"},
        precision="fine-tune precision (default: the run's, but fp32 for a bf16 run on a device without fast bf16, "
                  "a CPU without AVX512-BF16 or AMX; auto: the device's choice)",
        no_progress="no progress bar while fine-tuning")
    pr.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..analysis.pruned_run import prune_run

    say = None if args.json else (lambda text: print(text, flush=True))
    out = prune_run(args.run, condition_number=args.condition_number, min_eigenvalue=args.min_eigenvalue,
                    finetune_epochs=args.finetune_epochs, out=args.out, overwrite=args.overwrite, lr=args.lr,
                    say=say, **run_keywords(args))
    if args.json:
        print(json.dumps(out, indent=2))
    elif "final" in out:
        final = out["final"]
        print(f"run folder: {out['out']} (pruned starting weights: {out['pruned_checkpoint']})")
        if final:
            print(f"test accuracy: {final['test_accuracy']:.4f}  (test loss {final['test_loss']:.4f}, "
                  f"epoch {final['epoch']}, best {out['best']['accuracy']:.4f} at epoch {out['best']['epoch']})")
    return 0
