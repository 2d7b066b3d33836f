"""Numbers that summarise what each attention head learned (the paper's figures and pruning; ConViT's non-locality).

Per head, from its probabilities ``p(q, k)`` on an ``H x W`` token grid (distances in tokens):

* ``distance``: mean attention distance, ConViT's non-locality,
  ``sum_k p(q, k) * |pos(k) - pos(q)|_2``, averaged over queries (and images);
* ``peak``: the largest probability of a query's map, averaged over queries;
* ``entropy``: ``-sum_k p log p`` in nats, averaged over queries (0 one-hot, ``log(H*W)`` uniform);
* in :func:`model_metrics`' reports also the locality measures of :mod:`.locality`
  (``normalized_distance``, ``normalized_entropy``) and, per layer, ``min_distance`` and
  ``local_heads`` (heads within 1.5 tokens);
* ``shift``: the attention-weighted mean shift ``sum_k p(q, k) (pos(k) - pos(q))`` (row, col):
  the effective center of a head that has no center parameter.

All ``H*W`` queries are averaged by default (ConViT's convention); ``margin=m`` keeps only queries
at least ``m`` tokens from every border, where a head cannot reach its shift (the softmax is
renormalised over the keys inside the grid), which pulls the average towards 0.

Quadratic heads also report their center, alpha or Sigma^-1, the eigenvalues of Sigma^-1, its
condition number, and whether the head is degenerate (reference ``find_degenerated_heads``); GPSA
heads their ``gate`` ``sigmoid(lambda_h)``, the weight of the positional map. Per layer,
``grid_distance`` measures how close the heads are to a convolution (Theorem 1): the mean distance
between the centers of the best ``K^2`` heads, ``K = floor(sqrt(N_h))``, and the nearest ``K x K``
grid of shifts, optimally assigned.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch
from torch import nn

from ..errors import InputError
from ..layers import GatedPositionalAttention, QuadraticAttention, grid_positions, relative_offsets
from .locality import LOCAL_HEAD_DISTANCE, batched_probs, grid_side
from .maps import attention_layers, default_grid_size, measured_layers, position_maps, run_recorded

__all__ = ["head_statistics", "degenerate_heads", "quadratic_head_parameters", "kernel_grids",
           "optimal_assignment", "grid_distance", "model_metrics", "epoch_metrics", "flatten_metrics",
           "DEFAULT_CONDITION_NUMBER", "DEFAULT_MIN_EIGENVALUE"]

#: Pruning thresholds of the reference code (``find_degenerated_heads``; the paper's text says 1e5).
DEFAULT_CONDITION_NUMBER = 1000.0
DEFAULT_MIN_EIGENVALUE = 1e-5


def _query_mask(height: int, width: int, margin: int) -> torch.Tensor:
    """Bool ``(H*W,)``: queries at least ``margin`` tokens from every border."""
    pos = grid_positions(height, width)
    r, c = pos[:, 0], pos[:, 1]
    mask = (r >= margin) & (r <= height - 1 - margin) & (c >= margin) & (c <= width - 1 - margin)
    if not bool(mask.any()):
        raise InputError(f"no query of the {height}x{width} grid is {margin} tokens from every border; "
                         "lower the margin")
    return mask


def head_statistics(probs: torch.Tensor, height: int, width: int, *, margin: int = 0,
                    queries: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """Per-head distance, peak, entropy and mean shift of attention probabilities.

    Args:
        probs: ``(B, N_h, Q, H*W)`` or ``(N_h, Q, H*W)`` probabilities; rows sum to 1 over keys.
            ``Q = H*W`` (all queries) unless ``queries`` lists the ``Q`` query indices kept.
        height, width: the token grid.
        margin: average only over queries at least ``margin`` tokens from every border.
        queries: row-major indices of the ``Q`` queries in ``probs`` (default: all, in order).

    Returns:
        ``{"distance", "peak", "entropy"}`` each ``(N_h,)`` and ``"shift"`` ``(N_h, 2)``, float64
        on the CPU, averaged over the batch and the selected queries (distances in tokens,
        entropy in nats).

    Raises:
        InputError: shapes that do not fit the grid, or no query inside the margin.
    """
    probs = batched_probs(probs, height, width)
    n = height * width
    q_index = torch.arange(n) if queries is None else torch.as_tensor(list(queries), dtype=torch.long)
    if probs.shape[-2] != len(q_index):
        raise InputError(f"probabilities hold {probs.shape[-2]} queries but {len(q_index)} query indices were given")
    keep = _query_mask(height, width, margin)[q_index]
    if not bool(keep.any()):
        raise InputError(f"none of the given queries is {margin} tokens from every border")
    p = probs.detach().double().cpu()[:, :, keep, :]                     # (B, N_h, Q', N)
    delta = relative_offsets(height, width, dtype=torch.float64)[q_index[keep]]   # (Q', N, 2)
    dist = delta.norm(dim=-1)                                            # (Q', N)
    return {
        "distance": (p * dist).sum(-1).mean(dim=(0, 2)),
        "peak": p.amax(-1).mean(dim=(0, 2)),
        "entropy": -torch.special.xlogy(p, p).sum(-1).mean(dim=(0, 2)),
        "shift": torch.einsum("bhqk,qkc->bhqc", p, delta).mean(dim=(0, 2)),
    }


def quadratic_head_parameters(layer: QuadraticAttention) -> dict[str, torch.Tensor]:
    """Centers and spreads of a quadratic layer (float64, CPU).

    Returns:
        ``"center"`` ``(N_h, 2)`` (row, col shift in tokens); ``"inverse_covariance"``
        ``(N_h, 2, 2)``; ``"eigenvalues"`` ``(N_h, 2)`` of Sigma^-1, ascending, absolute values;
        ``"condition_number"`` ``(N_h,)`` (inf when only the smallest eigenvalue is 0, nan when both
        are, as for ``S = 0``: such a head is degenerate by its largest eigenvalue); and for isotropic
        layers ``"alpha"`` ``(N_h,)``.
    """
    with torch.no_grad():
        inv = layer.inverse_covariance.detach().double().cpu()
        inv = (inv + inv.transpose(-1, -2)) / 2
        eig = torch.linalg.eigvalsh(inv).abs().sort(dim=-1).values
        out = {"center": layer.centers.detach().double().cpu(), "inverse_covariance": inv, "eigenvalues": eig,
               "condition_number": eig[:, 1] / eig[:, 0]}
        if not layer.full_covariance:
            out["alpha"] = layer.alpha.detach().double().cpu()
    return out


def degenerate_heads(layer: QuadraticAttention, *, condition_number: float = DEFAULT_CONDITION_NUMBER,
                     min_eigenvalue: float = DEFAULT_MIN_EIGENVALUE) -> torch.Tensor:
    """Which heads of a quadratic layer are degenerate (reference ``find_degenerated_heads``).

    Isotropic heads: ``s^2 < min_eigenvalue`` (Sigma^-1 = s^2 I = 2 alpha I, nearly uniform
    attention). Full covariance: the eigenvalues of Sigma^-1 have a condition number above
    ``condition_number`` (a thin stripe) or the largest is below ``min_eigenvalue`` (uniform).

    Returns:
        Bool ``(N_h,)``.

    Raises:
        TypeError: ``layer`` is not a :class:`~attncnn.layers.QuadraticAttention`.
    """
    if not layer.has_centers:
        raise TypeError(f"degenerate heads are defined for quadratic layers, got {type(layer).__name__}")
    params = quadratic_head_parameters(layer)
    eig = params["eigenvalues"]
    flat = eig[:, 1] < min_eigenvalue
    if not layer.full_covariance:
        return flat
    return flat | (params["condition_number"] > condition_number)


# -- grid distance ------------------------------------------------------------------------------

def kernel_grids(kernel_size: int) -> list[torch.Tensor]:
    """The candidate ``K x K`` grids of integer shifts, each ``(K^2, 2)`` (row, col), row-major.

    Odd K: the one centered grid ``{-floor(K/2), ..., floor(K/2)}^2`` (paper's Delta_K). Even K
    has no centered grid; the candidates are the ``2 x 2`` placements whose range on each axis is
    ``{-K/2, ..., K/2 - 1}`` or ``{-K/2 + 1, ..., K/2}`` (all contain the query's own shift 0).

    Raises:
        InputError: ``kernel_size < 1``.
    """
    if kernel_size < 1:
        raise InputError(f"kernel size must be >= 1, got {kernel_size}")
    k = kernel_size
    starts = [-(k // 2)] if k % 2 else [-(k // 2), -(k // 2) + 1]
    grids = []
    for r0, c0 in itertools.product(starts, starts):
        rows = torch.arange(r0, r0 + k, dtype=torch.float64)
        cols = torch.arange(c0, c0 + k, dtype=torch.float64)
        grids.append(torch.stack(torch.meshgrid(rows, cols, indexing="ij"), -1).reshape(-1, 2))
    return grids


def optimal_assignment(cost: Sequence[Sequence[float]]) -> list[int]:
    """Exact minimum-cost assignment of every row to a distinct column
    (:func:`scipy.optimize.linear_sum_assignment`, checked and returned in the row order).

    Args:
        cost: ``n x m`` matrix with ``n <= m`` (list of lists or a 2-D tensor); finite entries.

    Returns:
        ``col[i]`` for each row ``i``, minimising ``sum_i cost[i][col[i]]``.

    Raises:
        ValueError: more rows than columns, a ragged matrix, or a NaN / infinite cost.
    """
    from scipy.optimize import linear_sum_assignment

    rows = [[float(v) for v in row] for row in (cost.tolist() if isinstance(cost, torch.Tensor) else cost)]
    n = len(rows)
    if n == 0:
        return []
    m = len(rows[0])
    if any(len(r) != m for r in rows) or n > m:
        lengths = sorted({len(r) for r in rows})
        raise ValueError(f"need an n x m cost matrix with n <= m, got {n} rows of lengths {lengths}")
    if not all(math.isfinite(v) for r in rows for v in r):
        raise InputError("the cost matrix holds NaN or infinite entries; an assignment needs finite costs")
    _, cols = linear_sum_assignment(rows)               # with n <= m every row is assigned, rows in order
    return [int(c) for c in cols]


def grid_distance(centers: torch.Tensor, kernel_size: int | None = None) -> dict:
    """Distance of a layer's head centers to the nearest ``K x K`` grid of shifts (Theorem 1).

    Args:
        centers: ``(N_h, 2)`` head centers (row, col shift in tokens).
        kernel_size: K (default ``floor(sqrt(N_h))``); needs ``K^2 <= N_h``.

    Returns:
        ``{"kernel_size": K, "distance": mean Euclidean distance (tokens) between the K^2 assigned
        heads and their shifts, "max_distance": the largest of them, "assignment": [[head, row
        shift, col shift], ...] (0-based heads, sorted by head)}``; heads left out of the optimal
        assignment are ignored. 0 exactly when the centers contain a ``K x K`` grid.

    Raises:
        InputError: wrong shape or ``K^2 > N_h``.
    """
    centers = torch.as_tensor(centers, dtype=torch.float64).detach().cpu()
    if centers.dim() != 2 or centers.shape[1] != 2 or centers.shape[0] == 0:
        raise InputError(f"centers must be (N_h, 2), got {tuple(centers.shape)}")
    nh = centers.shape[0]
    k = math.isqrt(nh) if kernel_size is None else kernel_size
    if k < 1 or k * k > nh:
        raise InputError(f"a {k}x{k} kernel needs {k * k} heads, the layer has {nh}")
    best = None
    for grid in kernel_grids(k):
        cost = torch.cdist(grid, centers)                   # (K^2, N_h): shifts x heads
        cols = optimal_assignment(cost)
        d = cost[torch.arange(len(cols)), torch.tensor(cols)]
        if best is None or float(d.sum()) < best[0] - 1e-12:
            best = (float(d.sum()), d, cols, grid)
    _, d, cols, grid = best
    pairs = sorted([int(h), *map(int, grid[i].tolist())] for i, h in enumerate(cols))
    return {"kernel_size": k, "distance": float(d.mean()), "max_distance": float(d.max()), "assignment": pairs}


# -- whole models -------------------------------------------------------------------------------

def _layer_report(index: int, layer, stats: dict[str, torch.Tensor], grid: tuple[int, int], *,
                  condition_number: float, min_eigenvalue: float) -> dict:
    # the normalisations of the locality measures (:mod:`.locality`): grid side and uniform entropy
    side, log_keys = grid_side(*grid), math.log(grid[0] * grid[1])
    nh = layer.num_heads
    heads = [{"head": h + 1, "distance": float(stats["distance"][h]),
              "normalized_distance": float(stats["distance"][h]) / side, "peak": float(stats["peak"][h]),
              "entropy": float(stats["entropy"][h]), "normalized_entropy": float(stats["entropy"][h]) / log_keys,
              "shift": [float(v) for v in stats["shift"][h]]}
             for h in range(nh)]
    report = {"layer": index + 1, "kind": layer.kind, "num_heads": nh,
              "distance": float(stats["distance"].mean()), "min_distance": float(stats["distance"].min()),
              "normalized_distance": float(stats["distance"].mean()) / side, "peak": float(stats["peak"].mean()),
              "entropy": float(stats["entropy"].mean()),
              "normalized_entropy": float(stats["entropy"].mean()) / log_keys,
              "local_heads": int((stats["distance"] <= LOCAL_HEAD_DISTANCE).sum())}
    centers = stats["shift"]
    if layer.has_gates:
        gates = _gates(layer)
        for head, gate in zip(heads, gates):
            head["gate"] = gate
        report["gate"] = sum(gates) / len(gates)
    if layer.has_centers:
        params = quadratic_head_parameters(layer)
        degenerate = degenerate_heads(layer, condition_number=condition_number, min_eigenvalue=min_eigenvalue)
        for h, head in enumerate(heads):
            head["center"] = [float(v) for v in params["center"][h]]
            if "alpha" in params:
                head["alpha"] = float(params["alpha"][h])
            else:
                head["inverse_covariance"] = params["inverse_covariance"][h].tolist()
            head["eigenvalues"] = [float(v) for v in params["eigenvalues"][h]]
            cond = float(params["condition_number"][h])
            head["condition_number"] = cond if math.isfinite(cond) else None
            head["degenerate"] = bool(degenerate[h])
        report["degenerate_heads"] = int(degenerate.sum())
        centers = params["center"]
        report["centers_from"] = "parameters"
    else:
        report["centers_from"] = "mean shift"
    report["grid"] = grid_distance(centers)
    report["grid_distance"] = report["grid"]["distance"]
    report["heads"] = heads
    return report


@torch.no_grad()
def model_metrics(model: nn.Module, images: torch.Tensor | None = None, *,
                  grid_size: tuple[int, int] | None = None, margin: int = 0, batch_size: int = 50,
                  condition_number: float = DEFAULT_CONDITION_NUMBER,
                  min_eigenvalue: float = DEFAULT_MIN_EIGENVALUE) -> dict:
    """Per-layer and per-head metrics of an image transformer, from real activations.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer`.
        images: normalised images ``(B, C, H, W)``; required when a layer depends on the input
            (statistics per image from the hooked real input, then averaged); optional for
            position-only models (the grid is then read off these images).
        grid_size: token grid for position-only models without images (default: 32x32 images).
        margin: see :func:`head_statistics`.
        batch_size: images per forward pass.
        condition_number, min_eigenvalue: degenerate-head thresholds (the reference code's by default).

    Returns:
        ``{"grid": [H, W], "side": sqrt(H*W), "margin": m, "images": B or 0, "min_distance": the most
        local head's ``{"distance", "normalized_distance", "layer", "head"}``, "layers": [...]}``; each
        layer report holds ``layer`` (1-based), ``kind``, ``num_heads``, the head means of the module
        docstring's statistics, ``min_distance``, ``local_heads``, ``grid_distance`` and ``grid``
        (:func:`grid_distance`; centers are the quadratic parameters, else each head's mean shift),
        ``degenerate_heads`` (quadratic) or the mean ``gate`` (GPSA), and
        ``heads``: one dict per head (1-based ``head``, the statistics of :func:`head_statistics`, and
        the quadratic parameters or the GPSA ``gate``).

    Raises:
        InputError: no attention blocks, an input-dependent model without images, or empty images.
    """
    layers, _ = measured_layers(model, images, "metrics need test images")
    if images is None:
        maps = position_maps(model, grid_size)
        stats = [head_statistics(m.probs, m.height, m.width, margin=margin) for m in maps]
        h, w = maps[0].height, maps[0].width
        count = 0
    else:
        sums: dict[int, dict[str, torch.Tensor]] = {}
        grids: dict[int, tuple[int, int]] = {}

        def callback(index: int, layer, x: torch.Tensor) -> None:
            hh, ww = x.shape[1], x.shape[2]
            grids[index] = (hh, ww)
            if layer.position_only:
                if index not in sums:
                    sums[index] = head_statistics(layer.grid_probs(hh, ww), hh, ww, margin=margin)
                return
            batch = x.shape[0]
            s = head_statistics(layer.forward(x, return_attention=True)[1], hh, ww, margin=margin)
            s = {k: v * batch for k, v in s.items()}        # weight by batch size; divided below
            sums[index] = s if index not in sums else {k: sums[index][k] + v for k, v in s.items()}

        run_recorded(model, images, callback, batch_size)
        count = int(images.shape[0])
        stats = [sums[i] if layer.position_only else {k: v / count for k, v in sums[i].items()}
                 for i, layer in enumerate(layers)]
        h, w = grids[0]
    reports = [_layer_report(i, layer, s, (h, w), condition_number=condition_number, min_eigenvalue=min_eigenvalue)
               for i, (layer, s) in enumerate(zip(layers, stats))]
    distance, at_layer, at_head = min((hd["distance"], rep["layer"], hd["head"])
                                      for rep in reports for hd in rep["heads"])
    most_local = {"distance": distance, "normalized_distance": distance / grid_side(h, w), "layer": at_layer,
                  "head": at_head}
    return {"grid": [h, w], "side": grid_side(h, w), "margin": margin, "images": count, "min_distance": most_local,
            "layers": reports}


def flatten_metrics(metrics: dict, prefix: str = "attn") -> dict[str, float]:
    """Flatten :func:`model_metrics` output to ``{"attn/layer1/head3/distance": 1.0, ...}`` floats.

    Per layer: ``distance``, ``peak``, ``entropy``, ``grid_distance``, (quadratic)
    ``degenerate_heads`` and (GPSA) ``gate``; per head: ``distance``, ``peak``, ``entropy``, for
    quadratic heads ``center_row``, ``center_col``, ``alpha`` (isotropic) or
    ``eigenvalue_min``/``eigenvalue_max`` and the symmetric Sigma^-1 itself, ``inverse_covariance_rr``,
    ``_rc``, ``_cc`` (full covariance: row-row, row-col, col-col entries, enough to redraw the head), and
    ``degenerate`` as 0.0/1.0, for GPSA heads ``gate``. Layer and head numbers are 1-based.
    """
    flat: dict[str, float] = {}
    for layer in metrics["layers"]:
        base = f"{prefix}/layer{layer['layer']}"
        for key in ("distance", "peak", "entropy", "grid_distance", "degenerate_heads", "gate"):
            if key in layer:
                flat[f"{base}/{key}"] = float(layer[key])
        for head in layer["heads"]:
            hb = f"{base}/head{head['head']}"
            for key in ("distance", "peak", "entropy", "alpha", "gate"):
                if key in head:
                    flat[f"{hb}/{key}"] = float(head[key])
            if "center" in head:
                flat[f"{hb}/center_row"], flat[f"{hb}/center_col"] = map(float, head["center"])
                flat[f"{hb}/degenerate"] = float(head["degenerate"])
            if "inverse_covariance" in head:
                flat[f"{hb}/eigenvalue_min"], flat[f"{hb}/eigenvalue_max"] = map(float, head["eigenvalues"])
                (rr, rc), (_, cc) = head["inverse_covariance"]
                for name, value in (("rr", rr), ("rc", rc), ("cc", cc)):
                    flat[f"{hb}/inverse_covariance_{name}"] = float(value)
    return flat


def epoch_metrics(model: nn.Module, grid_size: tuple[int, int] | None = None) -> dict[str, float]:
    """Cheap per-epoch attention metrics for the training log (metrics.jsonl and TensorBoard).

    Position-only models: one softmax per layer, no forward pass. Models with GPSA layers give only
    the gates (``attn/layerL/gate`` and ``attn/layerL/headH/gate``). Any other model gives ``{}``. It
    does not touch the model's mode, gradients or random state.

    Args:
        model: the network being trained (any device).
        grid_size: token grid ``(H, W)``; default that of 32x32 images (``32 // pooling``).

    Returns:
        :func:`flatten_metrics` of :func:`model_metrics` (all queries, margin 0), e.g.
        ``{"attn/layer1/head3/distance": 1.02, "attn/layer1/grid_distance": 0.31, ...}``.
    """
    try:
        layers = attention_layers(model)
    except ValueError:
        return {}
    if not all(layer.position_only for layer in layers):
        gated = [{"layer": i + 1, "heads": [{"head": h + 1, "gate": g} for h, g in enumerate(_gates(layer))]}
                 for i, layer in enumerate(layers) if layer.has_gates]
        for report in gated:
            report["gate"] = sum(h["gate"] for h in report["heads"]) / len(report["heads"])
        return flatten_metrics({"layers": gated})
    return flatten_metrics(model_metrics(model, grid_size=grid_size or default_grid_size(model)))


def _gates(layer: GatedPositionalAttention) -> list[float]:
    """The per-head gates ``sigmoid(lambda_h)`` of a GPSA layer, as floats."""
    with torch.no_grad():
        return [float(g) for g in layer.gates().detach().double().cpu()]
