"""The paper's interactive website (PAPER.md 6) as one self-contained, offline HTML file.

:func:`write_viewer` exports the attention of one or more runs, for a few test images and the
average over a batch of test images, into a single HTML file (page template
``viewer_page.html`` beside this module, all JS and CSS inline, no network). Maps come from each
layer's real input through forward hooks (:func:`~attncnn.analysis.maps.run_recorded` and
:func:`~attncnn.analysis.maps.layer_values`, as in :func:`~attncnn.analysis.maps.attention_maps`);
quadratic runs also carry each head's centre Delta and covariance
(:func:`~attncnn.analysis.metrics.quadratic_head_parameters`).

Encoding (version 1). Each *set* of maps (one test image, the batch average, or the single set of
a position-only model) is one binary blob: little-endian arrays, each 4-byte aligned, compressed
with zlib (``DecompressionStream("deflate")`` in the page) and written as base85 text into a
``<script type="application/octet-stream">`` element (RFC 1924 alphabet, :func:`base64.b85encode`,
with ``.`` in place of ``<`` so the text can neither end nor escape the element; 25 % larger than
the bytes, against 33 % for base64). The JSON manifest says where each array lies and how each
map kind of each layer is encoded; every encoded row is one query's values over the ``H*W`` keys
(row-major):

``affine8``
    uint8 ``q (N_h, N, N)`` with per-row float32 ``lo (N_h, N)`` and ``step (N_h, N)``:
    ``value = lo + q * step``, ``step = (max - min) / 255`` of the row, so the error is at most
    ``step / 2``. Used for scores.
``scaled8``
    uint8 ``q`` with per-row float32 ``scale = max / 255``: ``value = q * scale``, error at most
    ``scale / 2``. Used for probabilities.
``separable8``
    uint8 ``q (N_h, N, H+W)`` with per-row float32 ``lo`` and ``step``:
    ``value[(k, l)] = lo + step * (q[k] + q[H + l])``. The learned relative q.r term is a row term
    plus a column term (PAPER.md 3.3), so ``H + W`` numbers give all ``H * W`` keys; the two parts
    share the step ``max(range(row), range(col)) / 255`` and the error is at most ``step``. Used
    only when a measured decomposition reproduces the full map to 1e-4 of its scale.

With ``delta`` (affine8 and scaled8), ``q`` is stored as differences along the keys modulo 256 (the
page takes the running sum): neighbouring keys are alike, so deflate compresses the differences
better (8 % smaller for the paper-size content model with random weights).

What each set holds: position-only models: ``probs`` (scaled8) and ``scores`` (affine8), once.
Content models, per test image: ``content`` (q.k/sqrt(D_h), affine8) and, with learned relative
encodings, ``positional`` (q.r/sqrt(D_h), separable8); the page recomputes the probabilities as
``softmax(content + positional)`` over the keys, exactly as the layer does, so a score error of at
most ``e`` per key bounds the probability error by ``p * (exp(2 e) - 1)``. The batch average also
stores the averaged ``probs`` (scaled8), because an average of softmaxes is not the softmax of
averaged scores. :func:`page_maps` is the page's computation in numpy.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .._io import atomic_path
from .maps import LayerMaps, attention_layers, layer_values, run_recorded
from .metrics import degenerate_heads, quadratic_head_parameters
from .runs import Run, open_run, test_images

__all__ = ["ENCODING_VERSION", "PAGE_TEMPLATE", "DISPLAY_KINDS", "RunExport", "ViewerData", "quantize_affine",
           "quantize_scaled", "quantize_separable", "separate_axes", "export_model", "export_run", "build_html",
           "write_viewer", "read_viewer", "page_maps"]

log = logging.getLogger(__name__)

#: Version of the data layout described in the module docstring (the page checks it).
ENCODING_VERSION = 1
#: The page template, package data beside this module.
PAGE_TEMPLATE = "viewer_page.html"
#: Value choices of the page: all score terms, the positional term only, the content term only.
DISPLAY_KINDS = ("all", "positional", "content")

_MANIFEST_MARK = "__ATTNCNN_MANIFEST__"
_BLOBS_MARK = "<!--__ATTNCNN_BLOBS__-->"
_TITLE_MARK = "__ATTNCNN_TITLE__"
# b85encode's alphabet has no "/" or "."; swapping "<" for "." leaves no "<" at all in the text.
_TO_PAGE = bytes.maketrans(b"<", b".")
_FROM_PAGE = bytes.maketrans(b".", b"<")
_BLOB_RE = re.compile(r'<script type="application/octet-stream" id="attncnn-blob-(\d+)">([^<]*)</script>')
_MANIFEST_RE = re.compile(r'<script type="application/json" id="attncnn-manifest">([^<]*)</script>')
#: Pages above this many bytes get a logged warning.
_LARGE_PAGE = 100_000_000
# Half the squared Mahalanobis radius of a 2-D Gaussian's p-mass ellipse is -ln(1 - p).
_MASSES = (0.5, 0.9)


# -- encodings ------------------------------------------------------------------------------------

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


class _Blob:
    """Little-endian arrays packed back to back, each at a 4-byte aligned offset."""

    _DTYPES = {np.dtype(np.uint8): "uint8", np.dtype("<f4"): "float32"}

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.arrays: dict[str, dict] = {}

    def add(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        if array.dtype not in self._DTYPES:
            raise TypeError(f"viewer arrays are uint8 or float32, got {array.dtype} for {name}")
        pad = -self.size % 4
        if pad:
            self.parts.append(b"\0" * pad)
            self.size += pad
        self.arrays[name] = {"dtype": self._DTYPES[array.dtype], "shape": list(array.shape), "offset": self.size}
        data = array.tobytes()
        self.parts.append(data)
        self.size += len(data)
        return name

    def payload(self) -> bytes:
        return b"".join(self.parts)


def _delta(q: np.ndarray) -> np.ndarray:
    """Differences along the last axis modulo 256 (first entry kept): the page's running sum inverts it."""
    out = q.copy()
    out[..., 1:] = np.diff(q, axis=-1)          # uint8 arithmetic wraps modulo 256
    return out


