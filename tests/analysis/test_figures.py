"""Contours enclose the stated mass; every figure is written and non-empty."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from attncnn.analysis import position_maps
from attncnn.analysis.figures import (accuracy_figure, attention_grid_figure, draw_quadratic_layer,
                                      gaussian_window, mass_threshold, quadratic_epochs_figure,
                                      quadratic_layers_figure, save_figure)
from attncnn.models import build_model


def test_mass_threshold_gives_the_smallest_superlevel_set():
    rng = np.random.default_rng(0)
    values = rng.random((7, 9)) ** 3
    total = values.sum()
    for mass in (0.1, 0.5, 0.9, 1.0):
        t = mass_threshold(values, mass)
        inside = np.sort(values[values >= t])
        assert inside.sum() >= mass * total - 1e-12
        assert inside[1:].sum() < mass * total         # dropping the smallest entry leaves too little
    with pytest.raises(ValueError):
        mass_threshold(values, 0.0)
    with pytest.raises(ValueError):
        mass_threshold(-values, 0.5)


def _vertices(contour_set):
    return np.concatenate([p.vertices for p in contour_set.get_paths() if len(p.vertices)])


@pytest.mark.parametrize("inv_cov", [np.diag([0.8, 0.8]), np.array([[1.5, 0.6], [0.6, 0.5]])])
def test_contours_enclose_the_stated_mass(inv_cov):
    """A 2-D Gaussian's super-level set of mass m is the Mahalanobis ellipse of radius sqrt(-2 ln(1-m))."""
    center = np.array([1.0, -2.0])
    ax = Figure().subplots()
    drawn = draw_quadratic_layer(ax, center[None], inv_cov[None], radius=9.5, resolution=16)
    assert sorted(mass for _, mass, _ in drawn["contours"]) == [0.5, 0.9]
    for head, mass, contours in drawn["contours"]:
        d = _vertices(contours)[:, ::-1] - center            # (x=col, y=row) -> (row, col) shift
        mahalanobis = np.sqrt(np.einsum("ni,ij,nj->n", d, inv_cov, d))
        np.testing.assert_allclose(mahalanobis, math.sqrt(-2 * math.log(1 - mass)), rtol=0.02)
    # The discrete density on the window holds the stated mass inside its level set.
    _, _, density = gaussian_window(center, inv_cov, 9.5, 16)
    for mass in (0.5, 0.9):
        assert density[density >= mass_threshold(density, mass)].sum() == pytest.approx(mass, abs=0.01)


def test_accuracy_figure_marks_each_seed_in_its_lines_colour():
    fig = accuracy_figure({"a": ([1, 2], [0.4, 0.5]), "b": ([1, 2], [0.3, 0.2])},
                          points={"a": ([1, 1], [0.35, 0.45]), "ghost": ([1], [0.9])})
    ax = fig.axes[0]
    (dots,) = ax.collections                                   # "ghost" has no line: not drawn
    assert dots.get_offsets().tolist() == [[1, 35], [1, 45]]     # percent, like the lines
    assert tuple(dots.get_edgecolor()[0][:3]) == to_rgb(ax.lines[0].get_color())


def test_accuracy_figure_shades_a_band_in_its_lines_colour_only_where_seeds_differ():
    fig = accuracy_figure({"a": ([1, 2], [0.4, 0.5]), "b": ([1, 2], [0.3, 0.2])},
                          bands={"a": ([0.35, 0.45], [0.45, 0.55]), "b": ([0.3, 0.2], [0.3, 0.2])})
    ax = fig.axes[0]
    (band,) = ax.collections                                   # "b" (one seed: low == high) gets none
    ys = sorted({round(float(y), 6) for y in band.get_paths()[0].vertices[:, 1]})
    assert ys == [35.0, 45.0, 55.0]                              # percent, from min to max
    assert tuple(band.get_facecolor()[0][:3]) == to_rgb(ax.lines[0].get_color())


def test_figures_are_written_and_non_empty(tmp_path):
    torch.manual_seed(0)
    quad = build_model("quadratic", num_layers=2, dim=16, mlp_dim=16)
    figs = {
        "layers": quadratic_layers_figure(quad, title="t"),
        "epochs": quadratic_epochs_figure([(0, quad), (5, quad)], layer=2),
        "grid": attention_grid_figure(position_maps(build_model("learned", num_layers=2, dim=16, mlp_dim=16)),
                                      (8, 8), zoom=3, image=torch.zeros(3, 32, 32, dtype=torch.uint8)),
        "accuracy": accuracy_figure({"a": ([1, 2], [0.1, 0.5]), "b": ([1], [0.3])}),
    }
    for name, fig in figs.items():
        for path in save_figure(fig, tmp_path / name):
            assert path.stat().st_size > 1000, path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.{e}" for n in figs for e in ("pdf", "png"))
    with pytest.raises(ValueError, match="layer 3"):
        quadratic_epochs_figure([(0, quad)], layer=3)
    with pytest.raises(ValueError, match="quadratic"):
        quadratic_layers_figure(build_model("learned", num_layers=1, dim=16, mlp_dim=16))
    with pytest.raises(ValueError, match="outside"):
        attention_grid_figure(position_maps(quad), (16, 0))


def _legend_labels(fig) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def test_the_centre_figures_legend_says_what_each_marker_is():
    torch.manual_seed(0)
    quad = build_model("quadratic", num_layers=2, dim=16, mlp_dim=16)
    labels = _legend_labels(quadratic_layers_figure(quad))
    assert "head's center" in labels and "query pixel" in labels
    assert not any(label.startswith("degenerate") for label in labels)     # no cross drawn, none explained
    layer = next(m for m in quad.modules() if hasattr(m, "spreads"))
    with torch.no_grad():
        layer.spreads[0] = 0.0                    # a head of uniform attention: degenerate, drawn with a cross
    for fig in (quadratic_layers_figure(quad), quadratic_epochs_figure([(0, quad)], layer=1)):
        assert any(label.startswith("degenerate head (condition > 1000") for label in _legend_labels(fig))
