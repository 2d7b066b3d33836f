"""MkDocs hook: the committed results (figures, reports, the viewer page) become part of the site.

They live in ``results/`` beside the code, where the commands write them and the tests check them;
copying them into ``docs/`` would keep two versions. Pages link to them as ``results/...``, the
same relative path as from the repository's README.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

#: what of results/ the site carries: figures, reports and READMEs (as pages), the offline viewer
_KINDS = ("*.png", "*.md", "viewer.html")


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for pattern in _KINDS:
        for path in sorted((root / "results").rglob(pattern)):
            uri = path.relative_to(root).as_posix()
            if files.get_file_from_path(uri) is None:
                files.append(File(uri, src_dir=str(root), dest_dir=config["site_dir"],
                                  use_directory_urls=config["use_directory_urls"]))
    return files
