"""A trained network that takes ordinary images: :class:`Classifier` and :func:`load_model`.

Every attncnn training run feeds its network images normalised per channel with the CIFAR-10
mean and std (``(x / 255 - mean) / std``, :data:`attncnn.data.CIFAR_MEAN` / ``CIFAR_STD``),
whatever the data set. A bare network from a checkpoint does not know that, and an image in
``[0, 1]`` runs through it silently into wrong predictions. :class:`Classifier` wraps the network
with that normalisation and the class names, so that ``model(images)`` takes images in ``[0, 1]``
(or uint8 in ``0..255``) and refuses anything else. The training loop is untouched: it still
feeds normalised batches to the bare network, which stays available as ``model.network``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..data import CIFAR_MEAN, CIFAR_STD
from ..training import load_model as _load_network
from ..training.loading import checkpoint_of

__all__ = ["Classifier", "load_model"]

#: how far outside [0, 1] a float image may stray (rounding of a resize or a colour conversion)
_RANGE_SLACK = 1e-3


class Classifier(nn.Module):
    """A trained network with its input normalisation and class names.

    ``model(images)`` normalises ``images`` exactly as training did and returns the network's
    logits. The wrapped network is ``model.network`` (it takes normalised images).

    Args:
        network: an image classifier taking normalised images ``(B, C, H, W)``, e.g. from
            :func:`attncnn.build_model` or :func:`attncnn.training.load_model`.
        classes: class names in label order (default: ``"0"``, ``"1"``, ... from the network's
            output size when it is known).
        mean, std: per-channel normalisation the network was trained with (attncnn's training
            uses the CIFAR-10 values for every data set).
        metadata: the checkpoint's metadata (``config``, ``epoch``, ``dataset_name``, ...).
        source: the checkpoint file the weights came from, if any.

    Attributes:
        network, classes, metadata, source: as given.
    """

    def __init__(self, network: nn.Module, *, classes: Sequence[str] | None = None,
                 mean: Sequence[float] = CIFAR_MEAN, std: Sequence[float] = CIFAR_STD,
                 metadata: dict | None = None, source: str | os.PathLike | None = None) -> None:
        super().__init__()
        if len(mean) != len(std):
            raise ValueError(f"mean and std need one value per channel each, got {len(mean)} and {len(std)}")
        self.network = network
        self.metadata = dict(metadata or {})
        self.source = None if source is None else Path(source)
        outputs = getattr(getattr(network, "config", None), "num_classes", None)
        self.classes = tuple(classes) if classes is not None else (
            tuple(str(i) for i in range(outputs)) if outputs else None)
        # not saved in state_dict: the network's weights alone stay the checkpoint format
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    @property
    def name(self) -> str:
        """``"<preset> seed <seed>"`` of the run that trained it (e.g. ``"quadratic-mini seed 0"``),
        else the checkpoint's file name, else ``"model"``."""
        config = self.metadata.get("config")
        if isinstance(config, dict) and "preset" in config:
            return f"{config['preset']} seed {config.get('seed', '?')}"
        return self.source.name if self.source is not None else "model"

    def _parameter(self) -> torch.Tensor:
        return next(self.network.parameters())

    def preprocess(self, images) -> torch.Tensor:
        """Normalise images as training did; the input of ``model.network``.

        Args:
            images: ``(B, C, H, W)`` or one image ``(C, H, W)``, a tensor or NumPy array, float
                in ``[0, 1]`` or uint8 in ``0..255``, on any device.

        Returns:
            ``(B, C, H, W)`` normalised images on the network's device and in its dtype.

        Raises:
            ValueError: another rank or channel count, an integer type other than uint8, or
                float values outside ``[0, 1]`` (already normalised, or 0..255 stored as float).
        """
        x = torch.as_tensor(images) if isinstance(images, np.ndarray) else images
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"images must be a tensor or NumPy array (B, C, H, W), got {type(images).__name__}")
        if x.dim() == 3:
            x = x.unsqueeze(0)
        channels = self.mean.shape[1]
        if x.dim() != 4 or x.shape[1] != channels:
            raise ValueError(f"images must be (B, {channels}, H, W) or ({channels}, H, W), channels first, "
                             f"got shape {tuple(x.shape)}")
        if x.dtype == torch.uint8:
            x = x.float() / 255
        elif not x.dtype.is_floating_point:
            raise ValueError(f"images must be float in [0, 1] or uint8 in 0..255, got {x.dtype}")
        elif x.numel():
            low, high = float(x.min()), float(x.max())
            if low < -_RANGE_SLACK or high > 1 + _RANGE_SLACK:
                hint = ("divide by 255 or pass uint8" if high > 2 and low >= 0 else
                        "they look normalised already: give them to model.network, which takes normalised images")
                raise ValueError(f"images must be in [0, 1] (or uint8 in 0..255), got values in [{low:.3g}, "
                                 f"{high:.3g}]; {hint}")
        param = self._parameter()
        x = x.to(device=param.device, dtype=torch.float32)
        return ((x - self.mean.to(x.device)) / self.std.to(x.device)).to(param.dtype)

    def forward(self, images) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of images in ``[0, 1]`` (see :meth:`preprocess`)."""
        return self.network(self.preprocess(images))

    @torch.no_grad()
    def predict(self, images) -> list[str]:
        """The most likely class name of each image (in ``[0, 1]``, see :meth:`preprocess`).

        Raises:
            ValueError: as :meth:`preprocess`.
        """
        labels = self(images).argmax(dim=1).tolist()
        return [self.classes[i] if self.classes else str(i) for i in labels]

    def extra_repr(self) -> str:
        return f"name={self.name!r}, classes={len(self.classes) if self.classes else '?'}"


def load_model(path: str | os.PathLike, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> Classifier:
    """A trained model from a run folder or checkpoint, ready for images in ``[0, 1]``.

    Loads through :func:`attncnn.training.load_model` (safetensors only, the stored configuration
    checked on the meta device before anything is allocated, the tensors' digest verified), then
    wraps the network in a :class:`Classifier` that knows its input normalisation and class names.

    Args:
        path: a run folder (its ``best`` checkpoint, else ``last``) or a ``.safetensors`` checkpoint
            written by ``attncnn train``.
        device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: floating dtype of the weights (float32 by default; float64 for exact checks).
            For bfloat16 inference keep float32 weights and use :func:`torch.autocast`.

    Returns:
        A :class:`Classifier` in eval mode: ``model(images)`` gives logits ``(B, classes)``,
        ``model.predict(images)`` class names, ``model.network`` the bare network.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        attncnn.training.CheckpointError: not a safe attncnn checkpoint, or corrupt.
        ValueError: a stored configuration or weights that do not fit, or a non-floating ``dtype``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype such as torch.float32, got {dtype}")
    source = checkpoint_of(path)
    network, meta = _load_network(source, device)
    network = network.to(dtype=dtype).eval()
    return Classifier(network, classes=meta.get("classes"), metadata=meta, source=source).to(device).eval()
