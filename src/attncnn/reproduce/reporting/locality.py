"""The locality of every finished run of a Table 1 suite, for its report and figures: each head's mean
attention distance and normalised entropy (:mod:`attncnn.analysis.locality`), every seed.

Table 1's locality column is the most local head of the model (the minimum over layers and heads of
the mean attention distance, as arXiv 2605.16390 summarises a run), mean over the seeds; the
section :func:`locality_lines` writes shows per layer what makes "the plus" visible in numbers:
how many heads stay within 1.5 tokens (the reach of a 3x3 convolution), the most local head, and
the heads' mean normalised entropy.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ...analysis.locality import DEFAULT_LOCALITY_IMAGES, LOCAL_HEAD_DISTANCE, model_locality
from ...analysis.maps import attention_layers
from ...analysis.runs import test_count, test_images
from .results import RunResult

__all__ = ["run_locality", "suite_locality", "locality_summary", "locality_cell", "locality_lines"]

# one measurement per run folder and setting while a report is written: the figures and the
# report's tables read the same numbers (content models take a minute or more on a CPU)
_MEASURED: dict[tuple, dict | None] = {}


def run_locality(result: RunResult, *, images: int = DEFAULT_LOCALITY_IMAGES, data: str | None = None,
                 data_dir: str | None = None) -> dict | None:
    """:meth:`~attncnn.analysis.locality.Locality.to_dict` of a run's trained model with its ``seed``,
    from the first ``images`` test images for input-dependent models (all the data set has where it
    has fewer; position-only models need none). None for a model without attention layers; a run
    shipped without its weights gives what was measured before they were withheld (its record's
    ``locality``), or None."""
    key = (str(result.job.folder), images, data, data_dir)
    if key not in _MEASURED:
        _MEASURED[key] = _measure(result, images, data, data_dir)
    return _MEASURED[key]


def _measure(result: RunResult, images: int, data: str | None, data_dir: str | None) -> dict | None:
    model = result.run.model
    if model is None:
        return (result.run.withheld or {}).get("locality")
    try:
        layers = attention_layers(model)
    except ValueError:                                       # the ResNet baseline
        return None
    batch = None
    if not all(layer.position_only for layer in layers):
        count = min(images, test_count(result.run, data=data, data_dir=data_dir))
        batch, _ = test_images(result.run, list(range(count)), data=data, data_dir=data_dir)
    return {"seed": result.job.seed, **model_locality(model, batch).to_dict()}


def suite_locality(results: dict[str, list[RunResult]], **options) -> dict[str, list[dict]]:
    """Per preset, :func:`run_locality` of every finished seed (models without attention left out)."""
    measured = {preset: [m for r in runs if (m := run_locality(r, **options)) is not None]
                for preset, runs in results.items()}
    return {preset: found for preset, found in measured.items() if found}


def locality_summary(per_seed: Sequence[dict]) -> dict:
    """Table 1's locality entry: the most local head's mean attention distance, mean (and sample
    standard deviation, None for one seed) over the seeds, in tokens and over the grid side."""
    tokens = [m["min_distance"]["distance"] for m in per_seed]
    fractions = [m["min_distance"]["normalized_distance"] for m in per_seed]
    return {"seeds": [m["seed"] for m in per_seed], "min_distance": tokens,
            "mean": statistics.fmean(tokens), "std": statistics.stdev(tokens) if len(tokens) > 1 else None,
            "normalized_mean": statistics.fmean(fractions),
            "images": sorted({m["images"] for m in per_seed})}


def locality_cell(summary: dict | None) -> str:
    """``"0.52 ± 0.05 (0.033)"``: tokens (mean ± std over seeds) and, in brackets, over the grid side."""
    if summary is None:
        return "-"
    text = f"{summary['mean']:.2f}"
    if summary["std"] is not None:
        text += f" ± {summary['std']:.2f}"
    return text + f" ({summary['normalized_mean']:.3f})"


def _per_layer(layers: Sequence[dict], text) -> str:
    return " / ".join(text(layer) for layer in layers)


def locality_lines(locality: dict[str, list[dict]]) -> list[str]:
    """Markdown table of every measured seed, per layer 1..L: heads within 1.5 tokens, the most
    local head (tokens), the heads' mean distance over the grid side and their mean normalised entropy."""
    lines = [f"| model | seed | test images | heads within {LOCAL_HEAD_DISTANCE:g} tokens, layer 1..L | "
             "most local head (tokens) | mean distance / grid side | normalised entropy |", "|" + "---|" * 7]
    for preset, per_seed in locality.items():
        for m in per_seed:
            layers = m["layers"]
            heads = _per_layer(layers, lambda lay: f"{lay['local_heads']} of {lay['num_heads']}")
            lines.append(f"| {preset} | {m['seed']} | {m['images'] or 'none needed'} | {heads} | "
                         f"{_per_layer(layers, lambda lay: format(lay['min_distance'], '.2f'))} | "
                         f"{_per_layer(layers, lambda lay: format(lay['normalized_distance'], '.3f'))} | "
                         f"{_per_layer(layers, lambda lay: format(lay['normalized_entropy'], '.2f'))} |")
    return lines
