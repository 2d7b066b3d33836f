"""Image data sets stored as ``train/<class>/*`` and ``test/<class>/*``, in a folder or a ``.zip``.

Labels follow the **sorted** class-folder names (for CIFAR-10 the official label order); within a
class, files are taken in sorted name order. Images are decoded with Pillow and converted to RGB;
all must share one size. The layout may be wrapped in one top-level folder
(``cifar10/train/...``). Names starting with ``.`` are skipped.

Symbolic links: in a folder, a link to a folder is followed like a folder (as torchvision's
``ImageFolder`` does); a dangling link where a class folder would be and a link back to a folder
containing it are refused with :class:`DataError`. A zip member stored as a link below ``train/``
or ``test/`` is refused, with the fix.

A ``test/`` that is ``train/``, or a test class folder that is a training class folder (by device
and inode), would test on training images: refused with :class:`DataError` naming both folders
(copies are not detected).

An image file or zip member larger than :data:`MAX_IMAGE_BYTES` is refused before it is read (at
most that many bytes plus one are read or inflated), as is an image with more pixels than
``PIL.Image.MAX_IMAGE_PIXELS``. A data set needs at least two classes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
import warnings
import zipfile
from pathlib import Path
from typing import IO, Callable

import numpy as np
import torch
from PIL import Image

from .base import DataError, ImageSplit

__all__ = ["IMAGE_EXTENSIONS", "MAX_IMAGE_BYTES", "read_image_folder", "peek_image_folder", "is_zip",
           "folder_files", "check_splits_apart"]

logger = logging.getLogger(__name__)

#: File name endings read as images (compared case-insensitively); other files are ignored.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
_SPLITS = ("train", "test")
#: Largest image file or zip member read or inflated, in bytes: far above any real image, small
#: enough that a hostile zip cannot exhaust memory.
MAX_IMAGE_BYTES = 64 * 2**20
#: Folder levels read below a data set's folder: ``[wrapper/]split/class/image``.
_DEPTH = 4


def _ident(folder: Path | str) -> tuple[int, int]:
    """``(device, inode)`` of a folder, links followed: the same for two paths of one folder."""
    st = os.stat(folder)
    return st.st_dev, st.st_ino


def is_zip(path: Path) -> bool:
    """True for a file whose name ends in ``.zip`` (case-insensitive)."""
    return path.is_file() and path.suffix.lower() == ".zip"


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise DataError(f"{path} is not a readable zip file ({err}); re-create or re-download it") from err


def _is_link(info: zipfile.ZipInfo) -> bool:
    """A zip member stored as a symbolic link: Unix-made (``create_system`` 3) with the link file type
    in the high 16 bits of ``external_attr`` (where Info-ZIP keeps ``st_mode``)."""
    return info.create_system == 3 and stat.S_ISLNK(info.external_attr >> 16)


def _list_zip(path: Path, zf: zipfile.ZipFile) -> list[str]:
    """The file members of ``zf``; a link member inside a ``train/`` or ``test/`` folder is refused
    (module docstring), other links are left out like any file that is not an image."""
    out = []
    for info in zf.infolist():
        if info.is_dir():
            continue
        if _is_link(info):
            if any(part in _SPLITS for part in info.filename.split("/")[:-1]):
                raise DataError(f"{info.filename} inside {path} is a symbolic link, which a zip read without "
                                "extracting it cannot follow; re-create the zip with the files it points to "
                                "(zip -r without -y/--symlinks)")
            continue
        out.append(info.filename)
    return out


def folder_files(path: str | os.PathLike[str]) -> list[str]:
    """The files of an image folder that a data set can be made of: those at most four levels down
    (``[wrapper/]split/class/image``), as posix paths relative to ``path``, in no particular order.

    Names starting with ``.`` are skipped. Links to folders are followed (module docstring), so a
    linked class folder's files are listed under the link's name.

    Raises:
        DataError: a folder cannot be listed; a link leads back to a folder containing it (a loop);
            a link inside ``train/`` or ``test/`` (where a class folder would be) points at nothing.
    """
    path = Path(path)
    out: list[str] = []

    def visit(folder: str, rel: tuple[str, ...], above: tuple[tuple[int, int], ...]) -> None:
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as err:
            raise DataError(f"cannot list the folder {folder} ({err.strerror}); make it readable or remove "
                            "it") from err
        for entry in entries:
            if entry.name.startswith("."):
                continue
            sub = (*rel, entry.name)
            if entry.is_dir():                                  # follows links
                if len(sub) >= _DEPTH:                          # where an image is expected: not read
                    continue
                try:
                    here = _ident(entry.path)
                except OSError as err:
                    raise DataError(f"cannot read the folder {entry.path} ({err.strerror}); make it "
                                    "readable or remove it") from err
                if here in above:
                    raise DataError(f"{entry.path} leads back to {os.path.realpath(entry.path)}, a folder that "
                                    "contains it (a symbolic-link loop); point the link at a folder of images")
                visit(entry.path, sub, (*above, here))
            elif entry.is_symlink() and not os.path.exists(entry.path) and rel and rel[-1] in _SPLITS:
                raise DataError(f"{entry.path} is a symbolic link to {os.readlink(entry.path)}, which does not "
                                "exist; point it at the class's folder of images or remove it")
            else:
                out.append("/".join(sub))

    try:
        root = _ident(path)
    except OSError as err:
        raise DataError(f"cannot read the folder {path} ({err.strerror})") from err
    visit(str(path), (), (root,))
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
        if (len(parts) != 2 or parts[0].startswith(".") or parts[1].startswith(".")
                or not parts[1].lower().endswith(IMAGE_EXTENSIONS)):
            continue
        by_class.setdefault(parts[0], []).append(n)
    if not by_class:
        raise DataError(f"{path} has no images in {prefix}<class>/; expected {split}/<class>/<image> "
                        f"(images ending in {', '.join(IMAGE_EXTENSIONS)})")
    return {c: sorted(files) for c, files in by_class.items()}


def _read_bounded(stream: IO[bytes], where: str, limit: int | None = None) -> bytes:
    """All of ``stream``, reading at most ``limit + 1`` bytes (default :data:`MAX_IMAGE_BYTES`): a zip
    member may inflate to more than its declared size, and a file may grow after it was measured.

    Raises:
        DataError: more than ``limit`` bytes (the message names ``where`` and the limit).
    """
    limit = MAX_IMAGE_BYTES if limit is None else limit
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise DataError(_too_large(where, f"holds more than {limit:,} bytes", limit))
    return data


def _too_large(where: str, what: str, limit: int) -> str:
    return (f"image {where} {what}, more than the {limit:,} bytes (attncnn.data.folder.MAX_IMAGE_BYTES) an "
            "image may have; remove or replace that file")


def _decode(data: bytes, where: str) -> np.ndarray:
    """``(H, W, 3)`` uint8 pixels of an encoded image; an image of more than
    ``PIL.Image.MAX_IMAGE_PIXELS`` pixels is refused (Pillow would only warn)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                if im.mode != "RGB":
                    im = im.convert("RGB")
                arr = np.asarray(im)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
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
            splits, fewer than two classes, a refused symbolic link or a test folder that is a
            training folder (module docstring), an image file larger than :data:`MAX_IMAGE_BYTES`, an
            unreadable image, or images of different sizes (the message names the file or member).
    """
    path = Path(path)
    with _open_zip(path) if is_zip(path) else contextlib.nullcontext() as zf:
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
    logger.info("decoded %s: %d classes, %d train, %d test images of %dx%d", path, len(classes),
                len(splits[0]), len(splits[1]), size[1], size[0])
    return classes, splits[0], splits[1]


def peek_image_folder(path: str | os.PathLike[str]) -> tuple[tuple[str, ...], int, int, tuple[int, int]]:
    """What :func:`read_image_folder` would return, without decoding it: the file listing and the
    first training image.

    Returns:
        ``(classes, train images, test images, (height, width))``; the size is the first training
        image's, which every image must share (only decoding checks that).

    Raises:
        DataError: as :func:`read_image_folder` for the layout and the first image.
    """
    path = Path(path)
    with _open_zip(path) if is_zip(path) else contextlib.nullcontext() as zf:
        classes, train_files, test_files = _layout(path, zf)
        read, where = _reader(path, zf)
        first = train_files[classes[0]][0]
        height, width = _decode(read(first), where(first)).shape[:2]
    return (classes, sum(map(len, train_files.values())), sum(map(len, test_files.values())),
            (int(height), int(width)))


def _layout(path: Path, zf: zipfile.ZipFile | None) -> tuple[tuple[str, ...], dict[str, list[str]],
                                                              dict[str, list[str]]]:
    """``(sorted class names, train files, test files)`` of a folder or open zip, each split as
    ``{class: sorted image paths}``; both splits must have the same classes, at least two."""
    names = _list_zip(path, zf) if zf is not None else folder_files(path)
    root = _find_root(names, path)
    train_files = _split_files(names, root, "train", path)
    test_files = _split_files(names, root, "test", path)
    classes = tuple(sorted(train_files))
    for c in [c for c in classes if c not in test_files] + sorted(set(test_files) - set(train_files)):
        missing, present = ("test", "train") if c in train_files else ("train", "test")
        raise DataError(f"{path}: class folder {root}{missing}/{c}/ is missing or has no images, but "
                        f"{root}{present}/{c}/ exists; both splits need the same class folders")
    if zf is None:
        check_splits_apart(path, root)
    if len(classes) < 2:
        raise DataError(f"{path} has a single class, {root}train/{classes[0]}/; a classifier needs at least two: "
                        f"add a folder of images for each other class under both {root}train/ and {root}test/")
    return classes, train_files, test_files


def check_splits_apart(path: str | os.PathLike[str], root: str | None = None) -> None:
    """Refuse an image folder whose test split, or one of its test class folders, is the same folder
    as its training split or one of its class folders (module docstring), with a few ``stat`` calls.

    Args:
        path: the data set's folder (a zip has no links: nothing is checked).
        root: where ``train/`` and ``test/`` are under ``path`` (``""`` or ``"<wrapper>/"``);
            default: ``path`` itself, else its one folder that holds a ``train/``.

    Raises:
        DataError: naming both folders, the real one they are, and the fix.
    """
    path = Path(path)
    if not path.is_dir():
        return
    if root is None:
        tops = [] if (path / "train").is_dir() else [
            entry.name for entry in os.scandir(path)
            if entry.is_dir() and not entry.name.startswith(".") and entry.name != "__MACOSX"]
        root = f"{tops[0]}/" if len(tops) == 1 else ""
    train, test = path / root / "train", path / root / "test"
    if not (train.is_dir() and test.is_dir()):
        return                                  # no layout: the loader says what is missing

    def classes(split: Path) -> dict[tuple[int, int], Path]:
        with os.scandir(split) as entries:
            return {_ident(entry.path): split / entry.name for entry in entries
                    if not entry.name.startswith(".") and entry.is_dir()}

    try:
        same_split = _ident(train) == _ident(test)
        trained, tested = classes(train), classes(test)
    except OSError as err:
        raise DataError(f"cannot read the folders of {path / root} ({err}); make them readable") from err
    if same_split:
        raise DataError(f"{test} is the same folder as {train} ({os.path.realpath(test)}): every test image would be "
                        "a training image, and the test accuracy would measure memorisation; give test/ its own "
                        "held-out images instead of a link to train/")
    for key, folder in sorted(tested.items(), key=lambda item: item[1].name):
        if key in trained:
            raise DataError(f"{folder} is the same folder as {trained[key]} ({os.path.realpath(folder)}): its test "
                            "images would also be training images; give it the class's own held-out test images "
                            "instead of a link to that folder")


def _reader(path: Path, zf: zipfile.ZipFile | None) -> tuple[Callable[[str], bytes], Callable[[str], str]]:
    """``(read, where)``: a listed name's bytes, and how messages name it."""
    if zf is not None:
        def where(name: str) -> str:
            return f"{name} (inside {path})"

        def read(name: str) -> bytes:
            size = zf.getinfo(name).file_size          # as the central directory declares it
            if size > MAX_IMAGE_BYTES:
                raise DataError(_too_large(where(name), f"declares {size:,} bytes", MAX_IMAGE_BYTES))
            try:
                with zf.open(name) as member:
                    return _read_bounded(member, where(name))
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:  # bad CRC, truncation
                raise DataError(f"cannot read {name} inside {path} ({err}); the zip is corrupt: "
                                "re-create or re-download it") from err
        return read, where

    def read_file(name: str) -> bytes:
        file = path / name
        try:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > MAX_IMAGE_BYTES:
                    raise DataError(_too_large(str(file), f"is {size:,} bytes", MAX_IMAGE_BYTES))
                return _read_bounded(f, str(file))
        except OSError as err:
            raise DataError(f"cannot read {file} ({err.strerror}); make it readable, or remove or replace "
                            "it") from err

    return read_file, lambda name: str(path / name)
