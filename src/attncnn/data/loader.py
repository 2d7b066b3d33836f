"""Device-resident batches: the whole split lives on the device as uint8, augmentation is batched.

:class:`DeviceLoader` moves a split to the device once and per batch does one ``index_select``,
one batched random crop + horizontal flip (:func:`random_crop_flip`) and one normalisation.
Augmentation follows the reference CIFAR recipe (``RandomCrop(32, padding=4)``,
``RandomHorizontalFlip()``, then ``Normalize(mean, std)``: zero padding before normalisation).
CutMix (:mod:`.cutmix`), off unless asked for, mixes a batch after its crop and flip, before
normalisation; its labels
are then ``(B, classes)`` float32 targets.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from ..errors import InputError
from .base import ImageSplit
from .cutmix import apply_cutmix, check_cutmix, draw_boxes

__all__ = ["CIFAR_MEAN", "CIFAR_STD", "DeviceLoader", "random_crop_flip", "epoch_generator"]

#: Per-channel mean and std of the CIFAR-10 training images, as used by the paper's reference code.
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)


def random_crop_flip(images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, padding: int) -> torch.Tensor:
    """Batched zero-padded crop and horizontal flip, with the random choices given explicitly.

    Output image ``b`` equals ``pad(images[b], padding)[:, dy:dy+H, dx:dx+W]`` with
    ``(dy, dx) = offsets[b]``, mirrored left-right when ``flips[b]`` is true.

    Args:
        images: ``(B, C, H, W)`` tensor (uint8 in the loader; any dtype works), on any device.
        offsets: ``(B, 2)`` integer tensor of ``(dy, dx)``, each in ``[0, 2 * padding]``.
        flips: ``(B,)`` bool tensor.
        padding: zero padding added on every side before cropping.

    Returns:
        ``(B, C, H, W)`` tensor of the same dtype and device.
    """
    b, c, h, w = images.shape
    dev = images.device
    if padding:
        images = F.pad(images, (padding, padding, padding, padding), value=0)
    offsets = offsets.to(device=dev, dtype=torch.long)
    flips = flips.to(device=dev, dtype=torch.bool)
    rows = offsets[:, 0:1] + torch.arange(h, device=dev)                   # (B, H)
    cols = offsets[:, 1:2] + torch.arange(w, device=dev)                   # (B, W)
    cols = torch.where(flips[:, None], cols.flip(1), cols)                 # mirror = read columns backwards
    wp = images.shape[3]
    out = images.gather(2, rows[:, None, :, None].expand(b, c, h, wp))     # (B, C, H, Wp)
    return out.gather(3, cols[:, None, None, :].expand(b, c, h, w))        # (B, C, H, W)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """CPU generator whose state is a pure function of ``(seed, epoch)``."""
    digest = hashlib.sha256(f"attncnn-loader\0{int(seed)}\0{int(epoch)}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


class DeviceLoader:
    """Whole split resident on ``device`` as uint8; yields normalised float batches.

    Args:
        split: the images (uint8 ``(N, C, H, W)``) and labels.
        batch_size: examples per batch *for this rank*.
        device: where the split and the batches live.
        train: shuffle and augment (random crop with ``crop_padding`` zero padding, and horizontal
            flip if ``flip``); otherwise the split is read in order without augmentation.
        seed: with the epoch set by :meth:`set_epoch`, fixes the order and the augmentation (a pure
            function of ``(seed, epoch)``, identical on every rank).
        mean, std: per-channel normalisation ``x = (uint8 / 255 - mean) / std``.
        drop_last: drop the final partial batch (default: keep it).
        rank, world_size: distributed sharding. In training the shared permutation is truncated to a
            multiple of ``world_size`` (so all ranks take the same number of steps) and rank ``r`` takes
            ``perm[r::world_size]``; in evaluation rank
            ``r`` takes examples ``r, r + world_size, ...`` (ranks may differ by one example).
        dtype: floating dtype of the yielded images.
        cutmix: probability that a training batch is mixed by CutMix (:mod:`.cutmix`; default 0). Above
            0 every training batch's labels are ``(B, num_classes)`` float32 targets (one-hot for an
            unmixed batch, so that a step's loss has one form).
        cutmix_alpha: CutMix's Beta parameter.
        num_classes: the number of classes; needed with ``cutmix`` (the width of the targets).

    Raises:
        InputError: a bad batch size, rank, padding, mean/std, dtype or CutMix setting (named).
    """

    def __init__(self, split: ImageSplit, *, batch_size: int, device: str | torch.device = "cpu", train: bool,
                 seed: int = 0, mean: Sequence[float] = CIFAR_MEAN, std: Sequence[float] = CIFAR_STD,
                 crop_padding: int = 4, flip: bool = True, drop_last: bool = False, rank: int = 0,
                 world_size: int = 1, dtype: torch.dtype = torch.float32, cutmix: float = 0.0,
                 cutmix_alpha: float = 1.0, num_classes: int | None = None) -> None:
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise InputError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if crop_padding < 0:
            raise InputError(f"crop_padding must be >= 0, got {crop_padding}")
        images, labels = split.images, split.labels
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise InputError(f"DeviceLoader needs uint8 images (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        channels = images.shape[1]
        if len(mean) != channels or len(std) != channels:
            raise InputError(f"mean and std need {channels} values (one per channel), got {len(mean)} and {len(std)}")
        if any(s <= 0 for s in std):
            raise InputError(f"std must be positive, got {tuple(std)}")
        if not dtype.is_floating_point:
            raise InputError(f"dtype must be a floating type, got {dtype}")
        check_cutmix(cutmix, cutmix_alpha)
        if cutmix > 0 and not (isinstance(num_classes, int) and num_classes >= 2):
            raise InputError(f"CutMix needs the number of classes (num_classes >= 2), got {num_classes!r}")
        self.device = torch.device(device)
        self.images = images.to(self.device)
        self.labels = labels.to(device=self.device, dtype=torch.long)
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.seed = int(seed)
        self.crop_padding = int(crop_padding)
        self.flip = bool(flip)
        self.drop_last = bool(drop_last)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.dtype = dtype
        self.cutmix = float(cutmix)
        self.cutmix_alpha = float(cutmix_alpha)
        self.num_classes = num_classes
        self._mean = torch.tensor(mean, dtype=dtype, device=self.device).view(1, -1, 1, 1)
        self._std = torch.tensor(std, dtype=dtype, device=self.device).view(1, -1, 1, 1)
        self.epoch = 0

    # ------------------------------------------------------------------------------------ bookkeeping
    @property
    def num_examples(self) -> int:
        """Examples this rank sees per epoch (before ``drop_last``)."""
        n = len(self.labels)
        if self.train:
            return n // self.world_size
        return len(range(self.rank, n, self.world_size))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order and augmentation the next iteration yields."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n = self.num_examples
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    # ------------------------------------------------------------------------------------ iteration
    def _plan(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """This rank's example indices for the epoch, and per-example crop offsets and flips."""
        n = len(self.labels)
        if not self.train:
            return torch.arange(self.rank, n, self.world_size, device=self.device), None, None
        g = epoch_generator(self.seed, self.epoch)
        perm = torch.randperm(n, generator=g)
        # Augmentation is drawn per example (indexed by example id), so it does not depend on sharding.
        offsets = torch.randint(0, 2 * self.crop_padding + 1, (n, 2), generator=g)
        flips = torch.rand(n, generator=g) < 0.5
        if not self.flip:
            flips.zero_()
        perm = perm[: n - n % self.world_size][self.rank::self.world_size]
        return perm.to(self.device), offsets.to(self.device), flips.to(self.device)

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype).div_(255).sub_(self._mean).div_(self._std)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.iter_from(0)

    def iter_from(self, start_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches from batch ``start_step`` (0-based) on: exactly those that
        ``iter(self)`` yields from that point. Skipped batches cost nothing (no gather, no
        augmentation), so a run resumed in the middle of an epoch starts at once.

        Raises:
            InputError: ``start_step`` outside ``[0, len(self)]``.
        """
        if not 0 <= start_step <= len(self):
            raise InputError(f"start_step must be in [0, {len(self)}] (the batches of an epoch), got {start_step}")
        return self._batches(int(start_step))

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
        """``(step, (images, labels))`` for the batches of ``epoch`` from batch ``start`` on
        (``step`` 0-based): :meth:`set_epoch` then :meth:`iter_from`, numbered. The training loop's
        iterator: it hands control back after every batch.

        Raises:
            InputError: ``start`` outside ``[0, len(self)]``.
        """
        self.set_epoch(epoch)
        return enumerate(self.iter_from(start), start=start)

    def _batches(self, start_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order, offsets, flips = self._plan()
        bs = self.batch_size
        augment = self.train and (self.crop_padding > 0 or self.flip)
        boxes = None
        if self.train and self.cutmix > 0:
            _, _, h, w = self.images.shape
            boxes = draw_boxes(self.seed, self.epoch, len(self), h, w, self.cutmix, self.cutmix_alpha).to(self.device)
        for i in range(start_step, len(self)):
            idx = order[i * bs:(i + 1) * bs]
            x = self.images.index_select(0, idx)
            y = self.labels.index_select(0, idx)
            if augment:
                x = random_crop_flip(x, offsets.index_select(0, idx), flips.index_select(0, idx), self.crop_padding)
            if boxes is not None:
                x, y = apply_cutmix(x, y, boxes[i], self.num_classes)
            yield self._normalise(x), y
