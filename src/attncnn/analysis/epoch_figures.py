"""Figures of runs followed over many epochs and several seeds (a long suite's report).

* :func:`seed_curves_figure`: one metric per layer against epoch, one line per seed, with a
  threshold line;
* :func:`centers_over_epochs_figure` (paper Fig. 3 for several layers): the heads' contours at
  chosen epochs and each center's path, drawn from logged centers and spreads.

Like :mod:`.figures`, these build :class:`matplotlib.figure.Figure` objects without pyplot.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from ..errors import InputError
from .figures import _legend, _panel_grid, _window_radius, draw_quadratic_layer, head_colors

__all__ = ["seed_curves_figure", "centers_over_epochs_figure"]


def seed_curves_figure(curves: dict[int, dict[int, tuple[Sequence[int], Sequence[float]]]], *, ylabel: str,
                       threshold: float | None = None, threshold_label: str = "", title: str | None = None) -> Figure:
    """One panel per layer, one line per seed, against epoch.

    Args:
        curves: ``{layer: {seed: (epochs, values)}}``.
        ylabel: y-axis label (with its unit).
        threshold: draw a dashed horizontal line at this value (None: none).
        threshold_label: the legend text of that line.

    Raises:
        InputError: no curves.
    """
    if not curves or not any(curves.values()):
        raise InputError("no per-layer curves to plot (only position-only models log them every epoch)")
    rows, cols = _panel_grid(len(curves))
    fig = Figure(figsize=(3.4 * cols, 2.7 * rows + 0.3), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    seeds = sorted({seed for per_seed in curves.values() for seed in per_seed})
    cmap = matplotlib.colormaps["tab10"]
    for ax, (layer, per_seed) in zip(axes.flat, sorted(curves.items())):
        for seed, (epochs, values) in sorted(per_seed.items()):
            ax.plot(list(epochs), list(values), lw=1.3, color=cmap(seeds.index(seed) % 10), label=f"seed {seed}")
        if threshold is not None:
            ax.axhline(threshold, color="0.3", ls="--", lw=1, label=threshold_label or None)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


#: a column of :func:`centers_over_epochs_figure`: an epoch of the run drawn, or ``(name, epoch)`` of another
Column = int | tuple[str, int]


def centers_over_epochs_figure(layers: dict[int, Sequence[tuple[int, np.ndarray, np.ndarray]]],
                               drawn: Sequence[Column], *, title: str | None = None,
                               others: dict[str, dict[int, Sequence[tuple[int, np.ndarray, np.ndarray]]]] | None = None,
                               notes: dict[Column, str] | None = None) -> Figure:
    """Rows: layers; columns: the ``drawn`` epochs. Each panel: the layer's heads at that epoch as
    50 % / 90 % attention-mass contours and the path of each center from the first logged epoch.

    Args:
        layers: ``{layer: [(epoch, centers (N_h, 2), Sigma^-1 (N_h, 2, 2)), ...]}`` in epoch order.
        drawn: the columns, in order: an epoch of ``layers``, or ``(name, epoch)``, an epoch of the
            run ``others[name]``; a column a layer lacks stays empty.
        others: name -> another run's snapshots, as ``layers``.
        notes: column (as in ``drawn``) -> a line added to the titles of its panels.

    Raises:
        InputError: no layer or no epoch to draw, or a column names a run ``others`` lacks.
    """
    if not layers or not drawn:
        raise InputError("no centers to draw: the run logged no quadratic centers per epoch")
    runs = {None: layers, **(others or {})}
    unknown = [c for c in drawn if isinstance(c, tuple) and c[0] not in runs]
    if unknown:
        raise InputError(f"columns {unknown} name runs not given (others: {sorted(others or {})})")
    every = np.concatenate([c for run in runs.values() for snaps in run.values() for _, c, _ in snaps])
    radius = _window_radius(every)
    fig = Figure(figsize=(2.5 * len(drawn), 2.5 * len(layers) + 0.6), layout="constrained")
    axes = fig.subplots(len(layers), len(drawn), squeeze=False)
    num_heads = 1
    for row, layer in enumerate(sorted(layers)):
        for col, column in enumerate(drawn):
            name, epoch = column if isinstance(column, tuple) else (None, column)
            snaps = runs[name].get(layer, ())
            by_epoch = {e: (centers, invs) for e, centers, invs in snaps}
            ax = axes[row, col]
            if epoch not in by_epoch:
                ax.set_visible(False)
                continue
            centers, invs = by_epoch[epoch]
            num_heads = max(num_heads, len(centers))
            path = np.stack([c for e, c, _ in snaps if e <= epoch])         # (epochs so far, N_h, 2)
            for h, color in enumerate(head_colors(len(centers))):
                ax.plot(path[:, h, 1], path[:, h, 0], color=color, lw=0.7, alpha=0.6)
            label = f"layer {layer}, {name + ' ' if name else ''}epoch {epoch}"
            note = (notes or {}).get(column)
            draw_quadratic_layer(ax, centers, invs, radius=radius, title=label + (f"\n{note}" if note else ""))
    _legend(fig, num_heads)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
