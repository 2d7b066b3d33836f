"""Space-to-depth (the paper's "invertible pooling" of width 2, after i-RevNet) and its inverse, on channels-last grids.

The paper flattens every non-overlapping 2x2 patch of the image into a token (Jacobsen et al. 2018).
A token holds ``x[i*s + a, j*s + b, c]`` at channel ``(a*s + b)*C + c`` (row in patch, column in
patch, channel): a fixed permutation that the following linear layer absorbs.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError

__all__ = ["space_to_depth", "depth_to_space", "SpaceToDepth"]


def space_to_depth(x: torch.Tensor, size: int, *, channels: int | None = None) -> torch.Tensor:
    """Fold every ``size x size`` patch of a channels-last grid into one token.

    Args:
        x: ``(B, H, W, C)`` grid, channels last (images ``(B, C, H, W)``: ``images.permute(0, 2, 3, 1)``).
        size: patch width s (the paper's ``pooling_concatenate_size``, 2).
        channels: the channel count C that ``x`` must have, when the caller knows it (then an
            input of another width is refused, channels-first images included); None: any C.

    Returns:
        ``(B, H/s, W/s, s*s*C)``; token ``[i, j]`` holds ``x[i*s + a, j*s + b, c]`` at channel
        ``(a*s + b)*C + c``.

    Raises:
        InputError: ``x`` not 4-D, ``size < 1``, a last dimension other than ``channels``, or ``H``
            or ``W`` not divisible by ``size``; where ``x`` looks like channels-first images the
            message says so and gives the permute that fixes it.
    """
    if x.dim() != 4:
        raise InputError(f"space_to_depth expects a (B, H, W, C) grid, got shape {tuple(x.shape)}")
    if size < 1:
        raise InputError(f"pooling size must be >= 1, got {size}")
    b, h, w, c = x.shape
    if channels is not None and c != channels:
        if h == channels:
            raise InputError(_channels_first(x, f"C={channels}"))
        raise InputError(f"space_to_depth expects a channels-last grid (B, H, W, {channels}), got shape "
                         f"{tuple(x.shape)} with {c} channels; give it {channels}-channel grids or pool with "
                         f"channels={c}")
    if h % size or w % size:
        # (B, 3, 32, 32) images read as a 3x32 grid of 32 channels: say what is wrong, not "3 is odd"
        if channels is None and h <= 4 < c:
            raise InputError(_channels_first(x, f"C={h}"))
        raise InputError(
            f"grid {h}x{w} is not divisible by the pooling width {size}: "
            f"use images whose height and width are multiples of {size}, or change the pooling width")
    x = x.reshape(b, h // size, size, w // size, size, c)   # (B, H/s, a, W/s, b, C)
    x = x.permute(0, 1, 3, 2, 4, 5)                          # (B, H/s, W/s, a, b, C)
    return x.reshape(b, h // size, w // size, size * size * c)


def _channels_first(x: torch.Tensor, channels: str) -> str:
    """The error for channels-first images ``(B, C, H, W)`` given where ``(B, H, W, C)`` is expected."""
    return (f"space_to_depth takes channels-last grids (B, H, W, C), got shape {tuple(x.shape)}, which looks like "
            f"channels-first images (B, C, H, W) with {channels}: pass images.permute(0, 2, 3, 1)")


def depth_to_space(x: torch.Tensor, size: int) -> torch.Tensor:
    """Inverse of :func:`space_to_depth`: ``(B, h, w, s*s*C) -> (B, h*s, w*s, C)``.

    Raises:
        InputError: if ``x`` is not 4-D or its channel count is not divisible by ``size**2``.
    """
    if x.dim() != 4:
        raise InputError(f"depth_to_space expects a (B, h, w, s*s*C) grid, got shape {tuple(x.shape)}")
    b, h, w, cs = x.shape
    if cs % (size * size):
        raise InputError(f"{cs} channels are not divisible by size**2 = {size * size}")
    c = cs // (size * size)
    x = x.reshape(b, h, w, size, size, c).permute(0, 1, 3, 2, 4, 5)   # (B, h, a, w, b, C)
    return x.reshape(b, h * size, w * size, c)


class SpaceToDepth(nn.Module):
    """The paper's input stem, "invertible pooling" (Sec. 4, after i-RevNet, Jacobsen et al. 2018):
    every non-overlapping ``p x p`` patch of a channels-last grid becomes one token of its
    ``p*p*C`` values (no parameters; :func:`space_to_depth` as a module).

    With the paper's ``p = 2``, a CIFAR batch ``(B, 32, 32, 3)`` becomes a ``(B, 16, 16, 12)``
    grid. Token ``[i, j]`` holds pixel ``x[i*p + a, j*p + b, c]`` at feature ``(a*p + b)*C + c``,
    the order of the reference code's ``downsample_concatenate`` (``BertImage.forward``,
    ``models/transformer.py``); it matters only to weights moved between implementations.
    :func:`depth_to_space` inverts it.

    Args:
        size: the pooling width ``p`` (the reference code's ``pooling_concatenate_size``).
        channels: the channel count ``C`` of the inputs, if known (3 for RGB): then an input of
            another width is refused, and channels-first images are recognised whatever their size.

    Shapes:
        input ``(B, H, W, C)``, channels last (images ``(B, C, H, W)`` go through
        ``images.permute(0, 2, 3, 1)`` first); output ``(B, H/p, W/p, p*p*C)``, same dtype and device.

    Raises:
        InputError: (in the forward) an input that is not 4-D, of another channel count than
            ``channels``, or whose ``H`` or ``W`` is not divisible by ``p``; an input that looks like
            channels-first images is named as such, with the ``permute`` that fixes it.
    """

    def __init__(self, size: int = 2, channels: int | None = None) -> None:
        super().__init__()
        self.size = size
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return space_to_depth(x, self.size, channels=self.channels)

    def extra_repr(self) -> str:
        return f"size={self.size}" + ("" if self.channels is None else f", channels={self.channels}")
