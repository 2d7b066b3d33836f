"""Reading a viewer page back: its manifest and its blobs, in numpy."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError
from .encoding import ENCODING_VERSION, blob_bytes

__all__ = ["DISPLAY_KINDS", "ViewerData", "read_viewer"]

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
