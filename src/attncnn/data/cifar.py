"""The official CIFAR-10 / CIFAR-100 archives (Krizhevsky, 2009): find, download, verify, extract, parse.

Both the *binary* versions (preferred; what ``--download`` fetches) and the *python* (pickle)
versions are read, from the extracted folder or from the ``.tar.gz`` archive (checked against its
published md5 and extracted atomically).

Binary layout: every record is ``<label byte> <3072 pixel bytes>`` for CIFAR-10 and
``<coarse byte> <fine byte> <3072 pixel bytes>`` for CIFAR-100 (fine labels are used); the pixels
are the red, green and blue row-major 32x32 planes, so a record reshapes to ``(3, 32, 32)``. The
pickles are read with an unpickler that refuses every global except the three numpy names an
array needs, so a tampered file cannot run code.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .._io import atomic_path
from .base import DataError, Dataset, ImageSplit

__all__ = ["CIFAR10_CLASSES", "URLS", "MD5", "VARIANTS", "load_cifar", "read_binary_batch", "safe_unpickle"]

logger = logging.getLogger(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

#: Published md5 of each archive (module constant; tests patch it for their tiny archives).
MD5: dict[str, str] = {
    "cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530",
    "cifar-100-binary.tar.gz": "03b5dce01913d631647c71ecec9e9cb8",
    "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
    "cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85",
}

#: Where each archive is downloaded from (module constant; tests point it at a local file).
URLS: dict[str, str] = {name: "https://www.cs.toronto.edu/~kriz/" + name for name in MD5}

_PIXELS = 3 * 32 * 32


@dataclass(frozen=True)
class _Variant:
    dataset: str              # "cifar10" / "cifar100"
    title: str                # "CIFAR-10"
    kind: str                 # "binary" / "python"
    archive: str              # archive file name
    folder: str               # top-level folder inside the archive
    train_files: tuple[str, ...]
    test_file: str
    names_file: str
    num_classes: int

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, self.test_file, self.names_file)


#: Known versions of each data set, in order of preference (the first is what --download fetches).
VARIANTS: dict[str, tuple[_Variant, ...]] = {
    "cifar10": (
        _Variant("cifar10", "CIFAR-10", "binary", "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
                 tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin", "batches.meta.txt", 10),
        _Variant("cifar10", "CIFAR-10", "python", "cifar-10-python.tar.gz", "cifar-10-batches-py",
                 tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta", 10),
    ),
    "cifar100": (
        _Variant("cifar100", "CIFAR-100", "binary", "cifar-100-binary.tar.gz", "cifar-100-binary",
                 ("train.bin",), "test.bin", "fine_label_names.txt", 100),
        _Variant("cifar100", "CIFAR-100", "python", "cifar-100-python.tar.gz", "cifar-100-python",
                 ("train",), "test", "meta", 100),
    ),
}


# --------------------------------------------------------------------------------------------- parsing

def read_binary_batch(path: Path, header: int, label_byte: int) -> tuple[np.ndarray, np.ndarray]:
    """Parse a binary CIFAR batch file into ``(images uint8 (N,3,32,32), labels int64 (N,))``.

    Args:
        path: the ``.bin`` file.
        header: label bytes before the pixels of each record (1 for CIFAR-10, 2 for CIFAR-100).
        label_byte: which of those bytes is the label (0 for CIFAR-10, 1 = fine for CIFAR-100).
    """
    record = header + _PIXELS
    data = np.fromfile(path, dtype=np.uint8)
    if data.size == 0 or data.size % record:
        raise DataError(f"{path} is truncated or corrupt: {data.size} bytes is not a whole number of "
                        f"{record}-byte records; delete its folder and extract the archive again "
                        "(or re-run with --download)")
    rows = data.reshape(-1, record)
    labels = rows[:, label_byte].astype(np.int64)
    images = np.ascontiguousarray(rows[:, header:]).reshape(-1, 3, 32, 32)
    return images, labels


def _allowed_globals() -> dict[tuple[str, str], object]:
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct
    return {
        # CIFAR pickles were written by numpy 1.x under Python 2; numpy 2 writes numpy._core.
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild numpy arrays and builtin containers, and nothing else."""

    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str):  # noqa: D102
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused global {module}.{name}") from None


