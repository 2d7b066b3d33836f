"""What the page's centers view draws for quadratic heads: center Delta, Sigma^-1, mass ellipses."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...layers import GridAttention
from ..metrics import degenerate_heads, quadratic_head_parameters

__all__ = ["head_centers", "mass_ellipse"]

# Half the squared Mahalanobis radius of a 2-D Gaussian's p-mass ellipse is -ln(1 - p).
_MASSES = (0.5, 0.9)


def mass_ellipse(inverse_covariance: np.ndarray, mass: float) -> list[float] | None:
    """The ellipse holding ``mass`` of a 2-D Gaussian: ``d^T Sigma^-1 d = -2 ln(1 - mass)``.

    Args:
        inverse_covariance: ``Sigma^-1`` ``(2, 2)`` in (row, column) token coordinates.
        mass: in ``(0, 1)``.

    Returns:
        Semi-axes ``(r_col, r_row)`` in tokens and the rotation (radians, from the column axis toward
        the row axis), or None when ``Sigma^-1`` is not positive definite (the ellipse is unbounded).
    """
    eigenvalues, vectors = np.linalg.eigh(inverse_covariance)
    if eigenvalues.min() <= 1e-9:
        return None
    radius2 = -2 * math.log(1 - mass)
    radii = np.sqrt(radius2 / eigenvalues)
    v = vectors[:, 0]                                    # (row, col) of the first axis
    return [float(radii[0]), float(radii[1]), float(math.atan2(v[0], v[1]))]


def head_centers(layers: Sequence[GridAttention]) -> list[list[dict]] | None:
    """Per layer, per head of quadratic layers: ``center`` Delta (row, col), ``inv_cov`` Sigma^-1,
    ``ellipses`` of 50 % and 90 % mass (keys ``"50"``, ``"90"``; see :func:`mass_ellipse`) and the
    ``degenerate`` flag (:func:`~attncnn.analysis.metrics.degenerate_heads`).

    Returns:
        JSON-ready lists, or None when any layer is not quadratic (no centers to show).
    """
    if not all(layer.has_centers for layer in layers):
        return None
    out = []
    for layer in layers:
        params = quadratic_head_parameters(layer)
        degenerate = degenerate_heads(layer).tolist()
        heads = []
        for h in range(params["center"].shape[0]):
            inv = params["inverse_covariance"][h].numpy()
            heads.append({"center": [float(v) for v in params["center"][h]],
                          "inv_cov": [[float(v) for v in row] for row in inv],
                          "ellipses": {str(int(m * 100)): mass_ellipse(inv, m) for m in _MASSES},
                          "degenerate": bool(degenerate[h])})
        out.append(heads)
    return out