def _encode_affine(blob: _Blob, name: str, values: np.ndarray, delta: bool) -> dict:
    q, lo, step = quantize_affine(values)
    return {"enc": "affine8", "delta": delta, "q": blob.add(f"{name}.q", _delta(q) if delta else q),
            "lo": blob.add(f"{name}.lo", lo), "step": blob.add(f"{name}.step", step)}


def _encode_scaled(blob: _Blob, name: str, values: np.ndarray, delta: bool) -> dict:
    q, scale = quantize_scaled(values)
    return {"enc": "scaled8", "delta": delta, "q": blob.add(f"{name}.q", _delta(q) if delta else q),
            "scale": blob.add(f"{name}.scale", scale)}


def _encode_positional(blob: _Blob, name: str, values: np.ndarray, height: int, width: int, delta: bool) -> dict:
    parts = separate_axes(values, height, width)
    if parts is None:
        return _encode_affine(blob, name, values, delta)
    q, lo, step = quantize_separable(*parts)
    return {"enc": "separable8", "q": blob.add(f"{name}.q", q), "lo": blob.add(f"{name}.lo", lo),
            "step": blob.add(f"{name}.step", step)}


# -- export ---------------------------------------------------------------------------------------

@dataclass
class RunExport:
    """One run ready for the page.

    Attributes:
        manifest: JSON-ready description (run facts, images, per set the encoding of each map
            kind; blob indices are local to this run until :func:`build_html` renumbers them).
        blobs: per set, in the order of ``manifest["sets"]``: the raw (uncompressed) payload and
            its array index ``{name: {"dtype", "shape", "offset"}}``.
    """

    manifest: dict
    blobs: list[tuple[bytes, dict]] = field(default_factory=list)


