"""The paper's figures with matplotlib (Figs. 2-6, and the reference's training plot).

Figures are :class:`matplotlib.figure.Figure` objects rendered by :func:`save_figure` with the
Agg/PDF canvases; pyplot and its global state are never used.

* :func:`quadratic_layers_figure` (paper Fig. 4): each layer's heads as 50 % (solid) and 90 %
  (dotted) attention-mass contours around the query pixel (black square), one colour per head;
* :func:`quadratic_epochs_figure` (Fig. 3): the same for one layer across checkpoints;
* :func:`attention_grid_figure` (Figs. 5-7): layers x heads grid of attention maps for one query;
* :func:`accuracy_figure` (Fig. 2): test accuracy against epoch for several runs;
* :func:`layer_curves_figure`: per-layer metrics against epoch, one line per layer.

Contours are drawn from each head's Gaussian on a sub-token grid around the query (ignoring the
image border); :func:`mass_threshold` finds the level holding the stated mass, as the reference's
training plot does (``utils/plotting.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .._io import atomic_path, make_folders
from ..errors import InputError
from ..layers import QuadraticAttention
from .maps import LayerMaps, attention_layers
from .metrics import DEFAULT_CONDITION_NUMBER, DEFAULT_MIN_EIGENVALUE, degenerate_heads, quadratic_head_parameters

__all__ = ["mass_threshold", "gaussian_window", "draw_quadratic_layer", "quadratic_layers_figure",
           "quadratic_epochs_figure", "attention_grid_figure", "accuracy_figure", "layer_curves_figure", "save_figure",
           "MASSES", "head_colors"]

#: Attention-mass contours and their line styles (paper: 50 % solid, 90 % dotted).
MASSES = ((0.5, "-"), (0.9, ":"))


def head_colors(num_heads: int) -> list:
    """One distinct colour per head (tab10, or tab20 beyond 10 heads)."""
    cmap = matplotlib.colormaps["tab10" if num_heads <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(num_heads)]


def mass_threshold(values, mass: float) -> float:
    """Level ``t`` whose super-level set ``{values >= t}`` is the smallest holding ``mass`` of the total.

    Args:
        values: non-negative array of any shape (a map or a density on a grid).
        mass: fraction in (0, 1].

    Returns:
        The threshold: the entries ``>= t`` sum to at least ``mass * total``, and dropping the
        smallest of them would leave less.

    Raises:
        InputError: ``mass`` outside (0, 1], negative values or a zero total.
    """
    if not 0 < mass <= 1:
        raise InputError(f"mass must be in (0, 1], got {mass}")
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0 or v.min() < 0 or v.sum() <= 0:
        raise InputError("values must be non-negative with a positive total")
    order = np.sort(v)[::-1]
    cum = np.cumsum(order) / order.sum()
    index = min(int(np.searchsorted(cum, mass - 1e-12)), order.size - 1)
    return float(order[index])


def gaussian_window(center, inverse_covariance, radius: float, resolution: int = 12):
    """A head's Gaussian ``exp(-1/2 (d - Delta)^T Sigma^-1 (d - Delta))`` on a square window of shifts.

    Args:
        center: ``(2,)`` center Delta (row, col shift in tokens).
        inverse_covariance: ``(2, 2)`` Sigma^-1 (isotropic quadratic heads: ``2 alpha I``).
        radius: the window covers shifts ``[-radius, radius]`` on both axes (tokens).
        resolution: samples per token.

    Returns:
        ``(rows (n,), cols (n,), density (n, n))`` with the density normalised to sum 1 over the
        window (density[i, j] at row shift rows[i], column shift cols[j]).
    """
    n = int(round(2 * radius * resolution)) + 1
    axis = np.linspace(-radius, radius, n)
    rr, cc = np.meshgrid(axis, axis, indexing="ij")
    d = np.stack([rr - float(center[0]), cc - float(center[1])], axis=-1)
    inv = np.asarray(inverse_covariance, dtype=np.float64)
    log_density = -0.5 * np.einsum("...i,ij,...j->...", d, inv, d)
    density = np.exp(log_density - log_density.max())
    return axis, axis, density / density.sum()


def _window_radius(centers: np.ndarray, minimum: float = 4.5) -> float:
    """Half-width of the plotted window: the reference's 9x9 grid, grown to hold every center."""
    if centers.size == 0:
        return minimum
    return max(minimum, math.ceil(float(np.abs(centers).max()) + 1.5) + 0.5)


