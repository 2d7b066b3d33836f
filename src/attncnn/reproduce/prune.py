"""``attncnn prune``: remove the degenerate heads of a quadratic run and, if asked, fine-tune the rest.

The paper's pruning experiment (the reference's ``runs/quadratic-generalized-pruned``):
which heads are degenerate and the pruned network come from :mod:`attncnn.analysis.pruning`; the
fine-tune is a new training run that starts from the pruned weights, so it lives here, above both
the analysis and the training. Registered by :mod:`attncnn.cli`; the handler returns the exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path

from torch import nn

from ..analysis.metrics import epoch_metrics
from ..analysis.pruning import PRUNED_CHECKPOINT
from ..errors import InputError
from ..perf import machine_precision, make_plan, resolve_device
from ..runs import PRECISIONS, RunFolder, RunFolderError, save_checkpoint, trained_precision
from ..training import RunOptions, train

__all__ = ["register", "cmd_prune", "finetune_pruned"]

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``prune`` subcommand."""
    pr = subparsers.add_parser(
        "prune", help="remove degenerate quadratic heads; report counts; optionally save or fine-tune",
        description="Removes the degenerate heads of a quadratic run (the reference code's rule: isotropic s^2 < min "
                    "eigenvalue; full covariance: condition number of Sigma^-1 above the limit or largest "
                    "eigenvalue below the minimum) and reports the per-layer counts and parameters before/after. "
                    "With --finetune-epochs N it fine-tunes the pruned model into a new run folder like the "
                    "paper's quadratic-generalized-pruned run (the run's own recipe with a fresh optimiser and a "
                    "restarted warm-up + cosine schedule; paper: 100 epochs at lr 0.01). Without it, --out saves "
                    "the pruned model as a checkpoint file that evaluate, inspect and plot read.")
    pr.add_argument("run", metavar="RUN", help="run folder or checkpoint file")
    pr.add_argument("--condition-number", type=float, default=1000.0,
                    help="prune full-covariance heads above this condition number (default 1000, the reference "
                         "code; the paper's text says 1e5)")
    pr.add_argument("--min-eigenvalue", type=float, default=1e-5,
                    help="prune heads whose largest eigenvalue of Sigma^-1 is below this (default 1e-5)")
    pr.add_argument("--json", action="store_true", help="print JSON")
    pr.add_argument("--finetune-epochs", type=int, default=0, metavar="N",
                    help="fine-tune the pruned model for N epochs into a new run folder (default 0: only report; "
                         "the paper fine-tunes for 100)")
    pr.add_argument("--out", metavar="PATH",
                    help="with --finetune-epochs N: the new run folder (default: RUN-pruned); without: write the "
                         "pruned model to this .safetensors checkpoint file")
    pr.add_argument("--overwrite", action="store_true", help="replace an existing --out folder or file")
    pr.add_argument("--lr", type=float,
                    help="peak learning rate of the fine-tune (default 0.01, 10x below the paper's 0.1)")
    pr.add_argument("--batch-size", type=int, help="fine-tune batch (default: the run's)")
    pr.add_argument("--data", help="fine-tune data set (default: the run's)")
    pr.add_argument("--data-dir", help="cache folder for official archives (default: the run's)")
    pr.add_argument("--device", help="fine-tune device: auto, cpu, cuda, cuda:N (default: the run's)")
    pr.add_argument("--precision", choices=PRECISIONS,
                    help="fine-tune precision (default: the run's, but fp32 for a bf16 run on a device without fast "
                         "bf16, a CPU without AVX512-BF16 or AMX; auto: the device's choice)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar while fine-tuning")
    pr.set_defaults(handler=cmd_prune)


#: prune options that only apply to a fine-tune (--finetune-epochs N > 0)
_FINETUNE_OPTIONS = ("lr", "batch_size", "data", "data_dir", "device", "precision")


