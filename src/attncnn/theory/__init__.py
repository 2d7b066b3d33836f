"""Theorem 1 as code, with its lemmas and corollaries: attention layers that are convolutions, and the converse.

:func:`attention_from_conv2d` / :func:`attention_from_conv1d` (the attention layer equal to a given
convolution, Theorem 1 and Lemma 1 with their remarks), :func:`conv_from_attention` (the closest
convolution to a positional attention layer), :func:`layer_as_conv` (one layer of a network),
:func:`off_target_mass` / :func:`lemma2_bound` (Lemma 2 for finite alpha), and
:func:`check_theorem` / :func:`check_model_layer` (``attncnn theorem``).
"""

from __future__ import annotations

from .construct import PADDINGS, AttentionConv2d, attention_from_conv2d, default_alpha, kernel_shifts
from .conv1d import AttentionConv1d, attention_from_conv1d
from .extract import (
    ASSIGNMENTS,
    ExtractedConv,
    ExtractionReport,
    HeadReport,
    conv_from_attention,
    folded_bias,
    folded_value_matrices,
    interior_mask,
    output_errors,
)
from .checks import check_model_layer, check_theorem
from .lemma2 import Lemma2Bound, lattice_theta_tail, lemma2_bound, off_target_mass
from .model_layer import LayerCheck, layer_as_conv

__all__ = [
    "PADDINGS", "ASSIGNMENTS", "AttentionConv2d", "AttentionConv1d", "attention_from_conv2d",
    "attention_from_conv1d", "default_alpha", "kernel_shifts", "conv_from_attention", "ExtractedConv",
    "ExtractionReport", "HeadReport", "folded_value_matrices", "folded_bias", "interior_mask", "output_errors",
    "Lemma2Bound", "lattice_theta_tail", "off_target_mass", "lemma2_bound", "LayerCheck", "layer_as_conv",
    "check_theorem", "check_model_layer",
]