def draw_quadratic_layer(ax, centers, inverse_covariances, *, radius: float | None = None,
                         resolution: int = 12, title: str | None = None, degenerate=None) -> dict:
    """Draw one layer's heads as mass contours around the query on ``ax``.

    Args:
        ax: a matplotlib Axes.
        centers: ``(N_h, 2)`` head centers (row, col shift in tokens).
        inverse_covariances: ``(N_h, 2, 2)`` Sigma^-1 per head.
        radius: window half-width in tokens (default: 4.5, grown to hold every center).
        resolution: Gaussian samples per token.
        degenerate: optional bool ``(N_h,)``; degenerate heads are drawn with a cross at the center.

    Returns:
        ``{"radius": window half-width used, "contours": [(head, mass, ContourSet), ...]}``. The x
        axis is the column shift, the y axis the row shift (pointing down); the query pixel is the
        black square at (0, 0). A head whose mass sits in one sample gets no contour, only its
        center marker.
    """
    centers = np.asarray(centers, dtype=np.float64).reshape(-1, 2)
    invs = np.asarray(inverse_covariances, dtype=np.float64).reshape(-1, 2, 2)
    radius = _window_radius(centers) if radius is None else radius
    colors = head_colors(len(centers))
    drawn = []
    ticks = np.arange(-math.floor(radius), math.floor(radius) + 1)
    for h, (center, inv) in enumerate(zip(centers, invs)):
        rows, cols, density = gaussian_window(center, inv, radius, resolution)
        for mass, style in sorted(MASSES, reverse=True):
            level = mass_threshold(density, mass)
            if level >= density.max():          # all the mass in one sample: mark the center instead
                continue
            drawn.append((h, mass, ax.contour(cols, rows, density, levels=[level], colors=[colors[h]],
                                              linestyles=[style], linewidths=1.4)))
        marker = "x" if degenerate is not None and bool(degenerate[h]) else "."
        ax.plot([center[1]], [center[0]], marker=marker, color=colors[h], ms=5)
    ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, facecolor="black", edgecolor="black", zorder=5))
    ax.set_xlim(-radius, radius)
    ax.set_ylim(radius, -radius)
    ax.set_aspect("equal")
    ax.set_xticks(ticks[::2] if len(ticks) > 9 else ticks)
    ax.set_yticks(ticks[::2] if len(ticks) > 9 else ticks)
    edges = np.arange(-math.floor(radius) - 0.5, math.floor(radius) + 1)   # token boundaries
    ax.set_xticks(edges, minor=True)
    ax.set_yticks(edges, minor=True)
    ax.grid(which="minor", color="0.9", lw=0.5)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=6, which="both", length=0)
    if title:
        ax.set_title(title, fontsize=9)
    return {"radius": radius, "contours": drawn}


def _quadratic_layers(model) -> list[QuadraticAttention]:
    layers = attention_layers(model)
    if not all(layer.has_centers for layer in layers):
        raise InputError("center/contour figures need a quadratic-attention model (presets quadratic, "
                         "quadratic-generalized, many-heads, demo); use the attention-map grid for others")
    return layers