def _pruned_out(args: argparse.Namespace, run) -> Path | None:
    """Where the pruned model goes: a run folder when fine-tuning, a checkpoint file otherwise.

    Raises:
        InputError: an --out that does not fit the mode, or one that would replace the source run.
    """
    if args.finetune_epochs < 0:
        raise InputError(f"--finetune-epochs must be >= 0, got {args.finetune_epochs}")
    if args.finetune_epochs == 0:
        given = [f"--{name.replace('_', '-')}" for name in _FINETUNE_OPTIONS if getattr(args, name) is not None]
        if given:
            raise InputError(f"{', '.join(given)} only apply to a fine-tune; add --finetune-epochs N "
                             f"(the paper uses 100) or drop them")
        if args.out is None:
            return None
        out = Path(args.out)
        if out.suffix != ".safetensors":
            raise InputError(f"without --finetune-epochs, --out names the pruned checkpoint file and must end in "
                             f".safetensors, got {out}; add --finetune-epochs N to fine-tune into a run folder")
        if out.exists() and not args.overwrite:
            raise InputError(f"{out} already exists; use --overwrite to replace it or choose another --out")
        return out
    if args.out is not None:
        out = Path(args.out)
        if out.suffix == ".safetensors":
            raise InputError(f"with --finetune-epochs, --out names the new run folder, got the file name {out}; "
                             "drop the .safetensors suffix")
    else:
        source = run.folder.path if run.folder is not None else run.path.with_suffix("")
        out = source.parent / f"{source.name}-pruned"
    if run.folder is not None:
        # --overwrite would empty the folder the weights came from.
        src, dst = run.folder.path.resolve(), out.resolve()
        if dst == src or dst in src.parents:
            raise InputError(f"--out {out} would replace the source run {run.folder.path}; choose another folder")
    return out


def _stored_config(run) -> dict:
    """The source run's training configuration: the checkpoint's copy, else the folder's config.json."""
    config = run.metadata.get("config")
    if isinstance(config, dict):
        return config
    if run.folder is not None:
        return run.folder.read_config()
    raise InputError(f"{run.path} stores no training configuration, so it cannot be fine-tuned; prune a "
                     "checkpoint written by `attncnn train`")


def _finetune_options(run, args: argparse.Namespace) -> RunOptions:
    """The fine-tune's run-time options: ``--device`` (default auto), ``--data-dir``, and its precision
    on that device: ``--precision``, else the source run's, but fp32 for a bf16 run where the device
    has no fast bf16 (a new run of the machine at hand).

    Raises:
        InputError: a device that is not here, or a stored precision that is not one.
    """
    device = args.device or "auto"
    precision = machine_precision(trained_precision(run.checkpoint, run.metadata), resolve_device(device),
                                  args.precision, what=run.name)
    return RunOptions(device=device, precision=precision, data_dir=args.data_dir)


def cmd_prune(args: argparse.Namespace) -> int:
    from ..analysis.pruning import FINETUNE_LR, finetune_config, prune_degenerate_heads, pruned_metadata
    from ..analysis.report import macs_per_image
    from ..analysis.runs import open_run

    run = open_run(args.run)
    out_path = _pruned_out(args, run)
    finetune = args.finetune_epochs > 0
    macs_before = macs_per_image(run.model)
    result = prune_degenerate_heads(run.model, condition_number=args.condition_number,
                                    min_eigenvalue=args.min_eigenvalue)
    config = None
    if finetune:
        # Resolved (and so checked) before anything is written: bad options leave no files behind.
        stored = _stored_config(run)
        config = finetune_config(stored, result.heads_after, epochs=args.finetune_epochs,
                                 lr=FINETUNE_LR if args.lr is None else args.lr, batch_size=args.batch_size,
                                 data=args.data)
        options = _finetune_options(run, args)
    out = {"run": run.name, "source_checkpoint": str(run.checkpoint), "epoch": run.metadata.get("epoch"),
           **result.to_dict(),
           "macs_per_image_before": macs_before, "macs_per_image_after": macs_per_image(run.model),
           "condition_number": args.condition_number, "min_eigenvalue": args.min_eigenvalue}
    meta = None
    if out_path is not None:
        meta = pruned_metadata(run.model, result, run.metadata, source=str(args.run),
                               condition_number=args.condition_number, min_eigenvalue=args.min_eigenvalue)
    if out_path is not None and not finetune:
        save_checkpoint(out_path, model=run.model, metadata=meta)
        out["checkpoint"] = str(out_path)
    if not args.json:
        print(_prune_text(out, result, args))
    if finetune:
        if not args.json:
            print(f"fine-tuning into {out_path}: {config.epochs} epochs at lr {config.lr:g} "
                  f"(heads per layer {result.heads_after})", flush=True)
        summary, kept = finetune_pruned(run.model, config, out_path, init_metadata=meta, options=options,
                                        mode="overwrite" if args.overwrite else "new",
                                        progress=not args.no_progress)
        out.update(out=str(out_path), pruned_checkpoint=str(kept), final=summary["final"], best=summary["best"])
        if not args.json:
            final = summary["final"]
            print(f"run folder: {out_path} (pruned starting weights: {kept})")
            if final:
                print(f"test accuracy: {final['test_accuracy']:.4f}  (test loss {final['test_loss']:.4f}, "
                      f"epoch {final['epoch']}, best {summary['best']['accuracy']:.4f} at epoch "
                      f"{summary['best']['epoch']})")
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def _prune_text(out: dict, result, args: argparse.Namespace) -> str:
    total = sum(out["pruned_per_layer"])
    lines = [f"{out['run']} (epoch {out['epoch']}): {total} of {sum(result.heads_before)} heads degenerate "
             f"(condition number > {args.condition_number:g} or largest eigenvalue < {args.min_eigenvalue:g})",
             f"pruned per layer: {out['pruned_per_layer']}  (heads {result.heads_before} -> {result.heads_after})",
             f"checkpoint: {out['source_checkpoint']}"]
    for i, heads in enumerate(result.pruned):
        if heads:
            lines.append(f"  layer {i + 1}: heads {', '.join(str(h + 1) for h in heads)}")
    lines.append(f"parameters: {result.parameters_before:,} -> {result.parameters_after:,}; "
                 f"MACs per image: {out['macs_per_image_before'] / 1e9:.3f} G -> "
                 f"{out['macs_per_image_after'] / 1e9:.3f} G")
    if "checkpoint" in out:
        lines.append(f"pruned model: {out['checkpoint']} (attncnn evaluate {out['checkpoint']})")
    return "\n".join(lines)