def _layer_kinds(layers) -> dict[str, bool]:
    position_only = all(layer.position_only for layer in layers)
    if not position_only and any(layer.position_only for layer in layers):
        raise ValueError("the viewer needs all layers position-only or all content-based; this model mixes them")
    positional = position_only or all(hasattr(layer, "positional_scores") for layer in layers)
    return {"all": True, "positional": positional, "content": not position_only}


def _pixels(raw: torch.Tensor) -> str:
    """``(C, H, W)`` uint8 -> base64 of ``H x W x 3`` RGB bytes (grey images repeated)."""
    img = raw.detach().cpu().to(torch.uint8)
    if img.shape[0] == 1:
        img = img.expand(3, -1, -1)
    return base64.b64encode(img[:3].permute(1, 2, 0).contiguous().numpy().tobytes()).decode("ascii")


def _predictions(model: nn.Module, images: torch.Tensor, classes) -> list[dict]:
    with torch.no_grad():
        probs = torch.softmax(model(images).float(), dim=-1)
    top = probs.max(dim=-1)
    out = []
    for p, i in zip(top.values.tolist(), top.indices.tolist()):
        name = classes[i] if classes is not None and i < len(classes) else str(i)
        out.append({"class": name, "p": round(p, 4)})
    return out


def _ellipse(inverse_covariance: np.ndarray, mass: float) -> list[float] | None:
    """Semi-axes ``(r_col, r_row)`` in tokens and rotation (radians, from the column axis toward the
    row axis) of the ``mass`` ellipse ``d^T Sigma^-1 d = -2 ln(1 - mass)``; None if unbounded."""
    eigenvalues, vectors = np.linalg.eigh(inverse_covariance)
    if eigenvalues.min() <= 1e-9:
        return None
    radius2 = -2 * math.log(1 - mass)
    radii = np.sqrt(radius2 / eigenvalues)
    v = vectors[:, 0]                                    # (row, col) of the first axis
    return [float(radii[0]), float(radii[1]), float(math.atan2(v[0], v[1]))]


def _centres(layers) -> list[list[dict]] | None:
    """Per layer, per head: centre Delta (row, col), Sigma^-1, mass ellipses, degenerate flag."""
    if not all(hasattr(layer, "centers") and hasattr(layer, "inverse_covariance") for layer in layers):
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
                          "ellipses": {str(int(m * 100)): _ellipse(inv, m) for m in _MASSES},
                          "degenerate": bool(degenerate[h])})
        out.append(heads)
    return out


def _grid(maps) -> tuple[int, int]:
    grids = {(m.height, m.width) for m in maps}
    if len(grids) != 1:
        raise ValueError(f"the layers see different token grids {sorted(grids)}; the viewer needs one grid")
    return grids.pop()


def _as_numpy(maps, index: int) -> list[np.ndarray]:
    """Per layer ``(N_h, N, N)`` float64 of batch entry ``index`` (0 for batch-1 maps)."""
    return [m.values[min(index, m.values.shape[0] - 1)].double().numpy() for m in maps]


