"""CutMix (Yun et al., "CutMix: Regularization Strategy to Train Strong Classifiers with Localizable
Features", ICCV 2019), batched on the device.

With probability ``p`` a batch is mixed: one box is cut out of every image and filled with the same
box of its partner (image ``B - 1 - b``, as timm pairs them), and the labels are mixed by area. The
box follows the paper's Algorithm A1: ``lam ~ Beta(alpha, alpha)``, a box of side
``side * sqrt(1 - lam)`` centered at a uniformly random pixel, clipped to the image; the label
weight is then ``lam = 1 - box area / image area``. One box per batch, as the paper's code draws
them. The draws are a pure function of ``(seed, epoch)`` (:func:`draw_boxes`), drawn apart from the
crop, flip and order (which stay the same with CutMix on or off), so a run resumed mid-epoch mixes
its batches as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from ..errors import InputError

__all__ = ["draw_boxes", "apply_cutmix", "check_cutmix"]


def check_cutmix(probability: float, alpha: float) -> None:
    """Raise :class:`InputError` unless ``probability`` is in ``[0, 1]`` and ``alpha`` is a finite number > 0."""
    if not (isinstance(probability, (int, float)) and 0.0 <= probability <= 1.0):
        raise InputError(f"cutmix must be a probability in [0, 1] (0: off), got {probability!r} (--cutmix)")
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise InputError(f"cutmix_alpha must be a finite number > 0 (the Beta distribution's parameter; 1.0 "
                         f"draws lam uniformly), got {alpha!r} (--cutmix-alpha)")


def draw_boxes(seed: int, epoch: int, batches: int, height: int, width: int, probability: float,
               alpha: float) -> torch.Tensor:
    """The boxes of an epoch's batches: ``(batches, 4)`` int64 ``(y0, y1, x0, x1)``, half-open pixel
    ranges; an empty box ``(0, 0, 0, 0)`` where the batch is not mixed (probability ``1 - p``).
    Batch ``i``'s box depends only on ``(seed, epoch, i)`` and the arguments (the first ``k`` rows
    are the same for any ``batches >= k``).

    Raises:
        InputError: ``probability`` or ``alpha`` out of range (:func:`check_cutmix`).
    """
    check_cutmix(probability, alpha)
    digest = hashlib.sha256(f"attncnn-cutmix\0{int(seed)}\0{int(epoch)}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    # Four draws per batch, batch after batch, whether or not the batch is mixed: row i depends on
    # nothing but the rows before it, so any number of batches gives the same first rows.
    draws = np.array([(rng.random(), rng.beta(alpha, alpha), rng.integers(0, height), rng.integers(0, width))
                      for _ in range(batches)], dtype=np.float64).reshape(batches, 4)
    use = draws[:, 0] < probability
    lam = draws[:, 1]
    cy = draws[:, 2].astype(np.int64)
    cx = draws[:, 3].astype(np.int64)
    cut = np.sqrt(1.0 - lam)
    half_h = (height * cut).astype(np.int64) // 2
    half_w = (width * cut).astype(np.int64) // 2
    boxes = np.stack([np.clip(cy - half_h, 0, height), np.clip(cy + half_h, 0, height),
                      np.clip(cx - half_w, 0, width), np.clip(cx + half_w, 0, width)], axis=1)
    boxes[~use] = 0
    return torch.from_numpy(boxes.astype(np.int64))


def apply_cutmix(images: torch.Tensor, labels: torch.Tensor, box: torch.Tensor,
                 num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Paste ``box`` of each image's partner (the batch reversed) into it; mix the labels by area.

    Args:
        images: ``(B, C, H, W)``, any dtype (uint8 in the loader: the paste is exact), on any device.
        labels: ``(B,)`` class indices on the same device.
        box: ``(4,)`` int64 ``(y0, y1, x0, x1)`` on the same device (from :func:`draw_boxes`); an
            empty box leaves the images as they are and gives one-hot targets.
        num_classes: the number of classes (width of the targets).

    Returns:
        ``(images, targets)``: the mixed images, same shape and dtype, and ``(B, num_classes)``
        float32 targets ``lam * onehot(labels) + (1 - lam) * onehot(labels.flip(0))`` with ``lam``
        the fraction of the image outside the box. Device operations only: no host sync.
    """
    b, _, h, w = images.shape
    dev = images.device
    rows = torch.arange(h, device=dev)
    cols = torch.arange(w, device=dev)
    inside = ((rows >= box[0]) & (rows < box[1]))[:, None] & ((cols >= box[2]) & (cols < box[3]))[None, :]  # (H, W)
    mixed = torch.where(inside, images.flip(0), images)
    lam = 1.0 - inside.sum().float() / (h * w)                                    # 0-dim, on the device
    onehot = torch.nn.functional.one_hot(labels, num_classes).float()             # (B, classes)
    targets = lam * onehot + (1.0 - lam) * onehot.flip(0)
    return mixed, targets
