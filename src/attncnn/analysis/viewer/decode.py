"""Reading a viewer page back: its manifest, its blobs, and the values it shows, in numpy.

:func:`page_maps` applies the page's rules (``decode.js``) so the tests can check what a reader
of the page sees against the model's maps, without a browser.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError
from .encoding import ENCODING_VERSION, blob_bytes

__all__ = ["DISPLAY_KINDS", "ViewerData", "read_viewer", "page_maps"]

#: Value choices of the page: all score terms, the positional term only, the content term only, and
#: the attention rollout up to each layer (one map per layer; the softmax switch does not apply).
DISPLAY_KINDS = ("all", "positional", "content", "rollout")

_BLOB_RE = re.compile(r'<script type="application/octet-stream" id="attncnn-blob-(\d+)">([^<]*)</script>')
_MANIFEST_RE = re.compile(r'<script type="application/json" id="attncnn-manifest">([^<]*)</script>')


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
    """Parse a page written by :func:`~.page.build_html` (a path, or the HTML text itself).

    Raises:
        InputError: not a viewer page, or an encoding version this code does not read.
    """
    text = page if isinstance(page, str) and page.lstrip().startswith("<") else Path(page).read_text(encoding="utf-8")
    found = _MANIFEST_RE.search(text)
    if found is None:
        raise InputError("not an attncnn viewer page (no manifest)")
    manifest = json.loads(found.group(1))
    if manifest.get("version") != ENCODING_VERSION:
        raise InputError(f"viewer encoding version {manifest.get('version')}; this attncnn reads {ENCODING_VERSION}")
    texts = {int(m.group(1)): m.group(2) for m in _BLOB_RE.finditer(text)}
    return ViewerData(manifest, [blob_bytes(texts[i]) for i in range(len(manifest["blobs"]))])


def _running_sum(q: np.ndarray, encoding: dict) -> np.ndarray:
    """Undo the ``delta`` storage (differences modulo 256) when the encoding used it."""
    return np.cumsum(q, axis=-1, dtype=np.uint64) % 256 if encoding.get("delta") else q


def _decode(encoding: dict, arrays: dict[str, np.ndarray], height: int, width: int) -> np.ndarray:
    """One layer's encoded maps -> ``(N_h, N, N)`` float64, as the page decodes them."""
    kind = encoding["enc"]
    if kind == "affine8":
        q = _running_sum(arrays[encoding["q"]], encoding)
        lo = arrays[encoding["lo"]].astype(np.float64)
        step = arrays[encoding["step"]].astype(np.float64)
        return lo[..., None] + q.astype(np.float64) * step[..., None]
    if kind == "scaled8":
        q = _running_sum(arrays[encoding["q"]], encoding)
        return q.astype(np.float64) * arrays[encoding["scale"]].astype(np.float64)[..., None]
    if kind == "separable8":
        q = arrays[encoding["q"]].astype(np.float64)
        lo = arrays[encoding["lo"]].astype(np.float64)
        step = arrays[encoding["step"]].astype(np.float64)
        pairs = q[..., :height, None] + q[..., None, height:]                 # (N_h, N, H, W)
        return lo[..., None] + step[..., None] * pairs.reshape(*q.shape[:-1], height * width)
    raise InputError(f"unknown viewer encoding {kind!r}")


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
        Per layer ``(N_h, N, N)`` float64, queries on dim -2, keys on dim -1; ``(1, N, N)`` for
        ``"rollout"`` (its values are shown as stored, with or without ``softmax``).

    Raises:
        InputError: unknown image, or a kind the run does not have.
    """
    info = data.manifest["runs"][run]
    entry = next((e for e in info["images"] if e["key"] == image), None)
    if entry is None:
        raise InputError(f"run {info['name']} has no image {image!r}; it has {[e['key'] for e in info['images']]}")
    if kind not in DISPLAY_KINDS or not info["kinds"].get(kind):
        raise InputError(f"run {info['name']} has no {kind!r} values")
    chosen = info["sets"][entry["set"]]
    maps = chosen["maps"]
    arrays = data.arrays(chosen["blob"])
    h, w = info["grid"]

    def decoded(name: str) -> list[np.ndarray]:
        return [_decode(enc, arrays, h, w) for enc in maps[name]]

    if kind == "rollout":
        return decoded("rollout")
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