def _out_of_reach(out: Path) -> None:
    """Refuse a folder that train(mode="new") would refuse, before anything is written."""
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"run folder {out} exists but is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        raise RunFolderError(f"run folder {out} already exists and is not empty; use --overwrite to replace it, "
                             "or choose another --out folder")


def finetune_pruned(model: nn.Module, config, out: str | Path, *, init_metadata: dict, mode: str = "new",
                    progress: bool = True, options: RunOptions | None = None) -> tuple[dict, Path]:
    """Fine-tune a pruned model into a new run folder (the reference's ``quadratic-generalized-pruned``).

    The pruned weights are written to a temporary checkpoint that the run starts from
    (``TrainConfig.init_from``: weights only, fresh optimiser and schedule). As soon as the run
    folder exists (also when training fails or is interrupted) that checkpoint is moved into it
    as ``checkpoints/pruned.safetensors`` and ``config.json``'s ``init_from`` is pointed at it,
    so the folder holds everything needed to repeat the run. The checkpoints written during
    training keep the temporary path in their stored ``config`` (only informative: a resume
    reads ``config.json``, whose ``init_from`` names the kept file; it loads it again only when
    the run stopped before its first checkpoint).

    Args:
        model: the pruned network (its ``config.layer_heads`` must match ``config.model``).
        config: the ``TrainConfig`` (see :func:`finetune_config`); its ``init_from`` is replaced.
        out: the new run folder.
        init_metadata: metadata for the pruned checkpoint (see :func:`pruned_metadata`).
        mode: ``"new"`` (refuse a non-empty folder) or ``"overwrite"``.
        progress: show the trainer's progress bar.
        options: the run-time options (:class:`~attncnn.training.RunOptions`; default: none given).

    Returns:
        ``(training summary, path of the kept pruned checkpoint)``.

    Raises:
        ValueError: bad ``mode``. RunFolderError: ``out`` cannot be used.
        Anything :func:`attncnn.training.train` raises (TrainingInterrupted: resume the folder with
        ``attncnn train --resume``).
    """
    if mode not in ("new", "overwrite"):
        raise ValueError(f"mode must be 'new' or 'overwrite', got {mode!r}")
    out = Path(out)
    if mode == "new":
        _out_of_reach(out)
    tmp = Path(tempfile.mkdtemp(prefix="attncnn-prune-"))
    init = tmp / f"{PRUNED_CHECKPOINT}.safetensors"
    kept = out / "checkpoints" / f"{PRUNED_CHECKPOINT}.safetensors"
    try:
        save_checkpoint(init, model=model, metadata=init_metadata)
        run_config = dataclasses.replace(config, init_from=str(init))
        try:
            summary = train(run_config, out, make_plan(run_config, options), mode=mode, progress=progress,
                            epoch_metrics=epoch_metrics)
        finally:
            _keep_in_run(out, init, kept)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary, kept


def _keep_in_run(out: Path, init: Path, kept: Path) -> None:
    """Move the starting checkpoint into the run folder if this call's run created the folder (its
    config.json names ``init``); a run that failed before starting leaves the folder alone."""
    try:
        stored = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return                     # the run stopped before it wrote its configuration
    if not isinstance(stored, dict) or stored.get("init_from") != str(init) or not init.is_file():
        return                     # an older run's config.json (overwrite refused early): not ours
    run = RunFolder(out, mode="resume")
    try:
        with run.writing(kept):
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(init), str(kept))
        stored["init_from"] = str(kept)
        run.write_config(stored)
    finally:
        run.close()
    log.info("kept the pruned starting weights as %s", kept)
