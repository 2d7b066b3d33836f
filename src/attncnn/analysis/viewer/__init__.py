"""The paper's interactive website (epfml.github.io/attention-cnn) as one self-contained, offline HTML file.

:func:`write_viewer` exports the attention of one or more runs, for a few test images and the
average over a batch of test images, into a single HTML file (no network, all JS and CSS inline):
:mod:`.encoding` (how maps are stored), :mod:`.export` (maps into a manifest and blobs),
:mod:`.centers` (quadratic heads' centers and ellipses), :mod:`.page` (the HTML page) and
:mod:`.decode` (reading a page back); the command is :mod:`attncnn.cli.viewer`.

The names below load their module on first use, so the command registers without importing the
training code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> module of this package that defines it
_EXPORTS = {
    "ENCODING_VERSION": "encoding", "quantize_affine": "encoding", "quantize_scaled": "encoding",
    "quantize_separable": "encoding", "separate_axes": "encoding",
    "RunExport": "export", "export_model": "export", "export_run": "export",
    "PAGE_TEMPLATE": "page", "build_html": "page", "write_viewer": "page",
    "DISPLAY_KINDS": "decode", "ViewerData": "decode", "read_viewer": "decode",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # the names for type checkers and IDEs; at run time __getattr__ loads them
    from .decode import DISPLAY_KINDS, ViewerData, read_viewer
    from .encoding import ENCODING_VERSION, quantize_affine, quantize_scaled, quantize_separable, separate_axes
    from .export import RunExport, export_model, export_run
    from .page import PAGE_TEMPLATE, build_html, write_viewer


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