@torch.no_grad()
def _collect(model: nn.Module, images: torch.Tensor, kinds: Sequence[str], *, average: bool,
             batch_size: int) -> dict[str, list[LayerMaps]]:
    """:func:`~attncnn.analysis.maps.attention_maps` for several kinds in one pass over the images.

    The viewer needs two or three kinds of the same images; the forward passes dominate the
    export time of the paper-size content model, so every kind is taken from each layer's real
    input in the same pass (:func:`~attncnn.analysis.maps.layer_values`, as ``attention_maps`` does;
    the tests check the two agree).

    Returns:
        ``{kind: [LayerMaps per block]}`` with values ``(B, N_h, N, N)``, or batch 1 when averaged.
    """
    layers = attention_layers(model)
    sums: dict[tuple[str, int], torch.Tensor] = {}
    kept: dict[tuple[str, int], list[torch.Tensor]] = {}
    grids: dict[int, tuple[int, int]] = {}

    def callback(index: int, layer, x: torch.Tensor) -> None:
        grids[index] = (x.shape[1], x.shape[2])
        for kind in kinds:
            values = layer_values(layer, x, kind).float().cpu()
            key = (kind, index)
            if average:
                total = values.sum(0, keepdim=True) if not layer.position_only else values * x.shape[0]
                sums[key] = total if key not in sums else sums[key] + total
            else:
                kept.setdefault(key, []).append(values.expand(x.shape[0], -1, -1, -1) if layer.position_only
                                                else values)

    run_recorded(model, images, callback, batch_size)
    n = images.shape[0]
    out = {}
    for kind in kinds:
        out[kind] = [LayerMaps(i, sums[(kind, i)] / n if average else torch.cat(kept[(kind, i)]),
                               *grids[i], layer.position_only) for i, layer in enumerate(layers)]
    return out


def _content_set(blob: _Blob, content, positional, probs, grid, delta: bool) -> dict:
    h, w = grid
    maps: dict[str, list[dict]] = {"content": [_encode_affine(blob, f"content.{i}", v, delta)
                                               for i, v in enumerate(content)]}
    if positional is not None:
        maps["positional"] = [_encode_positional(blob, f"positional.{i}", v, h, w, delta)
                              for i, v in enumerate(positional)]
    if probs is not None:
        maps["probs"] = [_encode_scaled(blob, f"probs.{i}", v, delta) for i, v in enumerate(probs)]
    return maps


