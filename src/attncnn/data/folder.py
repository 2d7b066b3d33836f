"""Image data sets stored as ``train/<class>/*`` and ``test/<class>/*``, in a folder or a ``.zip``.

Labels follow the **sorted** class-folder names: label ``k`` is ``sorted(train class folders)[k]``.
For CIFAR-10 that is the official label order (airplane, automobile, bird, cat, deer, dog, frog,
horse, ship, truck), which happens to be alphabetical. Within a class, files are taken in sorted
name order. Images are decoded with Pillow and converted to RGB; all must share one size.

A folder or zip may also wrap that layout in one top-level folder (``cifar10/train/...``).
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

from .base import DataError, ImageSplit

__all__ = ["IMAGE_EXTENSIONS", "read_image_folder", "peek_image_folder", "is_zip"]

logger = logging.getLogger(__name__)

#: File name endings read as images (compared case-insensitively); other files are ignored.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
_SPLITS = ("train", "test")


def is_zip(path: Path) -> bool:
    """True for a file whose name ends in ``.zip`` (case-insensitive)."""
    return path.is_file() and path.suffix.lower() == ".zip"


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise DataError(f"{path} is not a readable zip file ({err}); re-create or re-download it") from err


def _list_files(path: Path, zf: zipfile.ZipFile | None) -> list[str]:
    """All file paths below ``path`` (a folder, or the open zip ``zf``), as posix paths relative to it."""
    if zf is not None:
        return [i.filename for i in zf.infolist() if not i.is_dir()]
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(root).relative_to(path).as_posix()
        prefix = "" if rel == "." else rel + "/"
        out.extend(prefix + f for f in files)
    return out


def _find_root(names: list[str], path: Path) -> str:
    """The prefix under which ``train/`` and ``test/`` live: ``""`` or ``"<single folder>/"``."""
    if any(n.startswith("train/") for n in names):
        return ""
    tops = {n.split("/", 1)[0] for n in names if "/" in n and not n.startswith("__MACOSX/")}
    if len(tops) == 1:
        top = tops.pop() + "/"
        if any(n.startswith(top + "train/") for n in names):
            return top
    raise DataError(f"{path} has no train/ folder; expected train/<class>/<image> and test/<class>/<image> "
                    f"(images ending in {', '.join(IMAGE_EXTENSIONS)})")


def _split_files(names: list[str], root: str, split: str, path: Path) -> dict[str, list[str]]:
    """``{class: sorted image paths}`` for one split."""
    prefix = f"{root}{split}/"
    by_class: dict[str, list[str]] = {}
    for n in names:
        if not n.startswith(prefix):
            continue
        parts = n[len(prefix):].split("/")
        if len(parts) != 2 or parts[1].startswith(".") or not parts[1].lower().endswith(IMAGE_EXTENSIONS):
            continue
        by_class.setdefault(parts[0], []).append(n)
    if not by_class:
        raise DataError(f"{path} has no images in {prefix}<class>/; expected {split}/<class>/<image> "
                        f"(images ending in {', '.join(IMAGE_EXTENSIONS)})")
    return {c: sorted(files) for c, files in by_class.items()}


def _decode(data: bytes, where: str) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode != "RGB":
                im = im.convert("RGB")
            arr = np.asarray(im)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"cannot read image {where} ({err}); remove or replace that file") from err
    return arr


def _decode_split(files: list[str], read: Callable[[str], bytes], where: Callable[[str], str],
                  size: tuple[int, int] | None, first: str | None) -> tuple[np.ndarray, tuple[int, int], str]:
    """Decode ``files`` into ``(N, H, W, 3)``; every image must be ``size`` (set by the first if None)."""
    out: np.ndarray | None = None
    for i, name in enumerate(files):
        arr = _decode(read(name), where(name))
        if size is None:
            size, first = arr.shape[:2], where(name)
        if arr.shape[:2] != tuple(size):
            raise DataError(f"image {where(name)} is {arr.shape[1]}x{arr.shape[0]} pixels but {first} is "
                            f"{size[1]}x{size[0]}; every image of a data set must have the same size")
        if out is None:
            out = np.empty((len(files), *size, 3), dtype=np.uint8)
        out[i] = arr
    assert out is not None and size is not None and first is not None
    return out, tuple(size), first


def read_image_folder(path: str | os.PathLike[str]) -> tuple[tuple[str, ...], ImageSplit, ImageSplit]:
    """Read a ``train/<class>/*`` + ``test/<class>/*`` folder or zip.

    Returns:
        ``(classes, train, test)``; ``classes`` are the sorted class-folder names.

    Raises:
        DataError: no train/ or test/, a split without images, class folders that differ between the
            splits, an unreadable image, or images of different sizes (the message names the file).
    """
    path = Path(path)
    zf = _open_zip(path) if is_zip(path) else None
    try:
        classes, train_files, test_files = _layout(path, zf)
        read, where = _reader(path, zf)
        splits = []
        size = first = None
        for files in (train_files, test_files):
            ordered = [f for c in classes for f in files[c]]
            labels = np.concatenate([np.full(len(files[c]), k, dtype=np.int64) for k, c in enumerate(classes)])
            images, size, first = _decode_split(ordered, read, where, size, first)
            tensor = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
            splits.append(ImageSplit(tensor, torch.from_numpy(labels)))
    finally:
        if zf is not None:
            zf.close()
    logger.info("decoded %s: %d classes, %d train, %d test images of %dx%d", path, len(classes),
                len(splits[0]), len(splits[1]), size[1], size[0])
    return classes, splits[0], splits[1]


def peek_image_folder(path: str | os.PathLike[str]) -> tuple[tuple[str, ...], int, int, tuple[int, int]]:
    """What :func:`read_image_folder` would return, without decoding it: the file listing and the
    first training image (milliseconds where decoding CIFAR-10 takes tens of seconds).

    Returns:
        ``(classes, train images, test images, (height, width))``; the size is the first training
        image's, which every image must share (only decoding checks that).

    Raises:
        DataError: as :func:`read_image_folder` for the layout and the first image.
    """
    path = Path(path)
    zf = _open_zip(path) if is_zip(path) else None
    try:
        classes, train_files, test_files = _layout(path, zf)
        read, where = _reader(path, zf)
        first = train_files[classes[0]][0]
        height, width = _decode(read(first), where(first)).shape[:2]
    finally:
        if zf is not None:
            zf.close()
    return (classes, sum(map(len, train_files.values())), sum(map(len, test_files.values())),
            (int(height), int(width)))


def _layout(path: Path, zf: zipfile.ZipFile | None) -> tuple[tuple[str, ...], dict[str, list[str]],
                                                              dict[str, list[str]]]:
    """``(sorted class names, train files, test files)`` of a folder or open zip, each split as
    ``{class: sorted image paths}``; both splits must have the same classes."""
    names = _list_files(path, zf)
    root = _find_root(names, path)
    train_files = _split_files(names, root, "train", path)
    test_files = _split_files(names, root, "test", path)
    classes = tuple(sorted(train_files))
    for c in classes:
        if c not in test_files:
            raise DataError(f"{path}: class folder {root}test/{c}/ is missing or has no images, but "
                            f"{root}train/{c}/ exists; both splits need the same class folders")
    for c in sorted(test_files):
        if c not in train_files:
            raise DataError(f"{path}: class folder {root}train/{c}/ is missing or has no images, but "
                            f"{root}test/{c}/ exists; both splits need the same class folders")
    return classes, train_files, test_files


def _reader(path: Path, zf: zipfile.ZipFile | None) -> tuple[Callable[[str], bytes], Callable[[str], str]]:
    """``(read, where)``: a listed name's bytes, and how messages name it."""
    if zf is not None:
        def read(name: str) -> bytes:
            try:
                return zf.read(name)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:  # bad CRC, truncation
                raise DataError(f"cannot read {name} inside {path} ({err}); the zip is corrupt: "
                                "re-create or re-download it") from err

        def where(name: str) -> str:
            return f"{name} (inside {path})"
        return read, where

    def read_file(name: str) -> bytes:
        try:
            return (path / name).read_bytes()
        except OSError as err:
            raise DataError(f"cannot read {path / name} ({err.strerror})") from err

    return read_file, lambda name: str(path / name)
