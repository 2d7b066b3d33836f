"""Data: CIFAR-10/100 archives, image folders and zips, a decoded-array cache, device-resident batches.

Entry point: :func:`load_dataset`; batches: :class:`DeviceLoader`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .base import DataError, Dataset, DataShape, ImageSplit, default_data_dir
from .cache import cache_file, read_cache, write_cache
from .cifar import CIFAR10_CLASSES, VARIANTS, load_cifar
from .folder import IMAGE_EXTENSIONS, is_zip, peek_image_folder, read_image_folder
from .loader import CIFAR_MEAN, CIFAR_STD, DeviceLoader, random_crop_flip
from .subset import class_balanced_subset, held_out_indices

__all__ = [
    "CIFAR_MEAN", "CIFAR_STD", "CIFAR10_CLASSES", "ImageSplit", "Dataset", "DataShape", "DataError",
    "default_data_dir", "load_dataset", "peek_dataset", "class_balanced_subset", "held_out_indices", "DeviceLoader",
    "random_crop_flip", "DEFAULT_DATA", "run_data",
]

log = logging.getLogger(__name__)


_NAMES = ("cifar10", "cifar100")
#: the data set of a command that names none, and of a stored run whose own data set is not here
DEFAULT_DATA = "cifar10"
#: CIFAR-10's and CIFAR-100's (training, test) images
CIFAR_SIZES = (50_000, 10_000)


def _describe(path: Path, kind: str, classes: tuple[str, ...], train: ImageSplit) -> str:
    source = f"image {kind} {path}"
    if classes == CIFAR10_CLASSES and tuple(train.images.shape[2:]) == (32, 32):
        lossy = path.name.lower().find("jpeg") >= 0 or path.name.lower().find("jpg") >= 0
        source += (" (CIFAR-10 JPEG mirror; pixels differ slightly from the official binaries)" if lossy
                   else " (CIFAR-10 classes)")
    return source


def _load_images(path: Path, data_dir: Path) -> Dataset:
    kind = "zip" if is_zip(path) else "folder"
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
    if text.lower() in _NAMES:
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
    CIFAR-10/100's are known (no file is read); a folder or zip is listed and its first training
    image decoded. For plans and estimates (``attncnn reproduce --dry-run``), which must not spend
    the minutes a first decoding takes.

    Args:
        spec, data_dir: as :func:`load_dataset`.

    Raises:
        DataError: as :func:`load_dataset` for an unknown name, a missing path or a folder or zip
            without the ``train/<class>/<image>`` and ``test/<class>/<image>`` layout.
    """
    text = os.fspath(spec).strip()
    if text.lower() in _NAMES:
        train, test = CIFAR_SIZES
        return DataShape(text.lower(), train, test, VARIANTS[text.lower()][0].num_classes, (3, 32, 32))
    path = Path(text).expanduser()
    if not (path.is_dir() or is_zip(path)):
        load_dataset(path, data_dir=data_dir)       # raises its error for what is there instead
    classes, train, test, (height, width) = peek_image_folder(path)
    return DataShape(path.name, train, test, len(classes), (3, height, width))


def run_data(stored: str | None, given: str | None = None) -> str:
    """The data set a command uses for a trained run: ``given`` if any, else the run's own.

    A run stores the data set it was trained on (``config["data"]``). That is used when it names
    CIFAR-10/100 or a folder or zip that exists here; a run from another machine, or a shipped
    run (which stores only its data set's file name, never a local path), falls back to
    :data:`DEFAULT_DATA` with a log line naming the run's own, so that ``--data`` is the fix.

    Args:
        stored: the run's ``config["data"]`` (None: not recorded).
        given: the data set given on the command line, which always wins.

    Returns:
        A data-set spec for :func:`load_dataset`.
    """
    if given:
        return given
    if not stored:
        return DEFAULT_DATA
    if stored.strip().lower() in _NAMES or Path(stored).expanduser().exists():
        return stored
    log.warning("the run was trained on %s, which is not here; using %s (pass --data to choose the data set)",
                stored, DEFAULT_DATA)
    return DEFAULT_DATA