def safe_unpickle(path: Path) -> object:
    """Load a CIFAR python-version pickle, refusing any global but numpy's array rebuilders.

    Raises:
        DataError: the file is unreadable, corrupt, or references anything else (e.g. ``os.system``).
    """
    try:
        with open(path, "rb") as f:
            # latin1 is numpy's recommended way to read Python 2 pickles holding arrays.
            return _RestrictedUnpickler(f, encoding="latin1").load()
    except pickle.UnpicklingError as err:
        raise DataError(f"refused to load {path}: {err}; a CIFAR pickle holds only lists, strings and "
                        "numpy arrays, so this file is corrupt or tampered with; delete it and "
                        "re-run with --download") from err
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError) as err:
        raise DataError(f"{path} is truncated or corrupt ({type(err).__name__}: {err}); delete it and "
                        "re-run with --download") from err


def _key(d: dict, name: str, path: Path):
    for k in (name, name.encode()):
        if k in d:
            return d[k]
    raise DataError(f"{path} has no {name!r} entry; it is not a CIFAR pickle; delete it and re-run with --download")


def _read_python_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    d = safe_unpickle(path)
    if not isinstance(d, dict):
        raise DataError(f"{path} does not hold a dict; it is not a CIFAR pickle; delete it and re-run with --download")
    data = _key(d, "data", path)
    labels = _key(d, label_key, path)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise DataError(f"{path}: 'data' is not a uint8 array of shape (N, {_PIXELS}); the file is corrupt; "
                        "delete it and re-run with --download")
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (data.shape[0],):
        raise DataError(f"{path}: {data.shape[0]} images but {labels.size} labels; the file is corrupt; "
                        "delete it and re-run with --download")
    return np.ascontiguousarray(data).reshape(-1, 3, 32, 32), labels


def _class_names(v: _Variant, folder: Path) -> tuple[str, ...]:
    path = folder / v.names_file
    if v.kind == "binary":
        names = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
        names = [n for n in names if n]
    else:
        meta = safe_unpickle(path)
        if not isinstance(meta, dict):
            raise DataError(f"{path} does not hold a dict; it is corrupt; delete it and re-run with --download")
        names = list(_key(meta, "label_names" if v.dataset == "cifar10" else "fine_label_names", path))
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) != v.num_classes:
        raise DataError(f"{path} lists {len(names)} class names, {v.title} has {v.num_classes}; the file is "
                        "corrupt; delete the folder and re-run with --download")
    return tuple(names)


def _read_file(v: _Variant, path: Path) -> tuple[np.ndarray, np.ndarray]:
    if v.kind == "binary":
        header = 1 if v.dataset == "cifar10" else 2
        return read_binary_batch(path, header=header, label_byte=header - 1)
    return _read_python_batch(path, "labels" if v.dataset == "cifar10" else "fine_labels")


def _to_split(parts: list[tuple[np.ndarray, np.ndarray]], v: _Variant, where: Path) -> ImageSplit:
    images = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    labels = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    if labels.size and (labels.min() < 0 or labels.max() >= v.num_classes):
        raise DataError(f"{where} holds label {int(labels.max())} but {v.title} has {v.num_classes} classes; "
                        "the files are corrupt; delete the folder and re-run with --download")
    return ImageSplit(torch.from_numpy(images), torch.from_numpy(labels))


def _parse_folder(v: _Variant, folder: Path) -> Dataset:
    missing = [f for f in v.files if not (folder / f).is_file()]
    if missing:
        raise DataError(f"{folder} is incomplete: {missing[0]} is missing; delete the folder and extract "
                        f"{v.archive} again (or re-run with --download)")
    classes = _class_names(v, folder)
    train = _to_split([_read_file(v, folder / f) for f in v.train_files], v, folder)
    test = _to_split([_read_file(v, folder / v.test_file)], v, folder)
    logger.info("read %s from %s: %d train, %d test images", v.title, folder, len(train), len(test))
    return Dataset(name=v.dataset, source=f"{v.title} (official {v.kind} archive, {folder})",
                   classes=classes, train=train, test=test)


# ------------------------------------------------------------------------------- archives and download

def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _verify(archive: Path) -> None:
    expected = MD5[archive.name]
    actual = _md5(archive)
    if actual != expected:
        raise DataError(f"{archive} has md5 {actual}, expected {expected}: the file is incomplete or "
                        "corrupt; delete it and re-run with --download")


