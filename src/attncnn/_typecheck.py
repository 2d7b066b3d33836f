"""Runtime check of values against dataclass field annotations (for user-given options)."""

from __future__ import annotations

import dataclasses
import types
import typing

__all__ = ["value_matches", "check_options"]


def check_options(options: dict, cls: type, kind: str, owner: str | None = None) -> None:
    """Check every ``key: value`` of ``options`` against the dataclass ``cls``: the key must be one
    of its fields and the value must match the field's annotation (:func:`value_matches`), so a typo
    or a wrong type in a configuration file or ``--set`` fails by name before ``cls`` is built.

    Args:
        kind: what the options are called in messages (``"model option"``, ``"training option"``).
        owner: what they belong to (an architecture name), named after an unknown key.

    Raises:
        ValueError: ``unknown <kind> 'key'[ for <owner>]; valid options: <fields>`` or
            ``<kind> 'key' must be <annotation>, got <value>``.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in options.items():
        if key not in names:
            where = f" for {owner}" if owner else ""
            raise ValueError(f"unknown {kind} {key!r}{where}; valid options: {', '.join(names)}")
        if not value_matches(value, hints[key]):
            raise ValueError(f"{kind} {key!r} must be {hints[key]}, got {value!r}")


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
