"""Cache of decoded image arrays, so that a folder or zip is decoded only once.

A data set decoded from ``<path>`` is stored in ``<data_dir>/decoded/<name>-<key>.safetensors``
(tensors ``train_images``, ``train_labels``, ``test_images``, ``test_labels``; the class names in
the metadata). The key hashes the resolved path with, for a zip, its size and modification time,
and for a folder, the files the loader reads (:func:`~attncnn.data.folder.folder_files`) with
their sizes, modification times and link targets, so any change to the data makes a new key.
Files are written atomically; an unreadable cache file is rebuilt (with a warning), and one that
cannot be written only costs speed.

The last cache file read is also kept in memory (nothing writes into the loaded tensors), until
another cache file is read or the caller lets it go with :func:`forget_cached_dataset`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from .._io import atomic_path
from .base import ImageSplit
from .folder import folder_files

__all__ = ["CACHE_VERSION", "cache_key", "cache_file", "read_cache", "write_cache", "forget_cached_dataset"]

logger = logging.getLogger(__name__)

#: Bumped whenever the decoding changes, so that old caches are not reused.
CACHE_VERSION = "1"
_TENSORS = ("train_images", "train_labels", "test_images", "test_labels")


def cache_key(path: str | os.PathLike[str]) -> str:
    """``<path digest>-<contents digest>`` for a folder or file (cheap: file stats only, no reading).

    Raises:
        DataError: as :func:`~attncnn.data.folder.folder_files` (a folder that cannot be listed, a
            link loop or a dangling class-folder link).
        OSError: a file cannot be stat'ed.
    """
    path = Path(path).resolve()
    where = hashlib.sha256(f"{path}".encode()).hexdigest()[:8]
    h = hashlib.sha256(f"attncnn-decoded-v{CACHE_VERSION}\0".encode())
    if path.is_dir():
        entries = []
        real_folders: dict[str, str] = {}          # one realpath per folder, not per file (60,000 for CIFAR)
        for rel in folder_files(path):
            full = os.path.join(path, rel.replace("/", os.sep))
            folder, name = os.path.split(full)
            if folder not in real_folders:
                real_folders[folder] = os.path.realpath(folder)
            real = os.path.join(real_folders[folder], name)
            st = os.lstat(real)
            if stat.S_ISLNK(st.st_mode):            # a linked file: its target's own size and time
                real = os.path.realpath(real)
                st = os.stat(real)
            entry = f"{rel.replace('/', os.sep)}\0{st.st_size}\0{st.st_mtime_ns}"
            # the real path only where a link leads elsewhere, so the keys of folders without links stay
            entries.append(entry if real == full else f"{entry}\0{real}")
        h.update("\n".join(sorted(entries)).encode())
    else:
        st = path.stat()
        h.update(f"{st.st_size}\0{st.st_mtime_ns}".encode())
    return f"{where}-{h.hexdigest()[:24]}"


def cache_file(data_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Where the decoded arrays of ``path`` are cached under ``data_dir``."""
    path = Path(path)
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", path.resolve().name) or "data"
    return Path(data_dir) / "decoded" / f"{stem}-{cache_key(path)}.safetensors"


#: ``(file, size, modification time)`` of the last cache file read in this process, and what it held
_LAST_READ: tuple[tuple[str, int, int], tuple[tuple[str, ...], ImageSplit, ImageSplit]] | None = None


def read_cache(file: str | os.PathLike[str]) -> tuple[tuple[str, ...], ImageSplit, ImageSplit] | None:
    """``(classes, train, test)`` from a cache file; ``None`` if it is missing or unusable. The same
    file, unchanged since the last call, gives the same tensors again without reading it (module
    docstring)."""
    global _LAST_READ
    file = Path(file)
    if not file.is_file():
        return None
    st = file.stat()
    stamp = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    if _LAST_READ is not None and _LAST_READ[0] == stamp:
        logger.debug("decoded images of %s already loaded", file)
        return _LAST_READ[1]
    try:
        with safe_open(str(file), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("version") != CACHE_VERSION:
                raise ValueError(f"cache version {meta.get('version')!r}, expected {CACHE_VERSION!r}")
            classes = json.loads(meta["classes"])
            # at least two classes, as the loader demands (a cache written before it refused one is not used)
            if not (isinstance(classes, list) and len(classes) >= 2 and all(isinstance(c, str) for c in classes)):
                raise ValueError("bad class list")
            t = {k: f.get_tensor(k) for k in _TENSORS}
        splits = []
        for s in ("train", "test"):
            images, labels = t[f"{s}_images"], t[f"{s}_labels"]
            if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= len(classes)):
                raise ValueError("label out of range")
            splits.append(ImageSplit(images, labels))  # checks dtypes and shapes
        if splits[0].images.shape[1:] != splits[1].images.shape[1:]:
            raise ValueError("train and test image shapes differ")
    except Exception as err:  # noqa: BLE001 - any unreadable cache is simply rebuilt
        logger.warning("ignoring unreadable cache file %s (%s: %s); decoding the images again",
                       file, type(err).__name__, err)
        return None
    logger.info("loaded decoded images from cache %s", file)
    _LAST_READ = (stamp, (tuple(classes), splits[0], splits[1]))
    return _LAST_READ[1]


def forget_cached_dataset() -> None:
    """Drop this process's in-memory copy of the last decoded data set read (module docstring), so
    that its memory is freed once the caller holds no tensor of it. The next load reads the cache
    file again (fast: no decoding). Never raises."""
    global _LAST_READ
    _LAST_READ = None


def write_cache(file: str | os.PathLike[str], classes: tuple[str, ...], train: ImageSplit, test: ImageSplit,
                source: str = "") -> bool:
    """Store decoded arrays atomically; returns False (after a warning) if the folder is not writable.

    Older cache files of the same data (same path, different contents) are removed.
    """
    file = Path(file)
    tensors = {"train_images": train.images.contiguous(), "train_labels": train.labels.contiguous(),
               "test_images": test.images.contiguous(), "test_labels": test.labels.contiguous()}
    meta = {"version": CACHE_VERSION, "classes": json.dumps(list(classes)), "source": source}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(file, suffix=".safetensors") as tmp:
            save_file(tensors, str(tmp), metadata=meta)
    except Exception as err:  # noqa: BLE001 - the cache is an optimisation only
        logger.warning("could not write the decoded-image cache %s (%s); continuing without it", file, err)
        return False
    # Drop caches of earlier contents of the same path: same "<name>-<path digest>-" prefix.
    prefix = file.name[: -len(".safetensors") - 24]
    pattern = re.compile(re.escape(prefix) + r"[0-9a-f]{24}\.safetensors")
    for old in file.parent.iterdir():
        if old != file and pattern.fullmatch(old.name):
            try:
                old.unlink()
            except OSError:
                pass
    logger.info("cached decoded images in %s", file)
    return True
