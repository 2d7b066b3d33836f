"""Reusable attention primitives for token grids (no training code; imports nothing else from attncnn)."""

from __future__ import annotations

from .attention import ContentAttention, GridAttention, PositionalAttention, dense_attention
from .conv_init import conv_initialize_, conv_kernel_size, conv_value_init_, kernel_shifts, local_init_
from .gpsa import GatedPositionalAttention, gpsa_features
from .learned import LearnedRelativeAttention, LearnedRelativeContentAttention
from .pooling import SpaceToDepth, depth_to_space, space_to_depth
from .quadratic import QuadraticAttention
from .relative import axis_offsets, grid_positions, quadratic_features, relative_offsets

#: Attention kinds accepted by :func:`build_attention` (and the models' ``attention`` option).
ATTENTION_KINDS = ("quadratic", "quadratic-generalized", "learned", "learned-content", "content", "gpsa")


def build_attention(kind: str, dim: int, num_heads: int, **kwargs) -> GridAttention:
    """Build an attention layer by name.

    Args:
        kind: one of :data:`ATTENTION_KINDS`.
        dim, num_heads: token width D and number of heads N_h.
        **kwargs: forwarded to the layer class (``head_dim``, ``attn_drop``, ``max_size``, ...).

    Raises:
        ValueError: unknown ``kind`` (the message lists the valid names).
    """
    if kind == "quadratic":
        return QuadraticAttention(dim, num_heads, **kwargs)
    if kind == "quadratic-generalized":
        return QuadraticAttention(dim, num_heads, full_covariance=True, **kwargs)
    if kind == "learned":
        return LearnedRelativeAttention(dim, num_heads, **kwargs)
    if kind == "learned-content":
        return LearnedRelativeContentAttention(dim, num_heads, **kwargs)
    if kind == "content":
        return ContentAttention(dim, num_heads, **kwargs)
    if kind == "gpsa":
        return GatedPositionalAttention(dim, num_heads, **kwargs)
    raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(ATTENTION_KINDS)}")


__all__ = [
    "ATTENTION_KINDS", "build_attention", "GridAttention", "PositionalAttention", "ContentAttention", "dense_attention",
    "QuadraticAttention", "LearnedRelativeAttention", "LearnedRelativeContentAttention", "GatedPositionalAttention",
    "SpaceToDepth", "space_to_depth", "depth_to_space",
    "grid_positions", "relative_offsets", "quadratic_features", "axis_offsets", "gpsa_features",
    "kernel_shifts", "conv_kernel_size", "local_init_", "conv_value_init_", "conv_initialize_",
]
