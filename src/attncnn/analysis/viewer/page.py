"""The viewer page: one self-contained HTML file holding the exports of one or more runs.

The template is package data beside this module: ``page.html`` with its style sheet
(``page.css``) and scripts (``decode.js``, ``page.js``) inlined at build time, so the written page
references nothing outside itself and works offline.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
from importlib import resources
from pathlib import Path
from typing import Sequence

from ..._io import atomic_write_bytes
from ...errors import InputError, MissingFileError, OutputError
from ..runs import Run, label_runs, open_run
from .encoding import ENCODING_VERSION, blob_text
from .export import RunExport, export_run

__all__ = ["PAGE_TEMPLATE", "page_template", "build_html", "write_viewer"]

log = logging.getLogger(__name__)

#: The page template, package data beside this module.
PAGE_TEMPLATE = "page.html"

# A marker line of the template that the named package file replaces.
_INCLUDE_RE = re.compile(r"/\*__ATTNCNN_INCLUDE ([A-Za-z0-9_.-]+)__\*/")
# What an inlined file must not hold: it would end its <style> or <script> element early.
_CLOSES_ELEMENT = re.compile(r"</(script|style)|<!--", re.IGNORECASE)
_MANIFEST_MARK = "__ATTNCNN_MANIFEST__"
_BLOBS_MARK = "<!--__ATTNCNN_BLOBS__-->"
_TITLE_MARK = "__ATTNCNN_TITLE__"
#: Pages above this many bytes get a logged warning.
_LARGE_PAGE = 100_000_000


def page_template() -> str:
    """The template :data:`PAGE_TEMPLATE` with its style sheet and scripts inlined.

    Raises:
        RuntimeError: an inlined file could close its element (a damaged installation).
        FileNotFoundError: a package file is missing (a damaged installation).
    """
    folder = resources.files(__package__)

    def inline(found: re.Match) -> str:
        text = folder.joinpath(found.group(1)).read_text(encoding="utf-8")
        if _CLOSES_ELEMENT.search(text):
            raise RuntimeError(f"the viewer file {found.group(1)} would end its element early; reinstall attncnn")
        return text.rstrip("\n")

    return _INCLUDE_RE.sub(inline, folder.joinpath(PAGE_TEMPLATE).read_text(encoding="utf-8"))


def _json_for_script(obj) -> str:
    # Inside <script> the text must never contain "</script" or "<!--"; JSON allows escaping
    # these characters in strings, which is the only place they can occur.
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def build_html(exports: Sequence[RunExport], *, title: str = "attncnn attention viewer", level: int = 9) -> str:
    """The viewer page holding ``exports`` (one entry per run, in order).

    Args:
        exports: from :func:`~.export.export_run` / :func:`~.export.export_model`.
        title: the page title.
        level: zlib compression level of the blobs (9: smallest; the page inflates either way).

    Returns:
        The HTML text: the template with the JSON manifest and one base85 ``<script>`` element per
        set; it references nothing outside itself.

    Raises:
        InputError: no exports.
        RuntimeError: the packaged template lacks its markers (a damaged installation).
    """
    if not exports:
        raise InputError("the viewer needs at least one run")
    runs, blobs_meta, blob_texts = [], [], []
    for export in exports:
        manifest = dict(export.manifest)
        manifest["sets"] = [{**s, "blob": len(blob_texts) + s["blob"]} for s in manifest["sets"]]
        runs.append(manifest)
        for payload, arrays in export.blobs:
            text, compressed = blob_text(payload, level)
            blobs_meta.append({"arrays": arrays, "bytes": len(payload), "compressed": compressed})
            blob_texts.append(text)
    manifest = {"version": ENCODING_VERSION, "title": title, "runs": runs, "blobs": blobs_meta}
    page = page_template()
    for mark in (_MANIFEST_MARK, _BLOBS_MARK, _TITLE_MARK):
        if page.count(mark) != 1:
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
        raise OutputError(f"--out {out} is a folder; give a file name such as {out / 'viewer.html'}")
    if not folder.is_dir():
        raise MissingFileError(f"cannot write {out}: the folder {folder} does not exist; create it or choose "
                                "another --out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {out}: the folder {folder} is not writable; choose another --out")


def write_viewer(runs: Sequence[Run | str | os.PathLike], out: str | os.PathLike, *, indices: Sequence[int],
                 data: str | None = None, data_dir: str | None = None, average: int = 100,
                 batch_size: int = 50, title: str | None = None) -> Path:
    """Export ``runs`` and write the viewer page to ``out`` atomically.

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
        InputError, attncnn.data.DataError: see :func:`~.export.export_run`.
    """
    out = Path(out)
    _check_output(out)
    # "<preset> seed <seed>" per run, made distinct: the page's run menu must tell them apart
    opened = label_runs([run if isinstance(run, Run) else open_run(run) for run in runs])
    exports = [export_run(run, indices, data=data, data_dir=data_dir, average=average, batch_size=batch_size)
               for run in opened]
    names = ", ".join(e.manifest["name"] for e in exports)
    data = build_html(exports, title=title or f"attncnn attention viewer: {names}").encode("utf-8")
    atomic_write_bytes(out, data)
    log.info("viewer: wrote %s (%.1f MB)", out, len(data) / 1e6)
    if len(data) > _LARGE_PAGE:
        # maps grow as (H*W)^2 per head: a 32x32 token grid is 16 times a 16x16 one
        log.warning("viewer: %s is %.0f MB; browsers open such pages slowly. Use fewer --images or runs, "
                    "or --average 0", out, len(data) / 1e6)
    return out
