"""Types shared by every data source: :class:`ImageSplit`, :class:`Dataset`, :class:`DataError`."""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .._cache_dir import xdg_cache_folder
from ..errors import AttncnnError, InputError

__all__ = ["ImageSplit", "Dataset", "DataShape", "DataError", "default_data_dir"]


class DataError(AttncnnError):
    """Any problem with a data set on disk or on the network.

    The message names the file or the places looked in, and says how to fix it.
    """


@dataclass(frozen=True)
class ImageSplit:
    """One split of an image data set, held in CPU memory.

    Attributes:
        images: ``uint8`` tensor of shape ``(N, 3, H, W)``.
        labels: ``int64`` tensor of shape ``(N,)``; values index :attr:`Dataset.classes`.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise InputError(f"ImageSplit.images must be uint8 (N, C, H, W), got {self.images.dtype} "
                             f"{tuple(self.images.shape)}")
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise InputError(f"ImageSplit.labels must be int64 (N,), got {self.labels.dtype} "
                             f"{tuple(self.labels.shape)}")
        if len(self.images) != len(self.labels):
            raise InputError(f"ImageSplit has {len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Dataset:
    """A labelled image data set with a train and a test split.

    Attributes:
        name: ``"cifar10"``, ``"cifar100"``, or the folder / zip file name.
        source: human-readable description of where the pixels came from, with the local path
            (for local logs; :attr:`shareable_name` is the form for pages and reports others read).
        classes: class names; label ``k`` means ``classes[k]``.
        train, test: the two splits.
    """

    name: str
    source: str
    classes: tuple[str, ...]
    train: ImageSplit
    test: ImageSplit

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of every image."""
        return tuple(self.train.images.shape[1:])

    @property
    def shape(self) -> DataShape:
        """What the data set looks like, without its pixels."""
        return DataShape(self.name, len(self.train), len(self.test), self.num_classes, self.image_shape)

    @functools.cached_property
    def digest(self) -> str:
        """``sha256:<12 hex>`` of the class names and every decoded image and label of both splits:
        the same for the same pixels wherever the files live (about 0.3 s for CIFAR-10)."""
        h = hashlib.sha256("\0".join(self.classes).encode())
        for split in (self.train, self.test):
            for tensor in (split.images, split.labels):
                h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
        return "sha256:" + h.hexdigest()[:12]

    @property
    def shareable_name(self) -> str:
        """The data set's name and :attr:`digest`, without any local path, e.g.
        ``"cifar10-jpeg.zip (sha256:1a2b3c4d5e6f)"``: what pages and reports meant for sharing show."""
        return f"{self.name} ({self.digest})"


@dataclass(frozen=True)
class DataShape:
    """A data set's sizes without its pixels (:func:`attncnn.data.peek_dataset`): what a network
    is built for and a run's length is computed from.

    Attributes:
        name: as :attr:`Dataset.name`.
        train, test: number of images in each split.
        num_classes: number of classes.
        image_shape: ``(C, H, W)`` of the images (C is 3: images are read as RGB).
    """

    name: str
    train: int
    test: int
    num_classes: int
    image_shape: tuple[int, int, int]

    def describe(self) -> str:
        """E.g. ``"cifar10: 50,000 training and 10,000 test images of 32x32, 10 classes"``."""
        _, height, width = self.image_shape
        return (f"{self.name}: {self.train:,} training and {self.test:,} test images of {height}x{width}, "
                f"{self.num_classes} classes")


def default_data_dir() -> Path:
    """Folder for downloaded archives and decoded caches.

    ``$ATTNCNN_DATA_DIR`` if set, else ``$XDG_CACHE_HOME/attncnn``, else ``~/.cache/attncnn``
    (:func:`attncnn._cache_dir.xdg_cache_folder`).
    """
    env = os.environ.get("ATTNCNN_DATA_DIR")
    return Path(env).expanduser() if env else xdg_cache_folder()
