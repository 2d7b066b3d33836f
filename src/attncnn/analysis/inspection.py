"""Per-layer and per-head attention metrics of a trained run, as ``attncnn inspect`` prints them
(:func:`~attncnn.analysis.inspect_text.inspect_text` is its text form)."""

from __future__ import annotations

import os

from ..perf.precision import running_at
from .locality import DEFAULT_LOCALITY_IMAGES
from .metrics import DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE

__all__ = ["inspect_run"]


def inspect_run(path: str | os.PathLike[str], *, images: int = DEFAULT_LOCALITY_IMAGES, margin: int = 0,
                condition_number: float = DEFAULT_CONDITION_NUMBER, min_eigenvalue: float = DEFAULT_MIN_EIGENVALUE,
                data: str | None = None, data_dir: str | None = None, precision: str = "fp32") -> dict:
    """The :func:`~attncnn.analysis.metrics.model_metrics` of a run's network on real activations.

    Args:
        path: a run folder or checkpoint file.
        images: test images for models whose attention depends on the input (position-only
            models need none).
        margin: average only over queries at least this many tokens from the border.
        condition_number, min_eigenvalue: the degenerate-head thresholds (the reference code's).
        data, data_dir: the data set of the test images (default the run's own).
        precision: of the forward passes.

    Returns:
        ``model_metrics``'s dictionary with ``run``, ``checkpoint``, ``epoch`` and ``kind`` first.

    Raises:
        MissingFileError: no such run folder or checkpoint. InputError: a model without attention
            layers, or a data set its network cannot take.
    """
    from .maps import attention_layers
    from .metrics import model_metrics
    from .plotting import available_images
    from .runs import open_run, test_images

    run = open_run(path)
    layers = attention_layers(run.model)
    inputs = None
    if not all(layer.position_only for layer in layers):
        count = available_images(run, images, data=data, data_dir=data_dir)
        inputs, _ = test_images(run, list(range(count)), data=data, data_dir=data_dir)
    with running_at(precision):
        result = model_metrics(run.model, inputs, margin=margin, condition_number=condition_number,
                               min_eigenvalue=min_eigenvalue)
    return {"run": run.name, "checkpoint": str(run.checkpoint), "epoch": run.metadata.get("epoch"),
            "kind": run.kind, **result}
