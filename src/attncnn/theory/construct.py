"""Theorem 1 as code: the multi-head self-attention layer that *is* a given convolution.

Construction (Lemmas 1-2, Theorem 1 and its remarks), with :class:`~attncnn.layers.QuadraticAttention`:

* one head per kernel tap: N_h = K^2 heads; head ``h = u*K + v`` serves tap ``(u, v)`` and has
  center ``Delta^(h) = ((u - c) d, (v - c) d)`` (``c = K // 2``, ``d`` the dilation), in tokens
  (:func:`~attncnn.layers.kernel_shifts`, re-exported here);
* the quadratic encoding (paper eq. 9) with a sharpness alpha so large that each head's softmax is
  exactly one-hot on the key ``q + Delta^(h)`` in floating point (:func:`default_alpha`);
* the folded value matrices of Lemma 1 set to the kernel slices,
  ``W^(h) = weight[:, :, u, v]^T`` (``C_in x C_out``), and the output bias to the convolution's bias.

Then ``MHSA(X)_q = b + sum_h X_{q + Delta^(h)} W^(h)``, which is exactly
:func:`torch.nn.functional.conv2d` (a cross-correlation: no kernel flip).

Padding, stride and dilation (the remarks after Theorem 1): the token grid is padded with zero
tokens and the output cropped ("same"), or only the interior is kept ("valid"); a stride ``s``
keeps every ``s``-th row and column of the stride-1 output; a dilation only moves the centers
(:class:`AttentionConv2d`). Heads of width ``D_h`` other than ``C_in`` add a value projection:
heads at least ``min(C_in, C_out)`` wide reproduce every output channel, narrower ones ``D_h`` of
them (Theorem 1's ``min(D_h, D_out)``), the others are 0.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..layers import QuadraticAttention, kernel_shifts
from ..layers.autocast_rules import score_dtype

__all__ = ["AttentionConv2d", "attention_from_conv2d", "default_alpha", "kernel_shifts", "PADDINGS"]

log = logging.getLogger(__name__)

#: Accepted values of ``padding``.
PADDINGS = ("same", "valid")


def default_alpha(dtype: torch.dtype) -> float:
    """Sharpness that makes every head exactly one-hot in ``dtype`` (Lemma 2 with finite alpha).

    Rule: ``alpha = -ln(tiny)``, ``tiny`` the smallest normal number of the dtype the layer's scores
    run in (:func:`~attncnn.layers.autocast_rules.score_dtype`): 87.34 for float32, bfloat16 and
    float16, 708.40 for float64. A head's score is ``-alpha |delta - Delta|^2``: 0 on the target key
    and at most ``-alpha`` elsewhere (integer lattice), so every off-target weight is at most about
    ``tiny`` (up to the rounding of the stored ``s = sqrt(2 alpha)``: a factor 1.5 in bfloat16);
    over any grid of fewer than ``eps / (2 tiny)`` tokens their sum is below half an ulp of 1, so
    the target probability is exactly 1 and the layer flushes the others to 0. Scores cannot
    overflow for any grid that fits in memory.

    Args:
        dtype: a floating dtype.

    Returns:
        alpha (a Python float, no unit: inverse squared token distance).

    Raises:
        InputError: ``dtype`` is not a floating dtype.
    """
    if not dtype.is_floating_point:
        raise InputError(f"alpha is defined for floating dtypes, got {dtype}")
    return -math.log(torch.finfo(score_dtype(dtype)).tiny)


def _check_geometry(kernel_size: int, dilation: int, stride: int) -> None:
    kernel_shifts(kernel_size, dilation)         # checks the kernel size and the dilation
    if stride < 1:
        raise InputError(f"the stride must be a positive integer, got {stride}")


def _single(value, name: str, dims: int) -> int:
    """An int from an int or a tuple of equal ints (torch modules store tuples)."""
    if isinstance(value, (tuple, list)):
        if len(set(value)) != 1 or len(value) != dims:
            raise InputError(f"{name} must be the same along every axis, got {tuple(value)}")
        value = value[0]
    return int(value)


class AttentionConv2d(nn.Module):
    """A convolution computed by multi-head self-attention (Theorem 1 and its remarks on padding,
    stride and dilation), built by :func:`attention_from_conv2d`.

    ``forward`` zero-pads the token grid (``"same"``), applies :attr:`attention` (a
    :class:`~attncnn.layers.QuadraticAttention` with one head per kernel tap), crops the frame of
    ``p = (K // 2) * dilation`` tokens, and keeps every ``stride``-th row and column.

    Attributes:
        attention: the attention layer (the same class the networks use).
        kernel_size, dilation, stride: the emulated convolution's geometry (ints).
        padding: ``"same"`` (output ``ceil(H / s)``) or ``"valid"`` (no padding, output
            ``floor((H - 2p - 1) / s) + 1``).
        exact_channels: output channels the layer reproduces exactly (all of them unless the
            heads are narrower than both the input and the output).
    """

    spatial_dims = 2

    def __init__(self, attention: QuadraticAttention, *, kernel_size: int, dilation: int, stride: int,
                 padding: str, exact_channels: Sequence[int]) -> None:
        super().__init__()
        self.attention = attention
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.stride = stride
        self.padding = padding
        self.exact_channels = tuple(int(c) for c in exact_channels)

    @property
    def pad(self) -> int:
        """Reach of the kernel from its center, ``(K // 2) * dilation`` tokens."""
        return (self.kernel_size // 2) * self.dilation

    @property
    def in_channels(self) -> int:
        return self.attention.dim

    @property
    def out_channels(self) -> int:
        return self.attention.out_dim

    @property
    def alpha(self) -> torch.Tensor:
        """The heads' sharpness alpha, ``(N_h,)``."""
        return self.attention.alpha

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[-1] != self.in_channels:
            raise InputError(f"{type(self).__name__} expects channels-last images (B, H, W, {self.in_channels}), "
                             f"got shape {tuple(x.shape)}")
        return x

    def _from_grid(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def _pad_grid(self, x: torch.Tensor) -> torch.Tensor:
        p = self.pad
        return F.pad(x, (0, 0, p, p, p, p))           # channels-last: (C, W, H) pairs

    def _crop(self, y: torch.Tensor) -> torch.Tensor:
        p, s = self.pad, self.stride
        return y[:, p:y.shape[1] - p:s, p:y.shape[2] - p:s]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the convolution through attention.

        Args:
            x: ``(B, H, W, C_in)`` channels-last images.

        Returns:
            ``(B, H', W', C_out)`` channels-last; equal to
            ``conv2d(x, weight, bias, stride, padding=p or 0, dilation)`` (channels moved last).

        Raises:
            InputError: wrong shape, or a ``"valid"`` input smaller than the kernel's extent.
        """
        grid = self._to_grid(x)
        if self.padding == "same":
            grid = self._pad_grid(grid)
        elif min(grid.shape[3 - self.spatial_dims:3]) <= 2 * self.pad:
            raise InputError(f"'valid' padding needs inputs at least as large as the kernel extent {2 * self.pad + 1}, "
                             f"got {tuple(x.shape)}")
        return self._from_grid(self._crop(self.attention(grid)))

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, stride={self.stride}, "
                f"padding={self.padding!r}, exact_channels={len(self.exact_channels)}/{self.out_channels}")


def _conv_parts(conv, bias, stride, dilation, padding, dims: int, module_type: type):
    """Unpack a conv module or a weight tensor into (weight, bias, stride, dilation, padding)."""
    if isinstance(conv, module_type):
        if bias is not None or stride is not None or dilation is not None:
            raise InputError(f"pass bias/stride/dilation only with a weight tensor; a {module_type.__name__} "
                             "carries its own")
        if conv.groups != 1:
            raise InputError(f"grouped convolutions are not covered by the construction (groups={conv.groups}); "
                             "build one layer per group")
        if conv.padding_mode != "zeros":
            raise InputError(f"only zero padding is exact (padding_mode={conv.padding_mode!r})")
        ks = conv.kernel_size
        if len(set(ks)) != 1:
            raise InputError(f"the kernel must be square, got {tuple(ks)}")
        stride = _single(conv.stride, "stride", dims)
        dilation = _single(conv.dilation, "dilation", dims)
        if isinstance(conv.padding, str):
            own = conv.padding
        else:
            p = _single(conv.padding, "padding", dims)
            reach = (ks[0] // 2) * dilation
            if p not in (0, reach):
                raise InputError(f"the convolution pads {p}; only 0 ('valid') and {reach} ('same') "
                                 "are expressible")
            own = "valid" if p == 0 else "same"
        if padding is not None and padding != own:
            raise InputError(f"padding={padding!r} contradicts the {module_type.__name__}'s own ({own!r}): the layer "
                             "would compute another convolution; leave padding out, or pass the weight tensor")
        padding = own
        return conv.weight.detach(), None if conv.bias is None else conv.bias.detach(), stride, dilation, padding
    if not isinstance(conv, torch.Tensor):
        raise InputError(f"expected a {module_type.__name__} or a weight tensor, got {type(conv).__name__}")
    if conv.dim() != dims + 2:
        raise InputError(f"the weight must be (C_out, C_in{', K' * dims}), got shape {tuple(conv.shape)}")
    if len(set(conv.shape[2:])) != 1:
        raise InputError(f"the kernel must be square, got {tuple(conv.shape[2:])}")
    return (conv.detach(), None if bias is None else bias.detach(), 1 if stride is None else int(stride),
            1 if dilation is None else int(dilation), "same" if padding is None else padding)


def _build(weight_taps: torch.Tensor, bias: torch.Tensor | None, shifts: torch.Tensor, *, alpha: float | None,
           head_dim: int | None, channels: Sequence[int] | None) -> tuple[QuadraticAttention, tuple[int, ...]]:
    """The attention layer for taps ``(N_h, C_out, C_in)`` at ``shifts (N_h, 2)``; see Lemma 1.

    Returns the layer and the output channels it reproduces exactly.
    """
    num_heads, c_out, c_in = weight_taps.shape
    dtype, device = weight_taps.dtype, weight_taps.device
    if not dtype.is_floating_point:
        raise InputError(f"the kernel must be a floating tensor, got {dtype}")
    alpha = default_alpha(dtype) if alpha is None else float(alpha)
    if not alpha > 0 or not math.isfinite(alpha):
        raise InputError(f"alpha must be positive and finite, got {alpha}")
    layer = QuadraticAttention(c_in, num_heads, head_dim=head_dim, out_dim=c_out).to(device=device, dtype=dtype)
    d_h = layer.head_dim
    with torch.no_grad():
        layer.centers.copy_(shifts.to(dtype))
        layer.spreads.fill_(math.sqrt(2.0 * alpha))       # alpha = s^2 / 2
        layer.value.bias.zero_()
        if layer.value_in is None:
            # Lemma 1 with folded W^(h): head h owns value columns h*C_in:(h+1)*C_in.
            layer.value.weight.copy_(weight_taps.permute(1, 0, 2).reshape(c_out, num_heads * c_in))
            exact = tuple(range(c_out))
            if bias is not None:
                layer.value.bias.copy_(bias)
        elif c_in <= d_h:
            # W^(h) = value_h value_in_h with value_in_h = [I; 0] (D_h x C_in): every channel exact.
            exact = tuple(range(c_out))
            cols = torch.arange(c_in, device=device)
            layer.value_in.weight.zero_()
            layer.value_in.bias.zero_()                    # zero padding tokens must stay zero
            layer.value.weight.zero_()
            for h in range(num_heads):
                layer.value_in.weight[h * d_h + cols, cols] = 1.0
                layer.value.weight[:, h * d_h + cols] = weight_taps[h]
            if bias is not None:
                layer.value.bias.copy_(bias)
        else:
            # W^(h) = value_h value_in_h factors through D_h < C_in dimensions: each head can carry
            # D_h rows of W^(h), so |exact| <= D_h output channels (all of them when D_h >= C_out).
            exact = _exact_channels(channels, c_out, c_in, d_h)
            idx = torch.tensor(exact, dtype=torch.long, device=device)
            layer.value_in.weight.zero_()
            layer.value_in.bias.zero_()                    # zero padding tokens must stay zero
            layer.value.weight.zero_()
            for h in range(num_heads):
                rows = h * d_h + torch.arange(len(exact), device=device)
                layer.value_in.weight[rows] = weight_taps[h, idx]       # (m, C_in)
                layer.value.weight[idx, rows] = 1.0
            if bias is not None:
                layer.value.bias[idx] = bias[idx]
    return layer, exact


def _exact_channels(channels: Sequence[int] | None, c_out: int, c_in: int, d_h: int) -> tuple[int, ...]:
    """The output channels heads of width ``d_h < c_in`` reproduce: ``channels``, or the first
    ``min(d_h, c_out)``; a warning names them when some channels are left at 0."""
    if channels is None:
        exact = tuple(range(min(d_h, c_out)))
    else:
        exact = tuple(int(c) for c in channels)
        if len(set(exact)) != len(exact) or any(not 0 <= c < c_out for c in exact):
            raise InputError(f"channels must be distinct indices in [0, {c_out}), got {list(channels)}")
        if len(exact) > d_h:
            raise InputError(f"heads of width head_dim={d_h}, narrower than C_in={c_in}, reproduce at most {d_h} "
                             f"output channels (Theorem 1: min(D_h, D_out)), {len(exact)} requested; "
                             f"head_dim >= {min(c_in, c_out)} reproduces all {c_out}")
    if len(exact) < c_out:
        warnings.warn(f"heads of width head_dim={d_h} < C_in={c_in} and C_out={c_out}: only output channels "
                      f"{list(exact)} equal the convolution (Theorem 1: min(D_h, D_out) channels); the other "
                      f"{c_out - len(exact)} are 0 (head_dim >= {min(c_in, c_out)} reproduces all)",
                      UserWarning, stacklevel=4)
    return exact


def attention_from_conv2d(conv: nn.Conv2d | torch.Tensor, *, alpha: float | None = None,
                          padding: str | None = None, bias: torch.Tensor | None = None,
                          stride: int | None = None, dilation: int | None = None, head_dim: int | None = None,
                          channels: Sequence[int] | None = None) -> AttentionConv2d:
    """Build the multi-head self-attention layer equal to a 2-D convolution (Theorem 1).

    Args:
        conv: a :class:`torch.nn.Conv2d` (its bias, stride and dilation are used), or a weight
            tensor ``(C_out, C_in, K, K)`` (then pass ``bias``/``stride``/``dilation`` here).
            K odd, any C_in/C_out, groups 1, zero padding. The layer gets the weight's dtype
            and device.
        alpha: sharpness of every head (inverse squared token distance); default
            :func:`default_alpha` of the dtype (exactly one-hot). A small alpha gives the
            approximation of Lemma 2 (see :mod:`.lemma2`).
        padding: ``"same"`` (zero padding of ``(K // 2) * dilation`` on every side: heads pointing at
            padding read zeros, as the convolution does) or ``"valid"`` (no padding). Default (None):
            the Conv2d's own (0 or ``(K // 2) * dilation``; any other is refused), or ``"same"`` for a
            weight tensor. Given with a Conv2d, it must be the Conv2d's.
        bias: ``(C_out,)``, only with a weight tensor.
        stride, dilation: ints, only with a weight tensor (default 1). A stride subsamples the
            stride-1 output (the paper's remark on stride).
        head_dim: width D_h of each head (default C_in: the paper's full-width heads, exact for every
            C_out). Otherwise a value projection C_in -> N_h*D_h: heads at least ``min(C_in, C_out)``
            wide reproduce every channel, narrower ones ``D_h`` of them (Theorem 1's ``min(D_h, D_out)``).
        channels: which output channels narrower heads reproduce (default the first
            ``min(D_h, C_out)``); the others output 0 and a :class:`UserWarning` names them.

    Returns:
        :class:`AttentionConv2d` holding a :class:`~attncnn.layers.QuadraticAttention` with K^2
        heads (head ``u*K + v`` for tap ``(u, v)``); ``forward`` maps ``(B, H, W, C_in)`` to
        ``(B, H', W', C_out)``. Memory: ``K^2 * (H'' W'')^2`` probabilities for the padded grid.

    Raises:
        InputError: even or non-square kernel, groups != 1, non-zero padding mode, unequal
            stride/dilation per axis, a Conv2d padding other than 0 or the kernel reach, a
            ``padding`` that contradicts the Conv2d's, an unknown ``padding`` string, non-positive
            alpha, or bad ``channels``.
    """
    weight, bias, stride, dilation, padding = _conv_parts(conv, bias, stride, dilation, padding, 2, nn.Conv2d)
    if padding not in PADDINGS:
        raise InputError(f"padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
    c_out, c_in, k, _ = weight.shape
    _check_geometry(k, dilation, stride)
    taps = weight.permute(2, 3, 0, 1).reshape(k * k, c_out, c_in)       # tap u*K+v -> (C_out, C_in)
    layer, exact = _build(taps, bias, kernel_shifts(k, dilation), alpha=alpha, head_dim=head_dim,
                          channels=channels)
    log.debug("built %d-head attention for a %dx%d convolution (dilation %d, stride %d, %s)",
              k * k, k, k, dilation, stride, padding)
    return AttentionConv2d(layer, kernel_size=k, dilation=dilation, stride=stride, padding=padding,
                           exact_channels=exact)
