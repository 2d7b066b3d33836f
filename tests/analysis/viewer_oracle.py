"""The viewer page's computation in numpy (the rules of ``decode.js``), so that tests check what a
reader of the page sees against the model's maps, without a browser."""

from __future__ import annotations

import numpy as np

from attncnn.analysis.viewer.decode import DISPLAY_KINDS, ViewerData


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
    raise ValueError(f"unknown viewer encoding {kind!r}")


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def page_maps(data: ViewerData, run: int, image: str, kind: str = "all", softmax: bool = True) -> list[np.ndarray]:
    """The values the page shows, computed the page's way (``decode.js``) in numpy, without a browser.

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
