"""A trained network that takes ordinary images: :class:`Classifier` and :func:`load_model`.

Training feeds every network images normalised with the CIFAR-10 mean and std
(:data:`attncnn.data.CIFAR_MEAN` / ``CIFAR_STD``), whatever the data set; a bare network fed images
in ``[0, 1]`` silently gives wrong predictions. :class:`Classifier` wraps
a network with that normalisation and the class names, so that ``model(images)`` takes images in
``[0, 1]`` (or uint8) of the training size and refuses anything else (a network run on another
size answers with an accuracy far below its own; ``resize=True`` resizes);
the bare network stays available as ``model.network``.
"""

from __future__ import annotations

import os
from pathlib import Path
from numbers import Integral
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..analysis.runs import run_label
from ..data import CIFAR_MEAN, CIFAR_STD
from ..errors import InputError
from ..runs import is_data_name
from ..runs import load_model as _load_network
from ..runs.loading import checkpoint_of

__all__ = ["Classifier", "load_model", "training_image_size"]

#: how far outside [0, 1] a float image may stray (rounding of a resize or a colour conversion)
_RANGE_SLACK = 1e-3
#: ``resize=`` modes: torch.nn.functional.interpolate's, antialiased where it can be
_RESIZE_MODES = ("bilinear", "bicubic", "area", "nearest")
#: descriptions attncnn.data gives an image folder or zip only when its images are 32x32 CIFAR-10
_CIFAR_NOTES = ("(CIFAR-10 JPEG mirror;", "(CIFAR-10 classes)")
#: images per forward pass of Classifier.logits/probabilities/predict and attncnn.attention_maps
DEFAULT_BATCH_SIZE = 50


