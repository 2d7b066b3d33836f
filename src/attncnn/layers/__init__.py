"""Reusable attention primitives for token grids (no training code; imports nothing else from attncnn).

One file per attention family (``position_only``, ``content``, ``gpsa``) and per kind (``quadratic``,
``learned``, ``learned_content``, ``learned_content_9ffaa``; the learned axis tables two of them share in
``axis_tables``); the value-mixing products in ``mixing``; the table of kinds in ``registry``.
"""

from __future__ import annotations

from .base import GridAttention, check_input_dtype
from .content import ContentAttention, QueryKeyAttention
from .conv_init import conv_initialize_, conv_kernel_size, conv_value_init_, kernel_shifts, local_init_
from .mimetic_init import MIMETIC_QK, MIMETIC_VO, mimetic_factors, mimetic_init_
from .gpsa import GatedPositionalAttention, gpsa_features
from .learned import LearnedRelativeAttention
from .learned_content import LearnedRelativeContentAttention
from .learned_content_9ffaa import LearnedContent9ffaaAttention
from .pooling import SpaceToDepth, depth_to_space, space_to_depth
from .position_only import PositionalAttention
from .quadratic import QuadraticAttention
from .registry import (ATTENTION_KINDS, ATTENTION_LAYERS, attention_class, attention_modules, build_attention,
                       dense_attention, is_attention_layer)
from .relative import axis_offsets, grid_positions, quadratic_features, relative_offsets

__all__ = [
    "ATTENTION_KINDS", "ATTENTION_LAYERS", "attention_class", "build_attention", "is_attention_layer",
    "attention_modules", "dense_attention",
    "GridAttention", "check_input_dtype", "PositionalAttention", "QueryKeyAttention", "ContentAttention",
    "QuadraticAttention", "LearnedRelativeAttention", "LearnedRelativeContentAttention",
    "LearnedContent9ffaaAttention", "GatedPositionalAttention",
    "SpaceToDepth", "space_to_depth", "depth_to_space",
    "grid_positions", "relative_offsets", "quadratic_features", "axis_offsets", "gpsa_features",
    "kernel_shifts", "conv_kernel_size", "local_init_", "conv_value_init_", "conv_initialize_",
    "mimetic_init_", "mimetic_factors", "MIMETIC_QK", "MIMETIC_VO",
]
