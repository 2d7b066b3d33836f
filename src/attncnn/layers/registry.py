"""The attention kinds: one table from a kind's name to its layer class, and what is built from it.

Adding a kind means writing its layer class (its ``KINDS``, ``CONFIG_KEYS``, ``IMPLS``,
``check_config``, ``local_init_`` and capability attributes, see :mod:`attncnn.layers.base`) and
adding the class to :data:`_LAYER_CLASSES`. Models, analysis, reports and figures ask the layer,
never its class.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

from ..errors import InputError
from .base import GridAttention
from .content import ContentAttention
from .gpsa import GatedPositionalAttention
from .learned import LearnedRelativeAttention
from .learned_content import LearnedRelativeContentAttention
from .learned_content_9ffaa import LearnedContent9ffaaAttention
from .quadratic import QuadraticAttention

__all__ = ["ATTENTION_LAYERS", "ATTENTION_KINDS", "attention_class", "build_attention", "is_attention_layer",
           "attention_modules", "dense_attention"]

_LAYER_CLASSES: tuple[type[GridAttention], ...] = (
    QuadraticAttention, LearnedRelativeAttention, LearnedRelativeContentAttention, LearnedContent9ffaaAttention,
    ContentAttention, GatedPositionalAttention,
)

#: kind name -> layer class (a class may serve several kinds, told apart by its kind_kwargs)
ATTENTION_LAYERS: dict[str, type[GridAttention]] = {kind: cls for cls in _LAYER_CLASSES for kind in cls.KINDS}
#: Attention kinds accepted by :func:`build_attention` (and the models' ``attention`` option).
ATTENTION_KINDS: tuple[str, ...] = tuple(ATTENTION_LAYERS)


def attention_class(kind: str) -> type[GridAttention]:
    """The layer class of ``kind``.

    Raises:
        InputError: unknown ``kind`` (the message lists the valid names).
    """
    try:
        return ATTENTION_LAYERS[kind]
    except (KeyError, TypeError):
        raise InputError(f"unknown attention kind {kind!r}; choose one of {', '.join(ATTENTION_KINDS)}") from None


def build_attention(kind: str, dim: int, num_heads: int, **kwargs) -> GridAttention:
    """Build an attention layer by name.

    Args:
        kind: one of :data:`ATTENTION_KINDS`.
        dim, num_heads: token width D and number of heads N_h.
        **kwargs: forwarded to the layer class (``head_dim``, ``attn_drop``, ``impl``, ``max_size``, ...),
            with the options the kind itself implies (:meth:`GridAttention.kind_kwargs`, e.g.
            ``full_covariance=True`` for ``quadratic-generalized``) on top.

    Raises:
        InputError: unknown ``kind`` (the message lists the valid names), or the layer's own errors.
    """
    cls = attention_class(kind)
    return cls(dim, num_heads, **{**kwargs, **cls.kind_kwargs(kind)})


def is_attention_layer(module: nn.Module) -> bool:
    """True for the attention layers of this package (any kind)."""
    return isinstance(module, GridAttention)


def attention_modules(model: nn.Module) -> list[GridAttention]:
    """Every attention layer in ``model`` (module order; empty for a model without any)."""
    return [m for m in model.modules() if isinstance(m, GridAttention)]


@contextlib.contextmanager
def dense_attention(model: nn.Module) -> Iterator[None]:
    """While the block runs, every layer of ``model`` takes the path that writes its ``(HW x HW)``
    map out: ``"dense"`` where it has one (position-only layers), else ``"explicit"``, in both modes;
    the previous paths come back afterwards. Operation counts meant to be compared with the paper
    (Table 1's MACs, "model FLOP/s") are taken under it, so they do not depend on a machine's paths."""
    layers = [m for m in attention_modules(model) if {"dense", "explicit"} & set(m.impls)]
    saved = [(layer.impl, layer.eval_impl) for layer in layers]
    for layer in layers:
        layer.impl, layer.eval_impl = ("dense" if "dense" in layer.impls else "explicit"), None
    try:
        yield
    finally:
        for layer, (impl, eval_impl) in zip(layers, saved):
            layer.impl, layer.eval_impl = impl, eval_impl
