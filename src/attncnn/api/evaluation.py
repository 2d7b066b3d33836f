"""Test accuracy and loss of a run folder or checkpoint, as ``attncnn evaluate`` prints them."""

from __future__ import annotations

import os

from ..errors import InputError

__all__ = ["evaluate_run"]


def evaluate_run(path: str | os.PathLike[str], *, checkpoint: str | None = None, data: str | None = None,
                 data_dir: str | None = None, download: bool = False, device: str = "auto", batch_size: int = 500,
                 precision: str | None = None, sample: int | None = None,
                 predictions: str | os.PathLike[str] | None = None, progress: bool = True) -> dict:
    """Evaluate a trained network on the test images of its data set (``attncnn evaluate``).

    Args:
        path: a run folder (its ``last`` checkpoint unless ``checkpoint`` says otherwise) or a
            ``.safetensors`` checkpoint.
        checkpoint: which checkpoint of a run folder: ``last``, ``best``, ``epoch_0010``, ...
        data: the data set; default the run's own (never another one).
        data_dir: cache folder for official archives.
        download: download official archives if missing.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``.
        batch_size: images per forward pass.
        precision: ``fp32``, ``bf16`` or ``auto``; default the run's own, but fp32 for a bf16 run on a
            device without fast bf16 and where the run's precision is not known.
        sample: evaluate a fixed, class-balanced sample of this many test images (seed 0).
        predictions: also write the top-1 class of each evaluated image to this JSON file
            (:func:`attncnn.runs.write_predictions`).
        progress: show the pass's progress as ``attncnn train`` shows an epoch's.

    Returns:
        ``{"path", "checkpoint", "dataset", "epoch", "precision", "precision_from" (in words),
        "test_accuracy" (fraction in [0, 1]), "test_loss" (mean cross-entropy, nats), "examples",
        "seconds"}``, plus ``"sample"`` and ``"predictions"`` when given.

    Raises:
        InputError: weights holding NaN or infinite values; a data set with another number of classes
            or image size than the network was trained on; ``sample`` outside ``1..test images``; a
            bad device or precision.
        MissingFileError: no such run folder or checkpoint.
        OutputError: ``predictions`` cannot be written.
    """
    import torch

    from ..data import DeviceLoader, ImageSplit, class_balanced_subset, load_dataset, run_data
    from ..perf import device_name, resolve_device
    from ..runs import PredictionRecord, checkpoint_of, load_model, write_predictions
    from ..runs.loading import OLD_MACHINE_FIELDS
    from ..training import evaluate

    device = resolve_device(device)
    checkpoint = checkpoint_of(path, checkpoint)     # a run folder: its last, unless told otherwise
    model, meta = load_model(checkpoint, device)
    _check_finite(model, checkpoint)
    stored = meta.get("config", {})
    spec = run_data(stored.get("data"), data, run=checkpoint)
    dataset = load_dataset(spec, data_dir=data_dir or meta.get(OLD_MACHINE_FIELDS, {}).get("data_dir"),
                           download=download)
    _check_fits(meta, dataset, spec, checkpoint)
    test, indices = dataset.test, None
    if sample is not None:
        if not 1 <= sample <= len(test):
            raise InputError(f"--sample must be between 1 and {len(test)} (the test images of {spec}), got {sample}")
        indices = class_balanced_subset(test.labels, sample, seed=0)
        test = ImageSplit(test.images[indices], test.labels[indices])
    loader = DeviceLoader(test, batch_size=batch_size, device=device, train=False)
    precision, precision_from = _chosen_precision(checkpoint, meta, device, precision, str(path))
    result = evaluate(model, loader, precision=precision, keep_predictions=predictions is not None, progress=progress)
    out = {"path": str(path), "checkpoint": str(checkpoint), "dataset": dataset.source,
           "epoch": meta.get("epoch"), "precision": precision, "precision_from": precision_from,
           "test_accuracy": result.accuracy, "test_loss": result.loss, "examples": result.examples,
           "seconds": round(result.seconds, 3)}
    if sample is not None:
        out["sample"] = sample
    if predictions is not None:
        write_predictions(predictions, PredictionRecord(
            checkpoint=checkpoint.name, epoch=meta.get("epoch"), dataset=dataset.shareable_name, precision=precision,
            torch=torch.__version__, test_accuracy=result.accuracy,
            indices=None if indices is None else indices.tolist(), predictions=result.predictions.tolist(),
            device=device_name(device), precision_from=precision_from))
        out["predictions"] = str(predictions)
    return out


def _check_finite(model, checkpoint) -> None:
    """Refuse weights holding NaN or infinite values: every image would get NaN logits, and the
    accuracy that of a constant guess."""
    import torch

    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise InputError(f"{checkpoint}: the weights {', '.join(bad[:3])}{more} hold NaN or infinite values, so every "
                         "image would get NaN scores; evaluate a checkpoint from before the loss diverged "
                         "(--checkpoint best, or epoch_NNNN)")


def _chosen_precision(checkpoint, meta: dict, device, requested: str | None, what: str) -> tuple[str, str]:
    """``(precision, where it came from)`` for evaluating ``checkpoint`` on ``device``
    (:func:`attncnn.perf.machine_precision`), the second in words: ``"--precision"``, ``"the run's
    machine.json"`` (with the reason where a bf16 run runs in fp32 here), or why it is not known.

    Raises:
        InputError: a bad ``requested`` or stored precision.
    """
    from ..perf import machine_precision
    from ..runs.loading import precision_source

    stored, where = precision_source(checkpoint, meta)
    precision = machine_precision(stored, device, requested, what=what)
    if requested is not None:
        return precision, "--precision" if requested == precision else f"--precision {requested}: the device's choice"
    if stored is None:
        return precision, f"{where}: fp32 (give --precision bf16 for a run that trained in bf16)"
    if stored != precision:
        return precision, (f"{where} says {stored}; {precision} here, where {stored} is slow (--precision {stored} "
                           "keeps it)")
    return precision, where


def _check_fits(meta: dict, dataset, spec: str, checkpoint) -> None:
    """Refuse a data set whose class count or image size is not the network's.

    Raises:
        InputError: another number of classes, or test images of another height x width.
    """
    from .classifier import training_image_size

    classes = meta.get("classes")
    if classes is not None and len(classes) != dataset.num_classes:
        raise InputError(f"the model has {len(classes)} classes but {spec} has {dataset.num_classes}; "
                         "pass the --data the model was trained on")
    trained, given = training_image_size(meta), tuple(dataset.test.images.shape[-2:])
    if trained is not None and given != trained:
        raise InputError(f"{checkpoint} was trained on {trained[0]}x{trained[1]} images (height x width), but the "
                         f"test images of {spec} are {given[0]}x{given[1]}; its answers for another size are "
                         f"unreliable. Evaluate it on images of {trained[0]}x{trained[1]} (the data set it was "
                         "trained on), or resize them first")
