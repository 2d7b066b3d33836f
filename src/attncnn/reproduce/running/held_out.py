"""Validation accuracy of a subset cell's run on training images it never saw (the learning-rate sweep's).

The ``efficiency-scarce`` learning-rate sweep chooses the rate that the grid's content cells then
train with, and the grid reports their test accuracy. Choosing it by that same test accuracy
would let the test set pick a hyper-parameter of what it measures; the sweep's 10 % cell trains on
5,000 of CIFAR-10's 50,000 training images, so the 45,000 it never sees hold a clean validation
set. :func:`held_out_result` evaluates a finished run's ``last`` checkpoint (the epoch the sweep
compares) on ``images`` of them (:func:`attncnn.data.held_out_indices`: class-balanced, seeded
by the run's seed) and caches the result in the run folder as ``held_out.json``, so the report is
rewritten without the data set once every run has one.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..._io import atomic_write_json
from ...data import Dataset, DeviceLoader, ImageSplit, held_out_indices
from ...errors import InputError
from ...perf import resolve_device
from ...perf.precision import machine_precision
from ...runs import RunFolder, load_model, trained_precision
from ...runs.checkpoint import read_metadata
from ...training import evaluate

__all__ = ["HELD_OUT_IMAGES", "HELD_OUT_FILE", "held_out_result", "held_out_results", "cached_held_out"]

#: validation images per run: as many as the test set, so both accuracies have the same binomial
#: noise (about +-0.5 points at 55 %)
HELD_OUT_IMAGES = 10_000
#: the cache in the run folder (kept when the folder is trimmed for committing)
HELD_OUT_FILE = "held_out.json"


def _key(folder: Path, images: int) -> dict | None:
    """What the cached result must match: the ``last`` checkpoint's epoch, the held-out size and the
    training subset it complements; None while the run has not finished."""
    if not (folder / "finished.json").is_file():
        return None                                    # also a cell not started: no folder at all
    last = RunFolder(folder, mode="read").checkpoint_path("last")
    if not last.is_file():
        return None
    meta = read_metadata(last)
    config = json.loads((folder / "config.json").read_text())
    if not config.get("train_subset"):
        raise InputError(f"run {folder} trained on the whole training set: no image is held out to validate on; "
                         "validate runs of a subset cell (--train-subset)")
    return {"epoch": int(meta["epoch"]), "images": images, "train_subset": int(config["train_subset"]),
            "seed": int(config["seed"]), "dataset_name": meta.get("dataset_name")}


def _cached(folder: Path, key: dict | None) -> dict | None:
    """The cached result in ``folder`` if it matches ``key`` (from :func:`_key`), else None."""
    path = folder / HELD_OUT_FILE
    if key is None or not path.is_file():
        return None
    cached = json.loads(path.read_text())
    return cached if all(cached.get(k) == v for k, v in key.items()) else None


def cached_held_out(folder: str | Path, *, images: int = HELD_OUT_IMAGES) -> dict | None:
    """The run's cached held-out result if it matches its ``last`` checkpoint, else None (also for a
    run that has not finished)."""
    folder = Path(folder)
    return _cached(folder, _key(folder, images))


def held_out_result(folder: str | Path, dataset: Dataset | None, *, images: int = HELD_OUT_IMAGES,
                    device: str = "cpu") -> dict | None:
    """Loss and accuracy of a finished subset run's ``last`` checkpoint on ``images`` training
    images outside its subset, at the run's precision (fp32 for a bf16 run on a device without fast
    bf16); cached in ``<folder>/held_out.json``.

    Returns:
        ``{"accuracy", "loss", "examples", "epoch", "images", "train_subset", "seed",
        "dataset_name", "precision"}``, or None for a run that has not finished.

    Raises:
        InputError: ``dataset`` is None and nothing is cached (give the command ``--data``); a
            ``dataset`` other than the run's (its pixel digest differs); a run on the whole training
            set.
    """
    folder = Path(folder)
    key = _key(folder, images)
    cached = _cached(folder, key)
    if cached is not None or key is None:
        return cached
    return _measure(folder, key, dataset, device)


def _measure(folder: Path, key: dict, dataset: Dataset | None, device: str) -> dict:
    """Evaluate the run's ``last`` checkpoint on its held-out images and cache the result (errors:
    :func:`held_out_result`)."""
    if dataset is None:
        raise InputError(f"run {folder} has no held-out accuracy yet; give --data (the data set it trained on) to "
                         "measure it")
    if key["dataset_name"] and dataset.digest not in key["dataset_name"]:
        raise InputError(f"run {folder} trained on {key['dataset_name']}, not on {dataset.shareable_name}: its "
                         "held-out images would be other images; give --data the run's data set")
    device = resolve_device(device)
    idx = held_out_indices(dataset.train.labels, key["train_subset"], key["seed"], key["images"])
    split = ImageSplit(dataset.train.images[idx], dataset.train.labels[idx])
    model, meta = load_model(RunFolder(folder, mode="read").checkpoint_path("last"), device)
    # the run's own precision, but fp32 for a bf16 run where bf16 is slow (same accuracy, many times faster there)
    precision = machine_precision(trained_precision(RunFolder(folder, mode="read").checkpoint_path("last"), meta),
                                  device, what=f"run {folder}")
    result = evaluate(model, DeviceLoader(split, batch_size=500, device=device, train=False), precision=precision)
    found = {**key, "accuracy": result.accuracy, "loss": result.loss, "examples": result.examples,
             "precision": precision}
    atomic_write_json(folder / HELD_OUT_FILE, found)
    return found


def held_out_results(folders, load_dataset, *, images: int = HELD_OUT_IMAGES, device: str = "cpu") -> dict:
    """:func:`held_out_result` of each folder (``{folder: result or None}``); ``load_dataset()``
    returns the data set and is called once, only if some finished run has no cached result."""
    dataset = None
    found = {}
    for folder in map(Path, folders):
        key = _key(folder, images)                      # read once: it opens the checkpoint's header
        cached = _cached(folder, key)
        if cached is not None or key is None:
            found[folder] = cached
            continue
        if dataset is None:
            dataset = load_dataset()
        found[folder] = _measure(folder, key, dataset, device)
    return found