def export_model(model: nn.Module, images: torch.Tensor, raw: torch.Tensor, *, labels: Sequence[str],
                 average_images: torch.Tensor | None = None, average_raw: torch.Tensor | None = None,
                 classes: Sequence[str] | None = None, batch_size: int = 50, delta: bool = True) -> RunExport:
    """Export an image transformer's attention maps for some images and, optionally, an average.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer` (CPU; eval mode during the call).
        images: normalised images ``(B, C, H_img, W_img)`` shown one by one.
        raw: the same images as uint8 ``(B, C, H_img, W_img)`` (drawn under the token grid).
        labels: one label per image (e.g. ``"2"`` for test image 2).
        average_images, average_raw: a batch ``(N, C, H_img, W_img)`` whose maps are averaged
            (paper Fig. 6: 100 test images); None for no average. Ignored for position-only
            models, whose maps do not depend on the image.
        classes: class names for the predicted labels shown in the page.
        batch_size: images per forward pass.
        delta: store the uint8 rows as differences along the keys (smaller files).

    Returns:
        A :class:`RunExport`; its manifest has the maps' facts, :func:`export_run` adds the run's.

    Raises:
        ValueError: no attention blocks (ResNet), layers that mix position-only and content
            attention, layers on different token grids, or ``images``, ``raw`` and ``labels``
            (or the two average batches) of different lengths.
    """
    if not images.shape[0] == raw.shape[0] == len(labels):
        raise ValueError(f"give one label and one raw image per image: {images.shape[0]} images, "
                         f"{raw.shape[0]} raw images, {len(labels)} labels")
    if (average_images is None) != (average_raw is None) or (
            average_images is not None and average_images.shape[0] != average_raw.shape[0]):
        raise ValueError("average_images and average_raw must be given together, with the same number of images")
    layers = attention_layers(model)
    kinds = _layer_kinds(layers)
    position_only = not kinds["content"]
    score_kinds = ["content", "positional"] if kinds["positional"] else ["content"]
    sets, blobs = [], []
    if position_only:
        # One set for every image: the maps do not depend on the input, whose grid is all that counts.
        maps = _collect(model, images[:1], ["probs", "scores"], average=False, batch_size=batch_size)
        grid = _grid(maps["probs"])
        blob = _Blob()
        encoded = {"probs": [_encode_scaled(blob, f"probs.{i}", v, delta)
                             for i, v in enumerate(_as_numpy(maps["probs"], 0))],
                   "scores": [_encode_affine(blob, f"scores.{i}", v, delta)
                              for i, v in enumerate(_as_numpy(maps["scores"], 0))]}
        sets.append({"blob": 0, "maps": encoded, "label": "position"})
        blobs.append((blob.payload(), blob.arrays))
        set_of_image = [0] * images.shape[0]
    else:
        maps = _collect(model, images, score_kinds, average=False, batch_size=batch_size)
        grid = _grid(maps["content"])
        set_of_image = []
        for b in range(images.shape[0]):
            blob = _Blob()
            encoded = _content_set(blob, _as_numpy(maps["content"], b),
                                   _as_numpy(maps["positional"], b) if kinds["positional"] else None, None, grid, delta)
            set_of_image.append(len(sets))
            sets.append({"blob": len(blobs), "maps": encoded, "label": str(labels[b])})
            blobs.append((blob.payload(), blob.arrays))
    entries = [{"key": str(label), "label": f"test image {label}", "set": set_of_image[b],
                "size": list(raw.shape[-2:]), "pixels": _pixels(raw[b])}
               for b, label in enumerate(labels)]
    for entry, pred in zip(entries, _predictions(model, images, classes)):
        entry["prediction"] = pred
    average = 0
    if average_images is not None and average_images.shape[0] and not position_only:
        average = int(average_images.shape[0])
        maps = _collect(model, average_images, ["probs", *score_kinds], average=True, batch_size=batch_size)
        blob = _Blob()
        encoded = _content_set(blob, _as_numpy(maps["content"], 0),
                               _as_numpy(maps["positional"], 0) if kinds["positional"] else None,
                               _as_numpy(maps["probs"], 0), grid, delta)
        sets.append({"blob": len(blobs), "maps": encoded, "label": "average"})
        blobs.append((blob.payload(), blob.arrays))
        mean_raw = average_raw.float().mean(0).round().to(torch.uint8)
        entries.append({"key": "average", "label": f"average of {average} test images", "set": len(sets) - 1,
                        "size": list(average_raw.shape[-2:]), "pixels": _pixels(mean_raw)})
    manifest = {"layers": len(layers), "heads": [layer.num_heads for layer in layers], "grid": list(grid),
                "position_only": position_only, "kinds": kinds, "images": entries, "sets": sets,
                "average": average, "centres": _centres(layers)}
    return RunExport(manifest, blobs)


def _accuracy(run: Run) -> dict | None:
    records = [r for r in run.metrics if isinstance(r.get("test_accuracy"), (int, float))]
    if not records:
        return None
    last = records[-1]
    best = max(records, key=lambda r: r["test_accuracy"])
    return {"last": last["test_accuracy"], "last_epoch": last.get("epoch"), "best": best["test_accuracy"],
            "best_epoch": best.get("epoch")}


def _split_message(message: str, indices: Sequence[int], average: int) -> str:
    """A short message for images beyond the test split (test_images lists every bad index)."""
    found = re.search(r"exceed the (\d+) test images of (.+)$", message)
    if found is None:
        return f"{message}; choose --images and --average within the test split (indices count from 0)"
    count, source = int(found.group(1)), found.group(2)
    bad = [i for i in indices if i >= count]
    if bad:
        return (f"--images {','.join(map(str, bad))}: beyond the {count} test images of {source}; "
                f"choose indices from 0 to {count - 1}")
    return f"--average {average} exceeds the {count} test images of {source}; choose --average {count} or fewer"