def _panel_grid(count: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(count, max_cols)
    return math.ceil(count / cols), cols


def _legend(fig: Figure, num_heads: int, degenerate: bool = False) -> None:
    """Heads by colour, the contours' masses, and what the markers are: a dot at a head's center,
    a cross at a degenerate head's (``degenerate``: some head drawn is), the query's black square."""
    from matplotlib.lines import Line2D

    colors = head_colors(num_heads)
    handles = [Line2D([], [], color=colors[h], lw=2, label=f"head {h + 1}") for h in range(num_heads)]
    handles += [Line2D([], [], color="0.3", ls=style, label=f"{int(mass * 100)} % mass") for mass, style in MASSES]
    handles.append(Line2D([], [], color="0.3", marker=".", ls="none", ms=6, label="head's center"))
    if degenerate:
        handles.append(Line2D([], [], color="0.3", marker="x", ls="none", ms=5,
                              label=f"degenerate head (condition > {DEFAULT_CONDITION_NUMBER:g} or "
                                    f"eigenvalues < {DEFAULT_MIN_EIGENVALUE:g})"))
    handles.append(Line2D([], [], color="black", marker="s", ls="none", ms=5, label="query pixel"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=7, frameon=False)


def _contour_figure(panels: list[tuple[str, dict, np.ndarray]], *, max_cols: int, side: float, num_heads: int,
                    radius: float | None, title: str | None) -> Figure:
    """One panel of head contours per ``(title, quadratic_head_parameters, degenerate)``, on a
    common window (``radius``; default: large enough for every panel's centers)."""
    if radius is None:
        radius = max(_window_radius(p["center"].numpy()) for _, p, _ in panels)
    rows, cols = _panel_grid(len(panels), max_cols)
    fig = Figure(figsize=(side * cols, side * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (label, p, degenerate) in zip(axes.flat, panels):
        draw_quadratic_layer(ax, p["center"].numpy(), p["inverse_covariance"].numpy(), radius=radius, title=label,
                             degenerate=degenerate)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    _legend(fig, num_heads, degenerate=any(bool(d.any()) for _, _, d in panels))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def quadratic_layers_figure(model, *, title: str | None = None, radius: float | None = None) -> Figure:
    """Every layer's head contours at one checkpoint (paper Fig. 4; Figs. 11, 13 for variants).

    Args:
        model: an image transformer with quadratic attention.
        radius: common window half-width (default: large enough for every layer's centers).

    Raises:
        InputError: the model is not a quadratic-attention transformer.
    """
    layers = _quadratic_layers(model)
    panels = [(f"Layer {i + 1}", quadratic_head_parameters(layer), degenerate_heads(layer).numpy())
              for i, layer in enumerate(layers)]
    return _contour_figure(panels, max_cols=3, side=3.0, radius=radius, title=title,
                           num_heads=max(layer.num_heads for layer in layers))      # a pruned model's layers differ


def quadratic_epochs_figure(snapshots: Sequence[tuple[int, object]], layer: int, *,
                            title: str | None = None) -> Figure:
    """One layer's head contours across checkpoints: the centers moving in training (paper Fig. 3).

    Args:
        snapshots: ``(epoch, model)`` pairs in the order to draw (e.g. the periodic checkpoints).
        layer: 1-based layer number.

    Raises:
        InputError: no snapshots, a model that is not quadratic, or ``layer`` out of range.
    """
    if not snapshots:
        raise InputError("no checkpoints to draw: train with --checkpoint-every to keep periodic checkpoints")
    panels = []
    for epoch, model in snapshots:
        layers = _quadratic_layers(model)
        if not 1 <= layer <= len(layers):
            raise InputError(f"layer {layer} does not exist: the model has layers 1..{len(layers)}")
        chosen = layers[layer - 1]
        panels.append((f"epoch {epoch}", quadratic_head_parameters(chosen), degenerate_heads(chosen).numpy()))
    return _contour_figure(panels, max_cols=4, side=2.8, radius=None, title=title or f"Layer {layer} during training",
                           num_heads=len(panels[0][1]["center"]))


def attention_grid_figure(maps: Sequence[LayerMaps], query: tuple[int, int], *, image=None, zoom: int | None = None,
                          title: str | None = None, image_index: int = 0) -> Figure:
    """Layers (rows) x heads (columns) of attention probabilities for one query token (Figs. 5-7).

    Args:
        maps: per-layer maps with all ``H*W`` queries (from :func:`~attncnn.analysis.attention_maps`
            or :func:`~attncnn.analysis.position_maps`).
        query: ``(row, col)`` of the query token.
        image: optional ``(C, H_img, W_img)`` uint8 image drawn in an extra first column, with the
            query's patch outlined.
        zoom: show only the ``(2 zoom + 1)^2`` tokens around the query (paper Fig. 5: 3, i.e. 7x7).
        image_index: which image of a per-image batch to draw (ignored for batch-1 maps).

    Raises:
        InputError: empty ``maps`` or a query outside the grid.
    """
    if not maps:
        raise InputError("no attention maps to draw")
    h, w = maps[0].height, maps[0].width
    r, c = query
    if not (0 <= r < h and 0 <= c < w):
        raise InputError(f"query token ({r}, {c}) is outside the {h}x{w} token grid")
    nh = max(m.probs.shape[1] for m in maps)
    extra = 1 if image is not None else 0
    fig = Figure(figsize=(1.3 * (nh + extra) + 0.4, 1.3 * len(maps) + 0.5), layout="constrained")
    axes = fig.subplots(len(maps), nh + extra, squeeze=False)
    r0, r1, c0, c1 = 0, h, 0, w
    if zoom is not None:
        r0, r1, c0, c1 = max(0, r - zoom), min(h, r + zoom + 1), max(0, c - zoom), min(w, c + zoom + 1)
    q = r * w + c
    for i, m in enumerate(maps):
        values = m.probs[min(image_index, m.probs.shape[0] - 1)]             # (N_h, Q, N)
        row = values[:, q] if m.queries is None else values[:, m.queries.index(q)]
        grid = row.reshape(-1, h, w)[:, r0:r1, c0:c1].numpy()
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
        axes[i, 0].set_ylabel(f"layer {i + 1}", fontsize=8)        # the image column's, or the first head's
        for j in range(nh):
            ax = axes[i, j + extra]
            if j >= grid.shape[0]:
                ax.set_visible(False)
                continue
            ax.imshow(grid[j], cmap="Blues", vmin=0, vmax=max(float(grid[j].max()), 1e-12),
                      extent=(c0 - 0.5, c1 - 0.5, r1 - 0.5, r0 - 0.5), interpolation="nearest")
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor="black", edgecolor="black"))
            if i == 0:
                ax.set_title(f"head {j + 1}", fontsize=8)
        if extra and i == 0:
            img = np.asarray(torch.as_tensor(image).permute(1, 2, 0))
            axes[i, 0].imshow(img, interpolation="nearest")
            ph, pw = img.shape[0] / h, img.shape[1] / w
            axes[i, 0].add_patch(Rectangle((c * pw - 0.5, r * ph - 0.5), pw, ph, fill=False, edgecolor="red", lw=1.5))
        elif extra:
            axes[i, 0].set_frame_on(False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def accuracy_figure(curves: dict[str, tuple[Sequence[float], Sequence[float]]], *,
                    title: str = "Test accuracy", xlabel: str = "epoch", logx: bool = False,
                    points: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                    bands: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> Figure:
    """Test accuracy against epoch, one line per run (paper Fig. 2), or against another x.

    Args:
        curves: ``label -> (epochs, accuracies)`` (accuracies as fractions).
        xlabel: x-axis label (e.g. ``"seen images"``).
        logx: logarithmic x axis.
        points: ``label -> (x, accuracies)`` drawn as hollow markers in the colour of ``label``'s
            line (labels missing from ``curves`` are ignored).
        bands: ``label -> (low, high)`` accuracies at ``label``'s x values, shaded in its colour
            (no band where low == high).

    Raises:
        InputError: no curves.
    """
    if not curves:
        raise InputError("no runs to plot")
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for label, (epochs, acc) in curves.items():
        (line,) = ax.plot(list(epochs), [100 * a for a in acc], label=label, lw=1.5,
                          marker="." if len(epochs) < 12 else None)
        if bands and label in bands and any(h > lo for lo, h in zip(*bands[label])):
            low, high = bands[label]
            ax.fill_between(list(epochs), [100 * a for a in low], [100 * a for a in high], color=line.get_color(),
                            alpha=0.2, lw=0)
        if points and label in points:
            xs, ys = points[label]
            ax.scatter(list(xs), [100 * a for a in ys], s=18, facecolors="none", edgecolors=line.get_color(),
                       linewidths=0.9, zorder=3)
    ax.set_xlabel(xlabel)
    if logx:
        ax.set_xscale("log")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def layer_curves_figure(panels: dict[str, dict[int, tuple[Sequence[float], Sequence[float]]]], *,
                        title: str | None = None, xlabel: str = "epoch") -> Figure:
    """Per-layer curves against epoch: one panel per metric, one line per layer (light: layer 1).

    Args:
        panels: ``y-axis label -> {layer: (epochs, values)}``, e.g. ``{"attention distance
            (tokens)": {1: ([1, 2], [1.9, 1.7]), ...}}``.
        xlabel: x-axis label (the curves' x values are epochs by default).

    Raises:
        InputError: no panel, or a panel without curves.
    """
    if not panels or not all(panels.values()):
        raise InputError("no per-layer curves to plot (only position-only models log them every epoch)")
    fig = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (ylabel, curves) in zip(axes, panels.items()):
        cmap = matplotlib.colormaps["viridis"]
        for n, (layer, (epochs, values)) in enumerate(sorted(curves.items())):
            ax.plot(list(epochs), list(values), marker=".", lw=1.5, label=f"layer {layer}",
                    color=cmap(0.9 - 0.8 * n / max(1, len(curves) - 1)))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def save_figure(fig: Figure, path: str | Path, formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> list[Path]:
    """Write ``fig`` as ``path`` with each format's suffix, atomically.

    Args:
        path: destination without suffix (any suffix given is replaced).
        formats: matplotlib formats, e.g. ``("png", "pdf")``.
        dpi: resolution of raster formats.

    Returns:
        The files written.

    Raises:
        attncnn.errors.OutputError (an OSError): the folder is not writable.
    """
    path = Path(path)
    make_folders(path.parent)
    written = []
    for fmt in formats:
        dest = path.with_suffix(f".{fmt}")
        with atomic_path(dest, suffix=f".{fmt}") as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi)
        written.append(dest)
    return written
