"""Per-layer and per-head attention metrics of a trained run, as ``attncnn inspect`` prints them:
:func:`inspect_run`, and :func:`inspect_text`, its text form (gates of GPSA layers included)."""

from __future__ import annotations

import os

from ..perf.precision import running_at
from .locality import DEFAULT_LOCALITY_IMAGES
from .metrics import DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE

__all__ = ["inspect_run", "inspect_text"]


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


def inspect_text(result: dict) -> str:
    """The text table of ``attncnn inspect`` for :func:`~attncnn.analysis.metrics.model_metrics`'s result
    (plus ``run``, ``epoch``, ``kind`` and optionally ``checkpoint``, the file read): one line per layer,
    one row per head."""
    h, w = result["grid"]
    source = f"{result['images']} test images" if result["images"] else "position-only maps (input-independent)"
    lines = [f"{result['run']} (epoch {result['epoch']}, {result['kind']}): {h}x{w} token grid, {source}, "
             f"queries {'all' if not result['margin'] else 'at least %d from the border' % result['margin']}",
             "distance: mean attention distance in tokens (ViT Fig. 7), /side: the same over the grid side "
             f"{result['side']:g}; peak: mean max probability; entropy in nats, n.ent.: over log(H*W) "
             "(0 one-hot, 1 uniform)"]
    best = result["min_distance"]
    lines.append(f"most local head: layer {best['layer']} head {best['head']}, mean attention distance "
                 f"{best['distance']:.2f} tokens ({best['normalized_distance']:.3f} of the grid side)")
    if result.get("checkpoint"):
        lines.insert(1, f"checkpoint: {result['checkpoint']}")
    for layer in result["layers"]:
        grid = layer["grid"]
        extra = f", {layer['degenerate_heads']} degenerate" if "degenerate_heads" in layer else ""
        # GPSA (ConViT): sigmoid(lambda_h), the weight of the positional softmax in each head's mix.
        gated = "gate" in layer
        if gated:
            extra += f", mean gate {layer['gate']:.3f}"
        lines.append("")
        lines.append(f"layer {layer['layer']} ({layer['kind']}): distance {layer['distance']:.2f} "
                     f"(/side {layer['normalized_distance']:.3f}; most local head {layer['min_distance']:.2f}, "
                     f"{layer['local_heads']} of {layer['num_heads']} heads within 1.5 tokens), "
                     f"peak {layer['peak']:.3f}, entropy {layer['entropy']:.2f} "
                     f"(normalised {layer['normalized_entropy']:.3f}), distance to the nearest "
                     f"{grid['kernel_size']}x{grid['kernel_size']} grid {layer['grid_distance']:.3f} "
                     f"(centers from {layer['centers_from']}){extra}")
        quadratic = "center" in layer["heads"][0]
        header = f"  {'head':>4} {'distance':>8} {'/side':>6} {'peak':>6} {'entropy':>7} {'n.ent.':>6}"
        header += f"  {'center (row, col)':>18} {'spread':>22} {'degen.':>6}" if quadratic else \
            f"  {'mean shift (row, col)':>21}"
        if gated:
            header += f" {'gate':>6}"
        lines.append(header)
        for head in layer["heads"]:
            text = (f"  {head['head']:>4} {head['distance']:>8.2f} {head['normalized_distance']:>6.3f} "
                    f"{head['peak']:>6.3f} {head['entropy']:>7.2f} {head['normalized_entropy']:>6.3f}")
            if quadratic:
                center = "({:+.2f}, {:+.2f})".format(*head["center"])
                if "alpha" in head:
                    spread = f"alpha {head['alpha']:.3g}"
                else:
                    cond = head["condition_number"]
                    spread = "eig {:.2g}/{:.2g} k {}".format(*head["eigenvalues"],
                                                             "inf" if cond is None else f"{cond:.3g}")
                text += f"  {center:>18} {spread:>22} {'yes' if head['degenerate'] else '':>6}"
            else:
                text += "  {:>21}".format("({:+.2f}, {:+.2f})".format(*head["shift"]))
            if gated:
                text += f" {head['gate']:>6.3f}"
            lines.append(text)
    return "\n".join(lines)
