"""Space-to-depth (the paper's "invertible pooling" of width 2, after i-RevNet) and its inverse, on channels-last grids.

The paper turns the 32x32x3 image into a 16x16 grid of 12-channel tokens by flattening every
non-overlapping 2x2 patch (Jacobsen et al. 2018). The order of the channels inside a token is a
fixed permutation that a following linear layer absorbs; ours is (row in patch, column in patch,
channel), i.e. a token holds ``x[i*s + a, j*s + b, c]`` at channel ``(a*s + b)*C + c``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["space_to_depth", "depth_to_space", "SpaceToDepth"]


def space_to_depth(x: torch.Tensor, size: int) -> torch.Tensor:
    """Fold every ``size x size`` patch of a channels-last grid into one token.

    Args:
        x: ``(B, H, W, C)`` grid.
        size: patch width s (the paper's ``pooling_concatenate_size``, 2).

    Returns:
        ``(B, H/s, W/s, s*s*C)``; token ``[i, j]`` holds ``x[i*s + a, j*s + b, c]`` at channel
        ``(a*s + b)*C + c``.

    Raises:
        ValueError: if ``x`` is not 4-D or ``H`` or ``W`` is not divisible by ``size``.
    """
    if x.dim() != 4:
        raise ValueError(f"space_to_depth expects a (B, H, W, C) grid, got shape {tuple(x.shape)}")
    if size < 1:
        raise ValueError(f"pooling size must be >= 1, got {size}")
    b, h, w, c = x.shape
    if h % size or w % size:
        raise ValueError(
            f"grid {h}x{w} is not divisible by the pooling width {size}: "
            f"use images whose height and width are multiples of {size}, or change the pooling width")
    x = x.reshape(b, h // size, size, w // size, size, c)   # (B, H/s, a, W/s, b, C)
    x = x.permute(0, 1, 3, 2, 4, 5)                          # (B, H/s, W/s, a, b, C)
    return x.reshape(b, h // size, w // size, size * size * c)


def depth_to_space(x: torch.Tensor, size: int) -> torch.Tensor:
    """Inverse of :func:`space_to_depth`: ``(B, h, w, s*s*C) -> (B, h*s, w*s, C)``.

    Raises:
        ValueError: if ``x`` is not 4-D or its channel count is not divisible by ``size**2``.
    """
    if x.dim() != 4:
        raise ValueError(f"depth_to_space expects a (B, h, w, s*s*C) grid, got shape {tuple(x.shape)}")
    b, h, w, cs = x.shape
    if cs % (size * size):
        raise ValueError(f"{cs} channels are not divisible by size**2 = {size * size}")
    c = cs // (size * size)
    x = x.reshape(b, h, w, size, size, c).permute(0, 1, 3, 2, 4, 5)   # (B, h, a, w, b, C)
    return x.reshape(b, h * size, w * size, c)


class SpaceToDepth(nn.Module):
    """Module form of :func:`space_to_depth` (no parameters)."""

    def __init__(self, size: int = 2) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return space_to_depth(x, self.size)

    def extra_repr(self) -> str:
        return f"size={self.size}"
