"""ViT's Fig. 7 for our models: each head's mean attention distance against its layer, one dot per head.

As Dosovitskiy et al. (ICLR 2021, Fig. 7 right), from :class:`~.locality.Locality` results of
several runs, with the normalised distance on the right axis and, in a second panel, each head's
normalised entropy. The dotted line at 1.5 tokens is the reach of a 3x3 convolution (its diagonal
taps are 1.41 tokens from the center): heads below it attend, on average, within that window.
"""

from __future__ import annotations

from typing import Mapping

import matplotlib
from matplotlib.figure import Figure

from ..errors import InputError
from .locality import LOCAL_HEAD_DISTANCE, Locality

__all__ = ["locality_figure"]


def locality_figure(runs: Mapping[str, Locality], *, title: str | None = None) -> Figure:
    """Mean attention distance (left panel) and normalised entropy (right panel) of every head, per layer.

    Args:
        runs: ``label -> Locality`` (e.g. ``{"seed 0": ..., "seed 1": ...}``); each run's dots are
            shifted a little along x so that runs do not hide each other.
        title: figure title; the images averaged (or "position-only") are added below it.

    Returns:
        A :class:`matplotlib.figure.Figure` (save it with :func:`~.figures.save_figure`).

    Raises:
        InputError: no runs.
    """
    if not runs:
        raise InputError("no locality results to plot")
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax_distance, ax_entropy = fig.subplots(1, 2)
    colors = matplotlib.colormaps["tab10"]
    width = 0.6 / len(runs)                                 # the band of x each layer's dots share
    side = next(iter(runs.values())).side
    for n, (label, locality) in enumerate(runs.items()):
        offset = -0.3 + width * (n + 0.5)
        for ax, field in ((ax_distance, "distance"), (ax_entropy, "normalized_entropy")):
            xs, ys = [], []
            for layer in locality.layers:
                values = getattr(layer, field).tolist()
                xs += [layer.layer + 1 + offset] * len(values)
                ys += values
            ax.scatter(xs, ys, s=14, color=colors(n % 10), alpha=0.8, label=label, linewidths=0)
    num_layers = max(len(loc.layers) for loc in runs.values())
    for ax in (ax_distance, ax_entropy):
        ax.set_xticks(range(1, num_layers + 1))
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    ax_distance.axhline(LOCAL_HEAD_DISTANCE, color="grey", lw=0.8, ls=":")
    ax_distance.set_ylabel("mean attention distance (tokens)")
    ax_distance.set_ylim(bottom=0)
    right = ax_distance.secondary_yaxis("right", functions=(lambda d: d / side, lambda f: f * side))
    right.set_ylabel(f"/ grid side ({side:g} tokens)")
    ax_entropy.set_ylabel("normalised entropy")
    ax_entropy.set_ylim(0, 1.02)
    if len(runs) > 1:
        ax_distance.legend(fontsize=7)
    counts = sorted({loc.images for loc in runs.values()})
    source = "position-only maps (no images needed)" if counts == [0] else \
        "averaged over " + " / ".join(f"{c:,}" for c in counts) + " test images"
    fig.suptitle(f"{title}\n{source}" if title else source, fontsize=9)
    return fig
