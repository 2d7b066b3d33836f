"""The paper's 1-D corollary: K heads with the encoding (delta^2, delta) are a 1-D convolution.

No separate 1-D layer is needed: a sequence ``(B, T, C)`` is a token grid of one row,
``(B, 1, T, C)``, and on that grid every relative shift is ``delta = (0, delta_2)``. With centers
``Delta = (0, Delta_2)`` the quadratic score of :class:`~attncnn.layers.QuadraticAttention` is
``-alpha (delta_2 - Delta_2)^2 = -alpha (delta_2^2 - 2 Delta_2 delta_2) + const``: exactly the 1-D
encoding ``r_delta = (delta^2, delta)`` (D_p = 2) with ``v = -alpha (1, -2 Delta_2)``. So the same
class, on a 1 x T grid, is the 1-D statement, and K = N_h heads emulate a kernel of size K.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .construct import PADDINGS, AttentionConv2d, _build, _check_geometry, _conv_parts, kernel_shifts

__all__ = ["AttentionConv1d", "attention_from_conv1d"]


class AttentionConv1d(AttentionConv2d):
    """A 1-D convolution computed by multi-head self-attention on a one-row token grid.

    ``forward`` maps ``(B, T, C_in)`` to ``(B, T', C_out)`` with ``T' = ceil(T / s)`` ("same") or
    ``floor((T - 2p - 1) / s) + 1`` ("valid"), ``p = (K // 2) * dilation``. Attributes as
    :class:`~attncnn.theory.construct.AttentionConv2d`; :attr:`attention` has K heads with centers
    ``(0, (v - K//2) * dilation)``.
    """

    spatial_dims = 1

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.in_channels:
            raise InputError(f"{type(self).__name__} expects sequences (B, T, {self.in_channels}), "
                             f"got shape {tuple(x.shape)}")
        return x.unsqueeze(1)                          # (B, 1, T, C)

    def _from_grid(self, y: torch.Tensor) -> torch.Tensor:
        return y.squeeze(1)

    def _pad_grid(self, x: torch.Tensor) -> torch.Tensor:
        p = self.pad
        return F.pad(x, (0, 0, p, p))                  # pad the sequence axis only

    def _crop(self, y: torch.Tensor) -> torch.Tensor:
        p, s = self.pad, self.stride
        return y[:, :, p:y.shape[2] - p:s]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the 1-D convolution through attention.

        Args:
            x: ``(B, T, C_in)`` sequences.

        Returns:
            ``(B, T', C_out)``; equal to ``conv1d(x, weight, bias, stride, padding, dilation)``
            with the channel axis moved last.

        Raises:
            InputError: wrong shape, or a ``"valid"`` input shorter than the kernel's extent.
        """
        return super().forward(x)


def attention_from_conv1d(conv: nn.Conv1d | torch.Tensor, *, alpha: float | None = None,
                          padding: str | None = None, bias: torch.Tensor | None = None,
                          stride: int | None = None, dilation: int | None = None, head_dim: int | None = None,
                          channels: Sequence[int] | None = None) -> AttentionConv1d:
    """Build the attention layer equal to a 1-D convolution (the paper's 1-D corollary, N_h = K heads).

    Args:
        conv: a :class:`torch.nn.Conv1d` or a weight tensor ``(C_out, C_in, K)``, K odd.
        alpha, padding, bias, stride, dilation, head_dim, channels: as
            :func:`~attncnn.theory.construct.attention_from_conv2d`.

    Returns:
        :class:`AttentionConv1d` (a :class:`~attncnn.layers.QuadraticAttention` with K heads,
        head ``v`` for tap ``v``, applied to ``(B, 1, T, C)``).

    Raises:
        InputError: as :func:`~attncnn.theory.construct.attention_from_conv2d`.
    """
    weight, bias, stride, dilation, padding = _conv_parts(conv, bias, stride, dilation, padding, 1, nn.Conv1d)
    if padding not in PADDINGS:
        raise InputError(f"padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
    c_out, c_in, k = weight.shape
    _check_geometry(k, dilation, stride)
    taps = weight.permute(2, 0, 1)                     # tap v -> (C_out, C_in)
    layer, exact = _build(taps, bias, kernel_shifts(k, dilation, spatial_dims=1), alpha=alpha, head_dim=head_dim,
                          channels=channels)
    return AttentionConv1d(layer, kernel_size=k, dilation=dilation, stride=stride, padding=padding,
                           exact_channels=exact)
