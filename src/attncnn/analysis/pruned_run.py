"""Remove the degenerate heads of a quadratic run and, if asked, fine-tune the rest (``attncnn prune``).

The paper's pruning experiment (the reference's ``runs/quadratic-generalized-pruned``):
which heads are degenerate and the pruned network come from :mod:`.pruning`; the fine-tune is a new
training run that starts from the pruned weights (the one use analysis makes of ``attncnn.training``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from torch import nn

from .metrics import DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE, epoch_metrics
from .pruning import PRUNED_CHECKPOINT
from ..errors import InputError
from ..perf import machine_precision, make_plan, resolve_device
from ..runs import RunFolder, RunFolderError, save_checkpoint, trained_precision
from ..training import RunOptions, train

__all__ = ["prune_run", "finetune_pruned"]

log = logging.getLogger(__name__)


def _pruned_out(run, out: str | os.PathLike[str] | None, finetune_epochs: int, overwrite: bool,
                finetune_only: dict) -> Path | None:
    """Where the pruned model goes: a run folder when fine-tuning, a checkpoint file otherwise.

    Raises:
        InputError: fine-tune options (``finetune_only``, by option name) without a fine-tune, an
            ``out`` that does not fit the mode, or one that would replace the source run.
    """
    if finetune_epochs < 0:
        raise InputError(f"--finetune-epochs must be >= 0, got {finetune_epochs}")
    if finetune_epochs == 0:
        given = [f"--{name.replace('_', '-')}" for name, value in finetune_only.items() if value is not None]
        if given:
            raise InputError(f"{', '.join(given)} only apply to a fine-tune; add --finetune-epochs N "
                             f"(the paper uses 100) or drop them")
        if out is None:
            return None
        out = Path(out)
        if out.suffix != ".safetensors":
            raise InputError(f"without --finetune-epochs, --out names the pruned checkpoint file and must end in "
                             f".safetensors, got {out}; add --finetune-epochs N to fine-tune into a run folder")
        if out.exists() and not overwrite:
            raise InputError(f"{out} already exists; use --overwrite to replace it or choose another --out")
        return out
    if out is not None:
        out = Path(out)
        if out.suffix == ".safetensors":
            raise InputError(f"with --finetune-epochs, --out names the new run folder, got the file name {out}; "
                             "drop the .safetensors suffix")
    else:
        source = run.folder.path if run.folder is not None else run.path.with_suffix("")
        out = source.parent / f"{source.name}-pruned"
    if run.folder is not None:
        # overwriting would empty the folder the weights came from.
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


def _finetune_options(run, device: str | None, precision: str | None, data_dir: str | None) -> RunOptions:
    """The fine-tune's run-time options: ``device`` (default auto), ``data_dir``, and its precision
    on that device: ``precision``, else the source run's, but fp32 for a bf16 run where the device
    has no fast bf16 (a new run of the machine at hand).

    Raises:
        InputError: a device that is not here, or a stored precision that is not one.
    """
    device = device or "auto"
    chosen = machine_precision(trained_precision(run.checkpoint, run.metadata), resolve_device(device), precision,
                               what=run.name)
    return RunOptions(device=device, precision=chosen, data_dir=data_dir)


def prune_run(path: str | os.PathLike[str], *, condition_number: float = DEFAULT_CONDITION_NUMBER,
              min_eigenvalue: float = DEFAULT_MIN_EIGENVALUE, finetune_epochs: int = 0,
              out: str | os.PathLike[str] | None = None, overwrite: bool = False, lr: float | None = None,
              batch_size: int | None = None, data: str | None = None, data_dir: str | None = None,
              device: str | None = None, precision: str | None = None, progress: bool = True,
              say: Callable[[str], None] | None = None) -> dict:
    """Prune the degenerate heads of a quadratic run (the reference code's rule,
    :func:`~attncnn.analysis.pruning.prune_degenerate_heads`); with ``finetune_epochs`` > 0
    fine-tune the pruned network into a new run folder (:func:`finetune_pruned`), else save it to
    ``out`` (a ``.safetensors`` file) if given.

    Args:
        path: the run folder or checkpoint.
        condition_number, min_eigenvalue: the degenerate-head thresholds.
        finetune_epochs: epochs of the fine-tune (0: none; the paper uses 100).
        out: the fine-tune's run folder (default ``<run>-pruned``), or without a fine-tune the
            pruned checkpoint file.
        overwrite: replace an existing ``out``.
        lr, batch_size, data, data_dir, device, precision: the fine-tune's (default: lr
            :data:`~attncnn.analysis.pruning.FINETUNE_LR`, the rest the run's own); refused without
            a fine-tune.
        progress: the fine-tune's progress bar.
        say: called with the pruning's text summary, and before a fine-tune with the line that
            announces it (the command line prints them).

    Returns:
        The counts (``pruned_per_layer``, heads and parameters before and after, MACs per image),
        ``checkpoint`` where one was saved, and after a fine-tune ``out``, ``pruned_checkpoint``,
        ``final`` and ``best``.

    Raises:
        InputError: options that do not fit (see :func:`_pruned_out`), a run without a stored recipe
            to fine-tune. Anything :func:`finetune_pruned` raises.
    """
    from .pruning import FINETUNE_LR, finetune_config, prune_degenerate_heads, pruned_metadata
    from .report import macs_per_image
    from .runs import open_run

    run = open_run(path)
    out_path = _pruned_out(run, out, finetune_epochs, overwrite, dict(
        lr=lr, batch_size=batch_size, data=data, data_dir=data_dir, device=device, precision=precision))
    macs_before = macs_per_image(run.model)
    result = prune_degenerate_heads(run.model, condition_number=condition_number, min_eigenvalue=min_eigenvalue)
    if finetune_epochs > 0:
        # Resolved (and so checked) before anything is written: bad options leave no files behind.
        config = finetune_config(_stored_config(run), result.heads_after, epochs=finetune_epochs,
                                 lr=FINETUNE_LR if lr is None else lr, batch_size=batch_size, data=data)
        options = _finetune_options(run, device, precision, data_dir)
    summary = {"run": run.name, "source_checkpoint": str(run.checkpoint), "epoch": run.metadata.get("epoch"),
               **result.to_dict(), "macs_per_image_before": macs_before,
               "macs_per_image_after": macs_per_image(run.model), "condition_number": condition_number,
               "min_eigenvalue": min_eigenvalue}
    meta = None if out_path is None else pruned_metadata(
        run.model, result, run.metadata, source=str(path), condition_number=condition_number,
        min_eigenvalue=min_eigenvalue)
    if out_path is not None and finetune_epochs == 0:
        save_checkpoint(out_path, model=run.model, metadata=meta)
        summary["checkpoint"] = str(out_path)
    say = say or (lambda text: None)
    say(_prune_text(summary, result))
    if finetune_epochs > 0:
        say(f"fine-tuning into {out_path}: {config.epochs} epochs at lr {config.lr:g} "
            f"(heads per layer {result.heads_after})")
        trained, kept = finetune_pruned(run.model, config, out_path, init_metadata=meta, options=options,
                                        mode="overwrite" if overwrite else "new", progress=progress)
        summary.update(out=str(out_path), pruned_checkpoint=str(kept), final=trained["final"], best=trained["best"])
    return summary


def _prune_text(out: dict, result) -> str:
    """The pruning's summary in a few lines."""
    total = sum(out["pruned_per_layer"])
    lines = [f"{out['run']} (epoch {out['epoch']}): {total} of {sum(result.heads_before)} heads degenerate "
             f"(condition number > {out['condition_number']:g} or largest eigenvalue < {out['min_eigenvalue']:g})",
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


def finetune_pruned(model: nn.Module, config, out: str | Path, *, init_metadata: dict, mode: str = "new",
                    progress: bool = True, options: RunOptions | None = None) -> tuple[dict, Path]:
    """Fine-tune a pruned model into a new run folder (the reference's ``quadratic-generalized-pruned``).

    The pruned weights are written to a temporary checkpoint that the run starts from
    (``TrainConfig.init_from``: weights only, fresh optimiser and schedule). When the run ends
    (finished, or failed or interrupted after its first checkpoint; one stopped before it leaves no
    folder: :func:`~attncnn.runs.unstarted.discard_if_unstarted`) that starting checkpoint is moved into the folder
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
    if mode == "new" and out.exists() and not out.is_dir():     # train(mode="new") refuses it too, but later
        raise RunFolderError(f"run folder {out} exists but is not a folder; choose another --out")
    if mode == "new" and out.is_dir() and any(out.iterdir()):
        raise RunFolderError(f"run folder {out} already exists and is not empty; use --overwrite to replace it, "
                             "or choose another --out folder")
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