def export_run(run: Run | str | os.PathLike, indices: Sequence[int], *, data: str | None = None,
               data_dir: str | None = None, average: int = 100, batch_size: int = 50,
               delta: bool = True) -> RunExport:
    """Export a run (folder or checkpoint) for the viewer: test images ``indices`` and the average
    over the first ``average`` test images (content models; 0 for none).

    Raises:
        FileNotFoundError: no run at the path.
        ValueError: a ResNet run (no attention), an image index or ``average`` beyond the test split
            (the message gives the split's size), ``average < 0``, no indices.
        attncnn.data.DataError: the run's data set cannot be found (pass ``data``).
    """
    if not isinstance(run, Run):
        run = open_run(run)
    indices = list(dict.fromkeys(indices))           # "2,2" shows image 2 once
    if not indices:
        raise ValueError("give at least one test image index (e.g. --images 2,3,19,56)")
    if average < 0:
        raise ValueError(f"--average must be >= 0 test images, got {average}")
    try:
        layers = attention_layers(run.model)
    except ValueError as err:
        raise ValueError(f"{run.path}: {err}; pass runs of the quadratic, learned or content presets") from None
    needs_average = average > 0 and not all(layer.position_only for layer in layers)
    wanted = list(indices) + (list(range(average)) if needs_average else [])
    try:
        normalised, raw = test_images(run, wanted, data=data, data_dir=data_dir)
    except ValueError as err:
        raise ValueError(_split_message(str(err), indices, average if needs_average else 0)) from None
    k = len(indices)
    log.info("viewer: %s: %d image(s)%s", run.name, k, f" + average of {average}" if needs_average else "")
    export = export_model(run.model, normalised[:k], raw[:k], labels=[str(i) for i in indices],
                          average_images=normalised[k:] if needs_average else None,
                          average_raw=raw[k:] if needs_average else None,
                          classes=run.metadata.get("classes"), batch_size=batch_size, delta=delta)
    config = run.metadata.get("config", {}) if isinstance(run.metadata.get("config"), dict) else {}
    export.manifest.update({
        "name": run.name, "path": str(run.path), "preset": config.get("preset"), "attention": run.kind,
        "epoch": run.metadata.get("epoch"), "dataset": data or config.get("data"), "accuracy": _accuracy(run),
        "parameters": int(sum(p.numel() for p in run.model.parameters()))})
    return export


# -- HTML -----------------------------------------------------------------------------------------

def _json_for_script(obj) -> str:
    # Inside <script> the text must never contain "</script" or "<!--"; JSON allows escaping
    # these characters in strings, which is the only place they can occur.
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _template() -> str:
    return resources.files("attncnn.analysis").joinpath(PAGE_TEMPLATE).read_text(encoding="utf-8")


def build_html(exports: Sequence[RunExport], *, title: str = "attncnn attention viewer", level: int = 9) -> str:
    """The viewer page holding ``exports`` (one entry per run, in order).

    Args:
        exports: from :func:`export_run` / :func:`export_model`.
        title: the page title.
        level: zlib compression level of the blobs (9: smallest; the page inflates either way).

    Returns:
        The HTML text: the template with the JSON manifest and one base85 ``<script>`` element per
        set; it references nothing outside itself.

    Raises:
        ValueError: no exports.
        RuntimeError: the packaged template lacks its markers (a damaged installation).
    """
    if not exports:
        raise ValueError("the viewer needs at least one run")
    runs, blobs_meta, blob_texts = [], [], []
    for export in exports:
        manifest = dict(export.manifest)
        manifest["sets"] = [{**s, "blob": len(blob_texts) + s["blob"]} for s in manifest["sets"]]
        runs.append(manifest)
        for payload, arrays in export.blobs:
            packed = zlib.compress(payload, level)
            blobs_meta.append({"arrays": arrays, "bytes": len(payload), "compressed": len(packed)})
            blob_texts.append(base64.b85encode(packed).translate(_TO_PAGE).decode("ascii"))
    manifest = {"version": ENCODING_VERSION, "title": title, "runs": runs, "blobs": blobs_meta}
    page = _template()
    for mark, count in ((_MANIFEST_MARK, 1), (_BLOBS_MARK, 1), (_TITLE_MARK, 1)):
        if page.count(mark) != count:
            raise RuntimeError(f"the viewer template {PAGE_TEMPLATE} is damaged (marker {mark}); reinstall attncnn")
    page = page.replace(_TITLE_MARK, html.escape(title))      # before the data, which may contain anything
    head, rest = page.split(_MANIFEST_MARK)
    middle, tail = rest.split(_BLOBS_MARK)
    blobs_html = "\n".join(f'<script type="application/octet-stream" id="attncnn-blob-{i}">{text}</script>'
                           for i, text in enumerate(blob_texts))
    return head + _json_for_script(manifest) + middle + blobs_html + tail


