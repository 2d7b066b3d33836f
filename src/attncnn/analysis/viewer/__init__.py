"""The paper's interactive website (epfml.github.io/attention-cnn) as one self-contained, offline HTML file.

:func:`write_viewer` exports the attention of one or more runs, for a few test images and the
average over a batch of test images, into a single HTML file (no network, all JS and CSS inline):
:mod:`.encoding` (how maps are stored), :mod:`.export` (maps into a manifest and blobs),
:mod:`.centers` (quadratic heads' centers and ellipses), :mod:`.page` (the HTML page) and
:mod:`.decode` (reading a page back); the command is :mod:`attncnn.cli.viewer`.
"""

from __future__ import annotations

from .decode import DISPLAY_KINDS, ViewerData, read_viewer
from .encoding import ENCODING_VERSION, quantize_affine, quantize_scaled, quantize_separable, separate_axes
from .export import RunExport, export_model, export_run
from .page import PAGE_TEMPLATE, build_html, write_viewer

__all__ = ["ENCODING_VERSION", "quantize_affine", "quantize_scaled", "quantize_separable", "separate_axes",
           "RunExport", "export_model", "export_run", "PAGE_TEMPLATE", "build_html", "write_viewer", "DISPLAY_KINDS",
           "ViewerData", "read_viewer"]
