"""Theorem 1 inside a network: one attention layer of an image transformer against its convolution.

:func:`layer_as_conv` (``attncnn theorem --model quadratic-conv-mini``) feeds real images through
the model up to the chosen layer, extracts the closest convolution from the layer
(:func:`conv_from_attention`) and measures the output difference on the layer's own input. With
ConViT's alpha 1.0 a head puts only 0.32 of an interior query's attention on its target token (a
blurred convolution); at alpha >= 87.4 the interior error is
rounding only (:func:`~attncnn.theory.default_alpha`). At the border the layer renormalises over
the tokens that exist while the convolution reads zero padding, so the ``interior`` entries are
the theorem's claim. A trained checkpoint shows how far its layer has moved from any convolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import InputError
from ..layers import PositionalAttention
from .extract import ExtractedConv, conv_from_attention
from .lemma2 import off_target_mass

__all__ = ["LayerCheck", "layer_as_conv"]


@dataclass
class LayerCheck:
    """One layer of a model against its extracted convolution.

    Attributes:
        layer: 1-based index of the block.
        kind: the attention class name (``QuadraticAttention``, ``LearnedRelativeAttention``).
        init: the model's ``init`` option and alpha its ``locality_strength`` (None without them).
        conv: the extracted convolution, with its per-head report and output errors.
        lemma2_off_target: Lemma 2's bound on the attention mass off the target token for an
            interior query at the configured alpha (None without a conv init); ``1 - target_mass``
            in each head's report is the measured value.
    """

    layer: int
    kind: str
    init: str | None
    alpha: float | None
    conv: ExtractedConv
    lemma2_off_target: float | None


@torch.no_grad()
def layer_as_conv(model: nn.Module, images: torch.Tensor, *, layer: int = 1) -> LayerCheck:
    """Extract the convolution closest to block ``layer``'s attention and measure it on ``images``.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer` whose chosen layer is position-only
            (quadratic, generalised quadratic or learned position-only attention) with K^2 heads.
        images: normalised images ``(B, C, H, W)`` in the dtype to test (the model is cast to it).
        layer: 1-based block index.

    Returns:
        :class:`LayerCheck`; ``check.conv.report.errors`` holds the max absolute and relative
        errors (interior, border, all) of the layer's output against the extracted convolution,
        both computed in ``images.dtype``.

    Raises:
        InputError: not an image transformer, ``layer`` out of range, or a layer whose attention
            depends on the content (no single convolution describes it).
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "tokens"):
        raise InputError(f"{type(model).__name__} is not an image transformer (no attention blocks); pass a "
                         "preset or checkpoint of an attention model such as quadratic-conv-mini")
    if not 1 <= layer <= len(blocks):
        raise InputError(f"--layer must be between 1 and {len(blocks)}, got {layer}")
    attention = blocks[layer - 1].attention
    if not isinstance(attention, PositionalAttention):
        raise InputError(f"layer {layer} is {type(attention).__name__}: its attention depends on the content, so no "
                         "single convolution describes it; use a position-only model (quadratic, "
                         "quadratic-generalized, learned), e.g. quadratic-conv-mini or learned-conv-mini")
    model = model.to(images.dtype).eval()
    x = model.tokens(images)                                     # (B, H/p, W/p, D), the layer-1 input
    for block in blocks[: layer - 1]:
        x = block(x)
    conv = conv_from_attention(attention, inputs=x)
    config = getattr(model, "config", None)
    init = getattr(config, "init", None)
    alpha = getattr(config, "locality_strength", None) if init == "conv" else None
    return LayerCheck(layer, type(attention).__name__, init, alpha, conv,
                      None if alpha is None else off_target_mass(alpha))
