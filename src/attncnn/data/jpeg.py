"""How an image data set's JPEG files were encoded: quality and chroma subsampling, read from a file.

A data set stored as JPEG is not the data set its images came from (``cifar10-jpeg.zip`` was
encoded at quality 75 with 4:2:0 subsampling, its colour kept at 16 x 16): accuracies on it are not
accuracies on the official binaries, so the loader names the encoding beside the data set
(:func:`describe_jpeg`), read from the files themselves. The quality is found by matching the
luminance quantisation table against the IJG scaling of the JPEG standard's example table (ITU-T
T.81, Annex K, Table K.1); a file with another table reports only its subsampling.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import NamedTuple

from PIL import Image, JpegImagePlugin

__all__ = ["JpegEncoding", "ijg_quality", "jpeg_encoding", "describe_jpeg"]

#: ITU-T T.81 Table K.1, luminance, in natural (row-major) order
_K1_LUMA = (
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
)
#: Pillow's ``get_sampling`` codes
_SUBSAMPLING = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}
_JPEG_SUFFIXES = (".jpg", ".jpeg")


class JpegEncoding(NamedTuple):
    """How one JPEG file was encoded.

    Attributes:
        quality: the IJG quality (1-100) whose table the file uses, or None (another table).
        subsampling: ``"4:4:4"``, ``"4:2:2"``, ``"4:2:0"``, or None (greyscale or another layout).
    """

    quality: int | None
    subsampling: str | None


def _ijg_table(quality: int) -> tuple[int, ...]:
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return tuple(min(max((q * scale + 50) // 100, 1), 255) for q in _K1_LUMA)


def ijg_quality(luma_table) -> int | None:
    """The IJG quality (1-100) whose scaled Table K.1 equals ``luma_table`` (64 entries, natural
    order, as Pillow's ``Image.quantization[0]``), or None where no quality gives it."""
    table = tuple(int(v) for v in luma_table)
    return next((q for q in range(100, 0, -1) if _ijg_table(q) == table), None)


def _first_jpeg(path: Path) -> bytes | None:
    """The bytes of one JPEG image of the zip or folder ``path`` (the first in name order), or None."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = sorted(n for n in archive.namelist() if n.lower().endswith(_JPEG_SUFFIXES))
            return archive.read(names[0]) if names else None
    for root, dirs, files in os.walk(path):
        dirs.sort()
        found = sorted(f for f in files if f.lower().endswith(_JPEG_SUFFIXES))
        if found:
            return (Path(root) / found[0]).read_bytes()
    return None


def jpeg_encoding(path: str | os.PathLike[str]) -> JpegEncoding | None:
    """The encoding of the data set at ``path`` (an image zip or folder), read from one of its JPEG
    files; None where it holds none or the file cannot be read."""
    try:
        data = _first_jpeg(Path(path))
        if data is None:
            return None
        with Image.open(io.BytesIO(data)) as image:
            tables = getattr(image, "quantization", None) or {}
            sampling = JpegImagePlugin.get_sampling(image) if image.mode in ("RGB", "YCbCr") else -1
    except (OSError, ValueError, zipfile.BadZipFile):
        return None
    quality = ijg_quality(tables[0]) if 0 in tables and len(tables[0]) == 64 else None
    return JpegEncoding(quality, _SUBSAMPLING.get(sampling))


def describe_jpeg(encoding: JpegEncoding, image_size: tuple[int, int] | None = None) -> str:
    """A phrase for logs and reports, e.g. ``"JPEG quality 75 with 4:2:0 chroma subsampling (colour
    stored at 16x16)"`` for ``image_size`` ``(32, 32)`` (``(H, W)`` in pixels), or ``"... (colour
    at half the resolution along both axes)"`` where the size is not given."""
    text = "JPEG" + (f" quality {encoding.quality}" if encoding.quality is not None else " (a non-IJG table)")
    if encoding.subsampling is None:
        return text
    text += f" with {encoding.subsampling} chroma subsampling"
    if encoding.subsampling == "4:4:4":
        return text
    if image_size is not None:
        h, w = image_size
        colour = (h // 2, w // 2) if encoding.subsampling == "4:2:0" else (h, w // 2)
        return text + f" (colour stored at {colour[0]}x{colour[1]})"
    return text + (" (colour at half the resolution along both axes)" if encoding.subsampling == "4:2:0"
                   else " (colour at half the horizontal resolution)")
