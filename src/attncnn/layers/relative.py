"""Relative positions on an (H, W) token grid, built at call time and cached.

Convention (the paper's): the relative shift of a (query, key) pair is ``delta = key - query``,
in token units, with component 0 along the height (rows) and component 1 along the width
(columns). Tokens are flattened row-major, so position ``n`` is ``(n // W, n % W)``.
Nothing here has a maximum grid size; results are cached per (H, W, device, dtype).
"""

from __future__ import annotations

import functools

import torch

from ..errors import InputError

__all__ = ["grid_positions", "relative_offsets", "distinct_offsets", "quadratic_features", "axis_offsets",
           "table_rows", "table_span"]


def _cached(fn):
    """lru_cache that always builds normal tensors, even when first called under
    ``torch.inference_mode()`` (an inference tensor in the cache would break autograd later)."""
    cached = functools.lru_cache(maxsize=64)(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            # torch.compile traces the builder itself into the graph as constants (Dynamo skips an
            # lru_cache, with a warning); the cache is for eager calls
            return fn(*args, **kwargs)
        with torch.inference_mode(False), torch.no_grad():
            return cached(*args, **kwargs)

    wrapper.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return wrapper


def _check(height: int, width: int) -> None:
    if height < 1 or width < 1:
        raise InputError(f"grid size must be positive, got {height}x{width}")


@_cached
def grid_positions(height: int, width: int, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Row-major (row, column) coordinates of every token: ``(H*W, 2)``."""
    _check(height, width)
    rows = torch.arange(height, device=device, dtype=dtype)
    cols = torch.arange(width, device=device, dtype=dtype)
    return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)


@_cached
def relative_offsets(height: int, width: int, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Relative shifts ``delta = key - query`` of all token pairs: ``(H*W, H*W, 2)``.

    ``out[q, k] = position(k) - position(q)`` with positions from :func:`grid_positions`.
    """
    pos = grid_positions(height, width, device, dtype)
    return pos[None, :, :] - pos[:, None, :]


@_cached
def quadratic_features(height: int, width: int, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32, generalized: bool = False) -> torch.Tensor:
    """The quadratic relative encoding r_delta of every pair.

    Isotropic (paper eq. 9): ``r = (|delta|^2, delta_1, delta_2)``, shape ``(H*W, H*W, 3)``.
    Generalised (the paper's appendix): ``r = (delta_1, delta_2, delta_1^2, delta_2^2, delta_1*delta_2)``,
    shape ``(H*W, H*W, 5)``. The layers compute their scores from :func:`relative_offsets` instead
    (a squared distance is better conditioned than this dot-product form).
    """
    d = relative_offsets(height, width, device, dtype)
    d1, d2 = d[..., 0], d[..., 1]
    if generalized:
        return torch.stack([d1, d2, d1 * d1, d2 * d2, d1 * d2], dim=-1)
    return torch.stack([d1 * d1 + d2 * d2, d1, d2], dim=-1)


@_cached
def axis_offsets(length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Shifts along one axis, ``out[i, k] = k - i``: ``(length, length)`` int64 (shift ``d`` indexes
    row ``d + max_size - 1`` of a learned per-axis table)."""
    if length < 1:
        raise InputError(f"axis length must be positive, got {length}")
    idx = torch.arange(length, device=device)
    return idx[None, :] - idx[:, None]


@_cached
def distinct_offsets(height: int, width: int, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``S = (2H-1)(2W-1)`` distinct shifts of an ``H x W`` grid, and which one each pair has (a
    score of the shift alone is computed ``S`` times, then gathered).

    Returns:
        ``(shifts, index)``: ``shifts (S, 2)`` row-major from ``(-(H-1), -(W-1))`` to ``(H-1, W-1)``,
        and ``index (H*W, H*W)`` int64 with ``shifts[index[q, k]] == relative_offsets(...)[q, k]``.
    """
    _check(height, width)
    rows = torch.arange(1 - height, height, device=device, dtype=dtype)
    cols = torch.arange(1 - width, width, device=device, dtype=dtype)
    shifts = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)
    row_shift = axis_offsets(height, device) + (height - 1)                  # (H, H): k - i + H - 1
    col_shift = axis_offsets(width, device) + (width - 1)                    # (W, W): l - j + W - 1
    index = row_shift[:, None, :, None] * (2 * width - 1) + col_shift[None, :, None, :]   # (H, W, H, W)
    return shifts, index.reshape(height * width, height * width)


def _check_table(length: int, max_size: int, axis: str) -> None:
    if length > max_size:
        raise InputError(
            f"grid {axis} {length} exceeds the learned table's max_size {max_size}: "
            f"build the layer with max_size >= {length}")


def table_rows(table: torch.nn.Embedding, length: int, max_size: int, axis: str) -> torch.Tensor:
    """Rows of a learned per-axis table for every (query, key) shift along one axis: ``(L, L, E)``,
    ``out[i, k] = table[k - i + max_size - 1]`` (differentiable gather, not cached).

    Raises:
        InputError: ``length > max_size`` (the message names the ``axis`` and the fix).
    """
    _check_table(length, max_size, axis)
    index = axis_offsets(length, table.weight.device) + (max_size - 1)   # (L, L)
    return table.weight[index]


def table_span(table: torch.nn.Embedding, length: int, max_size: int, axis: str) -> torch.Tensor:
    """The rows of a learned per-axis table that an axis of ``length`` tokens uses, one per shift
    from ``-(L-1)`` to ``L-1``: ``(2L-1, E)``, ``out[d + L - 1] = table[d + max_size - 1]`` (a
    differentiable slice). ``axis_offsets(L) + L - 1`` indexes it like :func:`table_rows`.

    Raises:
        InputError: ``length > max_size`` (the message names the ``axis`` and the fix).
    """
    _check_table(length, max_size, axis)
    return table.weight[max_size - length:max_size + length - 1]
