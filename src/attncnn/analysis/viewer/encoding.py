"""How the viewer stores attention maps: uint8 quantisation, packed arrays, page-safe text.

Encoding (version 1). Each *set* of maps (one test image, the batch average, or the single set of
a position-only model) is one binary blob: little-endian arrays, each 4-byte aligned
(:class:`Blob`), compressed with zlib and written as base85 text (:func:`blob_text`; RFC 1924
alphabet with ``.`` in place of ``<``, so the text cannot end its ``<script>`` element). The JSON
manifest says where each array lies and how each map kind of each layer is encoded; every encoded
row is one query's values over the ``H*W`` keys (row-major):

``affine8``
    uint8 ``q (N_h, N, N)`` with per-row float32 ``lo (N_h, N)`` and ``step (N_h, N)``:
    ``value = lo + q * step``, ``step = (max - min) / 255`` of the row, so the error is at most
    ``step / 2``. Used for scores.
``scaled8``
    uint8 ``q`` with per-row float32 ``scale = max / 255``: ``value = q * scale``, error at most
    ``scale / 2``. Used for probabilities.
``separable8``
    uint8 ``q (N_h, N, H+W)`` with per-row float32 ``lo`` and ``step``:
    ``value[(k, l)] = lo + step * (q[k] + q[H + l])`` (the learned q.r term is a row term plus a
    column term); shared step ``max(range(row), range(col)) / 255``, error at most ``step``. Used
    only when the decomposition reproduces the full map to 1e-4 of its scale.

With ``delta`` (affine8 and scaled8), ``q`` is stored as differences along the keys modulo 256
(the page takes the running sum), which deflate compresses better. The page (``decode.js``) reads
these encodings back.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

__all__ = ["ENCODING_VERSION", "quantize_affine", "quantize_scaled", "quantize_separable", "separate_axes", "Blob",
           "encode_affine", "encode_scaled", "encode_positional", "blob_text", "blob_bytes"]

#: Version of the data layout described in the module docstring (the page checks it).
ENCODING_VERSION = 1

# b85encode's alphabet has no "/" or "."; swapping "<" for "." leaves no "<" at all in the text.
_TO_PAGE = bytes.maketrans(b"<", b".")
_FROM_PAGE = bytes.maketrans(b".", b"<")


def quantize_affine(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row affine uint8 quantisation over the last axis.

    Args:
        values: float array ``(..., K)``.

    Returns:
        ``(q (..., K) uint8, lo (...) float32, step (...) float32)`` with
        ``|lo + q * step - values| <= step / 2`` (up to float32 rounding of ``lo``); a constant row
        gets ``step = 0`` and ``q = 0``.
    """
    values = np.asarray(values, dtype=np.float64)
    lo = values.min(-1).astype(np.float32)
    step = ((values.max(-1) - lo) / 255).astype(np.float32)
    safe = np.where(step > 0, step, 1).astype(np.float64)
    q = np.rint((values - lo[..., None]) / safe[..., None]).clip(0, 255).astype(np.uint8)
    return q, lo, step