def _safe_extractall(tar: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    # Older Pythons: refuse absolute paths, '..', links and special files ourselves.
    members = []
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if Path(m.name).is_absolute() or ".." in parts:
            raise tarfile.TarError(f"unsafe member path {m.name!r}")
        if not (m.isfile() or m.isdir()):
            raise tarfile.TarError(f"unsupported member type for {m.name!r}")
        members.append(m)
    tar.extractall(dest, members=members)  # noqa: S202 - members checked above


def _extract(archive: Path, v: _Variant) -> Path:
    """Extract ``archive`` next to itself into ``v.folder``, atomically; returns that folder."""
    data_dir = archive.parent
    dest = data_dir / v.folder
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{v.folder}.", suffix=".extracting", dir=data_dir))
    except OSError as err:
        raise DataError(f"cannot extract {archive}: {data_dir} is not writable ({err.strerror}); "
                        "choose another --data-dir") from err
    try:
        logger.info("extracting %s", archive)
        try:
            with tarfile.open(archive, "r:gz") as tar:
                _safe_extractall(tar, tmp)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise DataError(f"{archive} is corrupt, truncated or unsafe to extract ({err}); delete it and "
                            "re-run with --download") from err
        except OSError as err:
            raise DataError(f"cannot extract {archive} into {data_dir}: {err}; free some space or choose "
                            "another --data-dir") from err
        src = tmp / v.folder
        missing = [f for f in v.files if not (src / f).is_file()]
        if missing:
            raise DataError(f"{archive} does not contain {v.folder}/{missing[0]}; it is not the official "
                            f"{v.title} {v.kind} archive; delete it and re-run with --download")
        try:
            os.rename(src, dest)
        except OSError as err:
            if not dest.is_dir():  # else another process extracted it meanwhile: use theirs
                raise DataError(f"cannot move the extracted {v.folder} into {data_dir}: {err}") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _download(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest`` via a temporary file, keeping it only if its md5 is right."""
    expected = MD5[dest.name]
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create the data folder {dest.parent}: {err}; choose another --data-dir") from err
    logger.info("downloading %s to %s", url, dest)
    h = hashlib.md5()
    try:
        with atomic_path(dest) as tmp:
            try:
                with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as f:  # noqa: S310
                    while chunk := resp.read(1 << 20):
                        f.write(chunk)
                        h.update(chunk)
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError,
                    ValueError) as err:
                raise DataError(f"could not reach {url} ({err}); download it by hand and place it at {dest}, "
                                "then run again") from err
            if h.hexdigest() != expected:
                raise DataError(f"the file downloaded from {url} has md5 {h.hexdigest()}, expected {expected}; "
                                f"re-run with --download, or download it by hand and place it at {dest}")
    except OSError as err:
        raise DataError(f"cannot write {dest}: {err}; free some space or choose another --data-dir") from err
    logger.info("downloaded %s (md5 ok)", dest)


def load_cifar(name: str, data_dir: Path, download: bool = False) -> Dataset:
    """Load ``"cifar10"`` or ``"cifar100"`` from the official archives in ``data_dir``.

    Looks, in order, for an extracted folder (binary, then python version; ``data_dir`` may also be
    that folder itself), then an archive (verified against its md5 and extracted), then downloads
    the binary archive if ``download`` is true.

    Raises:
        DataError: nothing found (the message lists the places looked in), a bad md5, a corrupt file,
            or a failed download.
    """
    variants = VARIANTS[name]
    data_dir = Path(data_dir).expanduser()
    for v in variants:  # data_dir may be the extracted folder itself
        if data_dir.name == v.folder and data_dir.is_dir():
            return _parse_folder(v, data_dir)
    for v in variants:
        if (data_dir / v.folder).is_dir():
            return _parse_folder(v, data_dir / v.folder)
    for v in variants:
        archive = data_dir / v.archive
        if archive.is_file():
            _verify(archive)
            return _parse_folder(v, _extract(archive, v))
    v = variants[0]
    if download:
        archive = data_dir / v.archive
        _download(URLS[v.archive], archive)
        return _parse_folder(v, _extract(archive, v))
    places = "\n".join(f"  {data_dir / p}" for u in variants for p in (u.folder, u.archive))
    raise DataError(f"{v.title} was not found. Looked in:\n{places}\n"
                    f"pass --download to fetch {URLS[v.archive]} into {data_dir}, place one of those files "
                    "there by hand, or point --data-dir (or $ATTNCNN_DATA_DIR) at the folder that holds it")
