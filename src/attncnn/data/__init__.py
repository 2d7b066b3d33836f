"""Data: CIFAR-10/100 archives, image folders and zips, a decoded-array cache, device-resident batches.

Entry point: :func:`load_dataset`; batches: :class:`DeviceLoader`. A folder or zip is decoded once
and cached on disk (:mod:`attncnn.data.cache`); the last one read is also kept in memory until
:func:`forget_cached_dataset` lets it go.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .._recorded_data import is_data_name, locate_recorded_data, not_here_message, run_folder_of
from .base import DataError, Dataset, DataShape, ImageSplit, default_data_dir
from .cache import cache_file, forget_cached_dataset, read_cache, write_cache
from .cifar import CIFAR10_CLASSES, VARIANTS, load_cifar
from .folder import IMAGE_EXTENSIONS, check_splits_apart, is_zip, peek_image_folder, read_image_folder
from .jpeg import describe_jpeg, jpeg_encoding
from .cutmix import apply_cutmix, draw_boxes
from .loader import CIFAR_MEAN, CIFAR_STD, DeviceLoader, random_crop_flip
from .subset import class_balanced_subset, held_out_indices

__all__ = [
    "CIFAR_MEAN", "CIFAR_STD", "CIFAR10_CLASSES", "ImageSplit", "Dataset", "DataShape", "DataError",
    "default_data_dir", "load_dataset", "peek_dataset", "class_balanced_subset", "held_out_indices", "DeviceLoader",
    "random_crop_flip", "apply_cutmix", "draw_boxes", "DEFAULT_DATA", "run_data", "forget_cached_dataset",
]

log = logging.getLogger(__name__)


#: the data set of a command that names none (never one for a run whose own data set is not here)
DEFAULT_DATA = "cifar10"
#: CIFAR-10's and CIFAR-100's (training, test) images
CIFAR_SIZES = (50_000, 10_000)


def _describe(path: Path, kind: str, classes: tuple[str, ...], train: ImageSplit) -> str:
    """The data set's line in logs and checkpoints: where it is and, for JPEG files, how they were
    encoded (read from a file, :mod:`attncnn.data.jpeg`). The CIFAR-10 notes keep their opening words,
    which :mod:`attncnn.api.classifier` looks for to know a model's image size."""
    source = f"image {kind} {path}"
    size = tuple(train.images.shape[2:])
    encoding = jpeg_encoding(path)
    if classes == CIFAR10_CLASSES and size == (32, 32):
        source += (f" (CIFAR-10 JPEG mirror; {describe_jpeg(encoding, size)}: pixels differ from the official "
                   "binaries)" if encoding is not None else " (CIFAR-10 classes)")
    elif encoding is not None:
        source += f" ({describe_jpeg(encoding, size)})"
    return source


def _load_images(path: Path, data_dir: Path) -> Dataset:
    kind = "zip" if is_zip(path) else "folder"
    check_splits_apart(path)            # before the cache too: a copy decoded by an older attncnn is refused
    try:
        cached_at = cache_file(data_dir, path)
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    hit = read_cache(cached_at)
    if hit is not None:
        classes, train, test = hit
    else:
        classes, train, test = read_image_folder(path)
        write_cache(cached_at, classes, train, test, source=str(path))
    return Dataset(name=path.name, source=_describe(path, kind, classes, train), classes=classes,
                   train=train, test=test)


def load_dataset(spec: str | os.PathLike[str], *, data_dir: str | os.PathLike[str] | None = None,
                 download: bool = False) -> Dataset:
    """Load a data set by name or path.

    Args:
        spec: ``"cifar10"`` or ``"cifar100"`` (case-insensitive): the official archives in
            ``data_dir``; or a path to a folder or ``.zip`` holding ``train/<class>/<image>`` and
            ``test/<class>/<image>`` (labels follow the sorted class-folder names). A name wins over
            a folder of the same name in the working directory; write ``./cifar10`` for the folder.
        data_dir: where archives are looked for and downloaded, and decoded images cached
            (default :func:`default_data_dir`).
        download: fetch a missing official archive (never done otherwise).

    Raises:
        DataError: with a message naming the files or places involved and the fix.
    """
    data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    text = os.fspath(spec).strip()
    if is_data_name(text):
        return load_cifar(text.lower(), data_dir, download=download)
    path = Path(text).expanduser()
    if path.is_dir() or is_zip(path):
        return _load_images(path, data_dir)
    if path.exists():
        raise DataError(f"{path} is neither a folder nor a .zip file; pass cifar10, cifar100, or a folder or "
                        "zip holding train/<class>/<image> and test/<class>/<image>")
    raise DataError(f"unknown data set {text!r} (no such file or folder); valid choices: cifar10, cifar100, or "
                    f"the path of a folder or .zip holding train/<class>/<image> and test/<class>/<image> "
                    f"(images ending in {', '.join(IMAGE_EXTENSIONS)})")


def peek_dataset(spec: str | os.PathLike[str], *, data_dir: str | os.PathLike[str] | None = None) -> DataShape:
    """The sizes :func:`load_dataset` would give ``spec``, without decoding or downloading it:
    CIFAR-10/100's are known; a folder or zip is listed and its first training image decoded (for
    plans and estimates such as ``attncnn reproduce --dry-run``).

    Args:
        spec, data_dir: as :func:`load_dataset`.

    Raises:
        DataError: as :func:`load_dataset` for an unknown name, a missing path or a folder or zip
            without the ``train/<class>/<image>`` and ``test/<class>/<image>`` layout.
    """
    text = os.fspath(spec).strip()
    if is_data_name(text):
        train, test = CIFAR_SIZES
        return DataShape(text.lower(), train, test, VARIANTS[text.lower()][0].num_classes, (3, 32, 32))
    path = Path(text).expanduser()
    if not (path.is_dir() or is_zip(path)):
        load_dataset(path, data_dir=data_dir)       # raises its error for what is there instead
    classes, train, test, (height, width) = peek_image_folder(path)
    return DataShape(path.name, train, test, len(classes), (3, height, width))


def run_data(stored: str | None, given: str | None = None, *, run: str | os.PathLike[str] | None = None) -> str:
    """The data set a command uses for a trained run: ``given`` if any, else the run's own, found by
    the rule of :mod:`attncnn._recorded_data` (never replaced by another one where it is not here).

    Args:
        stored: the run's ``config["data"]`` (None: not recorded, i.e. :data:`DEFAULT_DATA`).
        given: the data set given on the command line, which always wins.
        run: the run folder or checkpoint file, where a relative ``stored`` is also looked for.

    Returns:
        A data-set spec for :func:`load_dataset` (a relative path found comes back absolute).

    Raises:
        DataError: the run's data set is not on this machine, or a relative path fits two different
            files; the message names the recorded data set and ``--data``.
    """
    if given:
        return given
    if not stored:
        return DEFAULT_DATA
    try:
        found = locate_recorded_data(stored, run)
    except ValueError as err:
        raise DataError(str(err)) from None
    if found is None:
        raise DataError(not_here_message(stored, run))
    if found != stored:
        log.info("%s: its data set %s is %s here", run_folder_of(run) or "the run", stored, found)
    return found