def _check_output(out: Path) -> None:
    """Fail before the (slow) export when ``out`` cannot be written."""
    folder = out.parent
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a folder; give a file name such as {out / 'viewer.html'}")
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot write {out}: the folder {folder} does not exist; create it or choose "
                                "another --out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {out}: the folder {folder} is not writable; choose another --out")


def write_viewer(runs: Sequence[Run | str | os.PathLike], out: str | os.PathLike, *, indices: Sequence[int],
                 data: str | None = None, data_dir: str | None = None, average: int = 100,
                 batch_size: int = 50, title: str | None = None) -> Path:
    """Export ``runs`` and write the viewer page to ``out`` atomically (no half-written file).

    Args:
        runs: run folders or checkpoint files (or loaded :class:`~attncnn.analysis.runs.Run`).
        out: the HTML file to write.
        indices: test images shown one by one (e.g. the paper site's 2, 3, 19, 56).
        data, data_dir: data set override (default: each run's own).
        average: test images averaged for the "average" entry of content models (0: none).
        batch_size: images per forward pass.
        title: page title (default: names the runs).

    Returns:
        ``out`` as a Path.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError: ``out`` cannot be written (checked
            before the export), or a run does not exist.
        ValueError, attncnn.data.DataError: see :func:`export_run`.
    """
    out = Path(out)
    _check_output(out)
    exports = [export_run(run, indices, data=data, data_dir=data_dir, average=average, batch_size=batch_size)
               for run in runs]
    names = ", ".join(e.manifest["name"] for e in exports)
    data = build_html(exports, title=title or f"attncnn attention viewer: {names}").encode("utf-8")
    with atomic_path(out) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); a page is meant to be shared, so give it the
        # mode a plain open() would (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    log.info("viewer: wrote %s (%.1f MB)", out, len(data) / 1e6)
    if len(data) > _LARGE_PAGE:
        # maps grow as (H*W)^2 per head: a 32x32 token grid is 16 times a 16x16 one
        log.warning("viewer: %s is %.0f MB; browsers open such pages slowly. Use fewer --images or runs, "
                    "or --average 0", out, len(data) / 1e6)
    return out


# -- reading a page back (the page's computation in numpy) ----------------------------------------

@dataclass
class ViewerData:
    """The data embedded in a viewer page.

    Attributes:
        manifest: the JSON manifest (``version``, ``title``, ``runs``, ``blobs``).
        blobs: per blob, the decompressed payload.
    """

    manifest: dict
    blobs: list[bytes]

    def arrays(self, blob: int) -> dict[str, np.ndarray]:
        """The named arrays of one blob, shaped as stored."""
        payload = self.blobs[blob]
        out = {}
        for name, spec in self.manifest["blobs"][blob]["arrays"].items():
            dtype = {"uint8": np.uint8, "float32": "<f4"}[spec["dtype"]]
            count = int(np.prod(spec["shape"]))
            values = np.frombuffer(payload, dtype=dtype, count=count, offset=spec["offset"])
            out[name] = values.reshape(spec["shape"])
        return out