def check_batch_size(batch_size) -> int:
    """``batch_size`` (images per forward pass) as an int, for every batched call of the API.

    Raises:
        InputError: not a positive integer (a bool, a float or a value below 1).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer (images per forward pass), got {batch_size!r}")
    return int(batch_size)


def _check_range(values: torch.Tensor) -> None:
    """Refuse float images that are not finite or not in ``[0, 1]`` (with :data:`_RANGE_SLACK`),
    naming what they look like and the fix (see :meth:`Classifier.preprocess`)."""
    if not torch.isfinite(values).all():
        raise InputError(f"images must be finite: {int((~torch.isfinite(values)).sum())} values are NaN or "
                         "infinite; find where they came from (a division by zero, an empty crop)")
    low, high = (float(v) for v in torch.aminmax(values))
    if low < -_RANGE_SLACK or high > 1 + _RANGE_SLACK:
        if high > 2 and low >= 0:
            hint = "divide by 255 or pass uint8"
        elif low > -0.25 and high < 1.25:
            hint = "resampling overshoots [0, 1] a little (bicubic): clamp them, images.clamp(0, 1)"
        else:
            hint = "they look normalised already: give them to model.network, which takes normalised images"
        raise InputError(f"images must be in [0, 1] (or uint8 in 0..255), got values in [{low:.3g}, "
                         f"{high:.3g}]; {hint}")


def training_image_size(metadata: dict) -> tuple[int, int] | None:
    """``(height, width)`` in pixels of the images a checkpoint's network was trained on.

    From the checkpoint's ``image_size``, else (older checkpoints) 32x32 for CIFAR-10/100 and image
    folders attncnn described as CIFAR-10; None where the metadata does not say.
    """
    stored = metadata.get("image_size")
    if (isinstance(stored, (list, tuple)) and len(stored) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in stored)):
        return int(stored[0]), int(stored[1])
    config = metadata.get("config")
    data = config.get("data") if isinstance(config, dict) else None
    described = metadata.get("dataset")
    if (isinstance(data, str) and is_data_name(data)) or (
            isinstance(described, str) and any(note in described for note in _CIFAR_NOTES)):
        return 32, 32
    return None


def _size(size: Sequence[int] | int) -> tuple[int, int]:
    """``(height, width)`` of an ``image_size`` argument (one side means a square)."""
    sides = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, Sequence) else ()
    if len(sides) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sides):
        raise InputError(f"image_size must be positive (height, width) pixels or one side, got {size!r}")
    return sides[0], sides[1]


class Classifier(nn.Module):
    """A trained network with its input normalisation and class names: ``model(images)`` normalises
    ``images`` as training did and returns the network's logits; ``model.network`` takes normalised images.

    Args:
        network: an image classifier taking normalised images ``(B, C, H, W)``, e.g. from
            :func:`attncnn.build_model` or :func:`attncnn.runs.load_model`.
        classes: class names in label order (default: ``"0"``, ``"1"``, ... from the network's
            output size when it is known).
        mean, std: per-channel normalisation the network was trained with (attncnn's training
            uses the CIFAR-10 values for every data set).
        metadata: the checkpoint's metadata (``config``, ``epoch``, ``dataset_name``, ...).
        source: the checkpoint file the weights came from, if any.
        image_size: ``(height, width)`` (or one side) in pixels of the training images; images of
            another size are refused unless resized (:meth:`preprocess`). Default: from ``metadata``
            (:func:`training_image_size`), else unchecked.

    Attributes:
        network, classes, metadata, source: as given.
        image_size: the training size ``(height, width)``, or None (any size is passed on).

    Raises:
        InputError: ``mean`` and ``std`` of different lengths, or an ``image_size`` that is not
            positive pixels.
    """

    def __init__(self, network: nn.Module, *, classes: Sequence[str] | None = None,
                 mean: Sequence[float] = CIFAR_MEAN, std: Sequence[float] = CIFAR_STD,
                 metadata: dict | None = None, source: str | os.PathLike | None = None,
                 image_size: Sequence[int] | int | None = None) -> None:
        super().__init__()
        if len(mean) != len(std):
            raise InputError(f"mean and std need one value per channel each, got {len(mean)} and {len(std)}")
        self.network = network
        self.metadata = dict(metadata or {})
        self.image_size = _size(image_size) if image_size is not None else training_image_size(self.metadata)
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
        return run_label(self.metadata) or (self.source.name if self.source is not None else "model")

    def preprocess(self, images, *, resize: bool | str = False) -> torch.Tensor:
        """Normalise images as training did; the input of ``model.network``.

        Args:
            images: ``(B, C, H, W)`` or one image ``(C, H, W)``, a tensor or NumPy array, float
                in ``[0, 1]`` or uint8 in ``0..255``, on any device; ``H x W`` the training size
                (:attr:`image_size`) unless ``resize`` is given.
            resize: False (the default) refuses images of another size than :attr:`image_size`;
                True (``"bilinear"``) or a mode of :func:`torch.nn.functional.interpolate`
                (``"bicubic"``, ``"area"``, ``"nearest"``; antialiased where it can be) resizes them.

        Returns:
            ``(B, C, *image_size)`` normalised images on the network's device and in its dtype.

        Raises:
            InputError: another rank or channel count, a dtype other than float or uint8, float values
                that are not finite or outside ``[0, 1]`` (already normalised, or 0..255 stored as
                float), images of another size than the training size
                without ``resize`` (the message names both sizes and the fix), or ``resize`` where the
                training size is unknown or an unknown mode.
        """
        mode = self._resize_mode(resize)
        return self._normalised(self._checked(images, mode), mode)

    def _checked(self, images, mode: str | None) -> torch.Tensor:
        """``images`` as a ``(B, C, H, W)`` tensor, as given, after every check of :meth:`preprocess`
        (whose errors it raises); allocates no float copy."""
        if isinstance(images, np.ndarray) and images.dtype != np.uint8 and images.dtype.kind != "f":
            # torch converts neither object nor text arrays (a TypeError of its own): say what to pass
            raise InputError(f"images must be float in [0, 1] or uint8 in 0..255, got a NumPy array of dtype "
                             f"{images.dtype}; convert it first: np.asarray(images, dtype=np.float32) for values in "
                             "[0, 1], dtype=np.uint8 for 0..255 (np.stack(list_of_images) for an array of arrays)")
        x = torch.as_tensor(images) if isinstance(images, np.ndarray) else images
        if not isinstance(x, torch.Tensor):
            raise InputError(f"images must be a tensor or NumPy array (B, C, H, W), got {type(images).__name__}")
        if x.dim() == 3:
            x = x.unsqueeze(0)
        channels = self.mean.shape[1]
        if x.dim() != 4 or x.shape[1] != channels:
            hint = ("; channels last? images.permute(0, 3, 1, 2) puts them first"
                    if x.dim() == 4 and x.shape[-1] == channels else "")
            raise InputError(f"images must be (B, {channels}, H, W) or ({channels}, H, W), channels first, "
                             f"got shape {tuple(x.shape)}{hint}")
        if x.dtype != torch.uint8 and not x.dtype.is_floating_point:
            raise InputError(f"images must be float in [0, 1] or uint8 in 0..255, got {x.dtype}")
        if x.dtype != torch.uint8 and x.numel():
            _check_range(x.detach())                  # the checks only: gradients still reach the images
        size = tuple(x.shape[-2:])
        if self.image_size is not None and size != self.image_size and mode is None:
            h, w = self.image_size
            raise InputError(
                f"{self.name} was trained on {h}x{w} images (height x width), got {size[0]}x{size[1]}; its "
                f"answers for another size are unreliable. Resize them to {h}x{w} first, or pass "
                f"resize=True (model(images, resize=True), model.predict(images, resize=True), "
                f"attncnn.attention_maps(model, images, resize=True)) to have them resized with "
                f"torch.nn.functional.interpolate")
        return x

    def _normalised(self, x: torch.Tensor, mode: str | None) -> torch.Tensor:
        """Checked images ``(B, C, H, W)`` -> the network's input: on its device, resized with ``mode``
        where needed, normalised, in its dtype."""
        if x.dtype == torch.uint8:
            x = x.float() / 255
        param = next(self.network.parameters())
        x = x.to(device=param.device, dtype=torch.float32)
        if self.image_size is not None and tuple(x.shape[-2:]) != self.image_size:
            x = F.interpolate(x, size=self.image_size, mode=mode,
                              antialias=mode in ("bilinear", "bicubic")).clamp_(0, 1)    # bicubic overshoots
        return ((x - self.mean.to(x.device)) / self.std.to(x.device)).to(param.dtype)

    def _resize_mode(self, resize: bool | str) -> str | None:
        """The interpolation mode ``resize`` asks for, None for none (see :meth:`preprocess`)."""
        if resize is False or resize is None:
            return None
        mode = "bilinear" if resize is True else resize
        if mode not in _RESIZE_MODES:
            raise InputError(f"resize must be False, True or one of {', '.join(_RESIZE_MODES)}, got {resize!r}")
        if self.image_size is None:
            raise InputError(f"{self.name}: the size of its training images is not known (its checkpoint does not "
                             "record it), so there is nothing to resize to: resize the images yourself, or give "
                             "Classifier(..., image_size=(height, width))")
        return mode

    def forward(self, images, *, resize: bool | str = False) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of images in ``[0, 1]`` of the training size, or of any size
        with ``resize`` (see :meth:`preprocess`, whose errors it raises)."""
        return self.network(self.preprocess(images, resize=resize))

    @torch.no_grad()
    def logits(self, images, *, resize: bool | str = False, batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of many images, ``batch_size`` at a time, without gradients.

        Memory does not grow with ``B`` beyond the images and the result. The network runs in eval
        mode (its mode restored after), so the logits equal ``model(images)`` in eval mode up to
        float rounding, whatever ``batch_size``.

        Args:
            images, resize: as :meth:`preprocess`.
            batch_size: images per forward pass, a positive integer (default 50, as
                :func:`attncnn.attention_maps`).

        Returns:
            ``(B, num_classes)`` logits on the network's device, in its dtype.

        Raises:
            InputError: as :meth:`preprocess` (all images are checked before the first pass), or a
                ``batch_size`` that is not a positive integer.
        """
        return torch.cat(list(self._batch_logits(images, resize, batch_size)))

    def _batch_logits(self, images, resize: bool | str, batch_size: int) -> Iterator[torch.Tensor]:
        """The logits of each batch of ``batch_size`` images in turn (see :meth:`logits`)."""
        batch_size = check_batch_size(batch_size)
        mode = self._resize_mode(resize)
        x = self._checked(images, mode)
        was_training = self.network.training
        self.network.eval()
        try:
            # no images: one empty pass, for a (0, num_classes) result as model(images) gives
            for start in range(0, max(x.shape[0], 1), batch_size):
                yield self.network(self._normalised(x[start:start + batch_size], mode))
        finally:
            self.network.train(was_training)

    @torch.no_grad()
    def probabilities(self, images, *, resize: bool | str = False,
                      batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
        """Class probabilities ``(B, num_classes)`` (softmax of :meth:`logits`, rows sum to 1), in
        float32 at least (float64 for a float64 network), on the network's device; batched as
        :meth:`logits`, whose arguments and errors it has."""
        return torch.cat([torch.softmax(logits, dim=1, dtype=torch.promote_types(logits.dtype, torch.float32))
                          for logits in self._batch_logits(images, resize, batch_size)])

    @torch.no_grad()
    def predict(self, images, *, resize: bool | str = False, batch_size: int = DEFAULT_BATCH_SIZE) -> list[str]:
        """The most likely class name of each image (``B`` names, in order), batched as :meth:`logits`.

        Raises:
            InputError: as :meth:`preprocess`, or a ``batch_size`` that is not a positive integer.
        """
        labels = [i for logits in self._batch_logits(images, resize, batch_size)
                  for i in logits.argmax(dim=1).tolist()]
        return [self.classes[i] if self.classes else str(i) for i in labels]

    def extra_repr(self) -> str:
        size = f"{self.image_size[0]}x{self.image_size[1]}" if self.image_size else "any"
        return f"name={self.name!r}, classes={len(self.classes) if self.classes else '?'}, image_size={size}"


def load_model(path: str | os.PathLike, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, checkpoint: str | None = None) -> Classifier:
    """A trained model from a run folder or checkpoint, ready for images in ``[0, 1]``: the network of
    :func:`attncnn.runs.load_model` in a :class:`Classifier`.

    Args:
        path: a run folder (its ``last`` checkpoint) or a ``.safetensors`` checkpoint written by
            ``attncnn train``.
        device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: floating dtype of the weights (float32 by default; float64 for exact checks).
            For bfloat16 inference keep float32 weights and use :func:`torch.autocast`.
        checkpoint: another checkpoint of a run folder: ``"best"`` (highest test accuracy),
            ``"epoch_0010"``...; ``model.source`` names the file taken.

    Returns:
        A :class:`Classifier` in eval mode: ``model(images)`` gives logits ``(B, classes)``,
        ``model.predict(images)`` class names, ``model.network`` the bare network;
        ``model.image_size`` is the training images' size, which ``model(images)`` requires unless
        asked to resize.

    Raises:
        FileNotFoundError: no checkpoint at ``path`` (or no ``checkpoint`` of that name in it).
        attncnn.runs.CheckpointError: not a safe attncnn checkpoint, or corrupt.
        InputError: a stored configuration or weights that do not fit, a non-floating ``dtype``, or
            ``checkpoint`` given with a checkpoint file.
    """
    if not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating dtype such as torch.float32, got {dtype}")
    source = checkpoint_of(path, checkpoint)
    network, meta = _load_network(path, device, checkpoint)      # a folder: logs the checkpoint taken
    network = network.to(dtype=dtype).eval()
    return Classifier(network, classes=meta.get("classes"), metadata=meta, source=source).to(device).eval()