def quantize_scaled(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row uint8 quantisation of non-negative values (probabilities) over the last axis.

    Returns:
        ``(q (..., K) uint8, scale (...) float32)`` with ``|q * scale - values| <= scale / 2``,
        ``scale = max(row) / 255`` (a row of zeros gets scale 0).
    """
    values = np.asarray(values, dtype=np.float64)
    scale = (values.max(-1) / 255).astype(np.float32)
    safe = np.where(scale > 0, scale, 1).astype(np.float64)
    q = np.rint(values / safe[..., None]).clip(0, 255).astype(np.uint8)
    return q, scale


def quantize_separable(row: np.ndarray, col: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 quantisation of separable maps ``value[k*W + l] = row[k] + col[l]``, per row of maps.

    Args:
        row: ``(..., H)``; col: ``(..., W)``.

    Returns:
        ``(q (..., H+W) uint8, lo (...) float32, step (...) float32)`` with
        ``value[k*W + l] ~= lo + step * (q[k] + q[H + l])``; both parts share one step
        ``max(range(row), range(col)) / 255``, so the error is at most ``step`` (two roundings).
    """
    row = np.asarray(row, dtype=np.float64)
    col = np.asarray(col, dtype=np.float64)
    row_lo, col_lo = row.min(-1), col.min(-1)
    step = (np.maximum(row.max(-1) - row_lo, col.max(-1) - col_lo) / 255).astype(np.float32)
    safe = np.where(step > 0, step, 1).astype(np.float64)[..., None]
    q = np.concatenate([np.rint((row - row_lo[..., None]) / safe), np.rint((col - col_lo[..., None]) / safe)], -1)
    return q.clip(0, 255).astype(np.uint8), (row_lo + col_lo).astype(np.float32), step


def separate_axes(values: np.ndarray, height: int, width: int, *, rtol: float = 1e-4
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """Split maps over an ``H x W`` key grid into a row term plus a column term, if they are one.

    Args:
        values: ``(..., H*W)`` with keys row-major.

    Returns:
        ``(row (..., H), col (..., W))`` with ``values[..., k*W + l] ~= row[..., k] + col[..., l]``
        to ``rtol`` times the largest magnitude, or None when the maps are not separable.
    """
    values = np.asarray(values, dtype=np.float64)
    grid = values.reshape(*values.shape[:-1], height, width)
    row = grid[..., :, 0]
    col = grid[..., 0, :] - grid[..., :1, 0]
    error = np.abs(row[..., :, None] + col[..., None, :] - grid).max(initial=0.0)
    if error > rtol * max(1.0, float(np.abs(values).max(initial=0.0))):
        return None
    return row, col


class Blob:
    """Little-endian arrays packed back to back, each at a 4-byte aligned offset.

    Attributes:
        arrays: the index ``{name: {"dtype", "shape", "offset"}}`` the manifest carries.
        size: bytes so far.
    """

    _DTYPES = {np.dtype(np.uint8): "uint8", np.dtype("<f4"): "float32"}

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.size = 0
        self.arrays: dict[str, dict] = {}

    def add(self, name: str, array: np.ndarray) -> str:
        """Append ``array`` (uint8 or float32) under ``name``; returns ``name``.

        Raises:
            TypeError: any other dtype.
        """
        array = np.ascontiguousarray(array)
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        if array.dtype not in self._DTYPES:
            raise TypeError(f"viewer arrays are uint8 or float32, got {array.dtype} for {name}")
        pad = -self.size % 4
        if pad:
            self._parts.append(b"\0" * pad)
            self.size += pad
        self.arrays[name] = {"dtype": self._DTYPES[array.dtype], "shape": list(array.shape), "offset": self.size}
        data = array.tobytes()
        self._parts.append(data)
        self.size += len(data)
        return name

    def payload(self) -> bytes:
        """The packed (uncompressed) bytes."""
        return b"".join(self._parts)


def _delta(q: np.ndarray) -> np.ndarray:
    """Differences along the last axis modulo 256 (first entry kept): the page's running sum inverts it."""
    out = q.copy()
    out[..., 1:] = np.diff(q, axis=-1)          # uint8 arithmetic wraps modulo 256
    return out


def encode_affine(blob: Blob, name: str, values: np.ndarray, delta: bool) -> dict:
    """Add ``values (..., K)`` to ``blob`` as ``affine8``; returns the manifest entry."""
    q, lo, step = quantize_affine(values)
    return {"enc": "affine8", "delta": delta, "q": blob.add(f"{name}.q", _delta(q) if delta else q),
            "lo": blob.add(f"{name}.lo", lo), "step": blob.add(f"{name}.step", step)}


def encode_scaled(blob: Blob, name: str, values: np.ndarray, delta: bool) -> dict:
    """Add non-negative ``values (..., K)`` to ``blob`` as ``scaled8``; returns the manifest entry."""
    q, scale = quantize_scaled(values)
    return {"enc": "scaled8", "delta": delta, "q": blob.add(f"{name}.q", _delta(q) if delta else q),
            "scale": blob.add(f"{name}.scale", scale)}


def encode_positional(blob: Blob, name: str, values: np.ndarray, height: int, width: int, delta: bool) -> dict:
    """Add maps ``(..., H*W)`` as ``separable8`` when :func:`separate_axes` splits them, else ``affine8``."""
    parts = separate_axes(values, height, width)
    if parts is None:
        return encode_affine(blob, name, values, delta)
    q, lo, step = quantize_separable(*parts)
    return {"enc": "separable8", "q": blob.add(f"{name}.q", q), "lo": blob.add(f"{name}.lo", lo),
            "step": blob.add(f"{name}.step", step)}


def blob_text(payload: bytes, level: int = 9) -> tuple[str, int]:
    """``payload`` compressed with zlib at ``level`` and written as page-safe base85 text.

    Returns:
        ``(text, compressed size in bytes)``; the text holds no ``<``.
    """
    packed = zlib.compress(payload, level)
    return base64.b85encode(packed).translate(_TO_PAGE).decode("ascii"), len(packed)


def blob_bytes(text: str) -> bytes:
    """The payload of a :func:`blob_text` text.

    Raises:
        ValueError, zlib.error: damaged text.
    """
    return zlib.decompress(base64.b85decode(text.encode("ascii").translate(_FROM_PAGE)))