def read_viewer(page: str | os.PathLike) -> ViewerData:
    """Parse a page written by :func:`build_html` (a path, or the HTML text itself).

    Raises:
        ValueError: not a viewer page, or an encoding version this code does not read.
    """
    text = page if isinstance(page, str) and page.lstrip().startswith("<") else Path(page).read_text(encoding="utf-8")
    found = _MANIFEST_RE.search(text)
    if found is None:
        raise ValueError("not an attncnn viewer page (no manifest)")
    manifest = json.loads(found.group(1))
    if manifest.get("version") != ENCODING_VERSION:
        raise ValueError(f"viewer encoding version {manifest.get('version')}; this attncnn reads {ENCODING_VERSION}")
    texts = {int(m.group(1)): m.group(2) for m in _BLOB_RE.finditer(text)}
    blobs = [zlib.decompress(base64.b85decode(texts[i].encode("ascii").translate(_FROM_PAGE)))
             for i in range(len(manifest["blobs"]))]
    return ViewerData(manifest, blobs)


def _decode(encoding: dict, arrays: dict[str, np.ndarray], height: int, width: int) -> np.ndarray:
    """One layer's encoded maps -> ``(N_h, N, N)`` float64, as the page decodes them."""
    kind = encoding["enc"]
    if kind == "affine8":
        q = arrays[encoding["q"]]
        if encoding.get("delta"):
            q = np.cumsum(q, axis=-1, dtype=np.uint64) % 256
        lo = arrays[encoding["lo"]].astype(np.float64)
        step = arrays[encoding["step"]].astype(np.float64)
        return lo[..., None] + q.astype(np.float64) * step[..., None]
    if kind == "scaled8":
        q = arrays[encoding["q"]]
        if encoding.get("delta"):
            q = np.cumsum(q, axis=-1, dtype=np.uint64) % 256
        return q.astype(np.float64) * arrays[encoding["scale"]].astype(np.float64)[..., None]
    if kind == "separable8":
        q = arrays[encoding["q"]].astype(np.float64)
        lo = arrays[encoding["lo"]].astype(np.float64)
        step = arrays[encoding["step"]].astype(np.float64)
        pairs = q[..., :height, None] + q[..., None, height:]                 # (N_h, N, H, W)
        return lo[..., None] + step[..., None] * pairs.reshape(*q.shape[:-1], height * width)
    raise ValueError(f"unknown viewer encoding {kind!r}")


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def page_maps(data: ViewerData, run: int, image: str, kind: str = "all", softmax: bool = True) -> list[np.ndarray]:
    """The values the page shows, computed the page's way in numpy.

    Args:
        data: from :func:`read_viewer`.
        run: run index in the page.
        image: image key (``"2"``, ``"average"``).
        kind: one of :data:`DISPLAY_KINDS`.
        softmax: softmax over the keys (for ``"all"``: the model's probabilities).

    Returns:
        Per layer ``(N_h, N, N)`` float64, queries on dim -2, keys on dim -1.

    Raises:
        ValueError: unknown image, or a kind the run does not have.
    """
    info = data.manifest["runs"][run]
    entry = next((e for e in info["images"] if e["key"] == image), None)
    if entry is None:
        raise ValueError(f"run {info['name']} has no image {image!r}; it has {[e['key'] for e in info['images']]}")
    if kind not in DISPLAY_KINDS or not info["kinds"].get(kind):
        raise ValueError(f"run {info['name']} has no {kind!r} values")
    chosen = info["sets"][entry["set"]]
    maps = chosen["maps"]
    arrays = data.arrays(chosen["blob"])
    h, w = info["grid"]

    def decoded(name: str) -> list[np.ndarray]:
        return [_decode(enc, arrays, h, w) for enc in maps[name]]

    if kind == "all" or (kind == "positional" and "positional" not in maps):
        if softmax and "probs" in maps:
            return decoded("probs")
        if "scores" in maps:
            scores = decoded("scores")
            return [_softmax(s) for s in scores] if softmax else scores
        parts = [decoded(name) for name in ("content", "positional") if name in maps]
        scores = [sum(layer) for layer in zip(*parts)]
    else:
        scores = decoded(kind)
    return [_softmax(s) for s in scores] if softmax else scores
