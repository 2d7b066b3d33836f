"""Runtime check of values against dataclass field annotations (for user-given options)."""

from __future__ import annotations

import types
import typing

__all__ = ["value_matches"]


def value_matches(value, annotation) -> bool:
    """Loose check of ``value`` against ``annotation``: int/float/str/bool, ``X | None``, lists or
    tuples of ints, dicts. ``bool`` is not accepted as a number; an int is accepted as a float."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(value_matches(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (list, tuple) or annotation in (list, tuple):
        return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                                        for v in value)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation) if isinstance(annotation, type) else True
