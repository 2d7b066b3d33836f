"""Runtime check of values against dataclass field annotations (for user-given options).

Its errors are read by people, not programmers: the expected type in words ("an integer"), the
value as it was written, and the fix; for options read from a file (a run's ``config.json``) the
file comes first and the value is shown as JSON, since that is what the user edits.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing

from .errors import InputError

__all__ = ["value_matches", "check_options", "type_words"]


def check_options(options: dict, cls: type, kind: str, owner: str | None = None, *,
                  source: str | os.PathLike[str] | None = None) -> None:
    """Check every ``key: value`` of ``options`` against the dataclass ``cls``: the key must be one
    of its fields and the value must match the field's annotation (:func:`value_matches`).

    Args:
        kind: what the options are called in messages (``"model option"``, ``"training option"``).
        owner: what they belong to (an architecture name), named after an unknown key.
        source: the file the options were read from: messages start with it, show values as JSON and
            say what to write there.

    Raises:
        InputError: ``[<source>: ]unknown <kind> 'key'[ for <owner>] (did you mean 'k'?); <fix>;
            valid options: <fields>`` or ``[<source>: ]<kind> 'key' must be <type in words>, got
            <value> (<its type in words>); <fix>``.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    where = f"{source}: " if source is not None else ""
    for key, value in options.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            fix = f"rename or remove it in {source}" if source is not None else "rename or remove it"
            raise InputError(f"{where}unknown {kind} {key!r}{' for ' + owner if owner else ''}{guess}; {fix}; "
                             f"valid options: {', '.join(fields)}")
        if not value_matches(value, hints[key]):
            none = "null" if source is not None else "None"      # a file is JSON; --set and Python say None
            raise InputError(f"{where}{kind} {key!r} must be {type_words(hints[key], none)}, got "
                             f"{_shown(value, source)} ({_kind_of(value, none)}); "
                             f"{_fix(key, value, hints[key], fields[key], source)}")


def type_words(annotation, none: str = "null") -> str:
    """The type ``annotation`` in words: ``"an integer"``, ``"a number"``, ``"true or false"``,
    ``"a list of integers"``, ``"a string or null"`` (``none``: how the reader writes None; JSON's
    null by default)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        words = [type_words(a, none).replace("true or false", "true, false") for a in typing.get_args(annotation)
                 if a is not type(None)]
        if type(None) in typing.get_args(annotation):
            words.append(none)
        return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]
    if typing.get_origin(annotation) in (list, tuple) or annotation in (list, tuple):
        return "a list of integers"
    if annotation is type(None):
        return none
    return _WORDS.get(annotation, getattr(annotation, "__name__", str(annotation)))


_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object "
          "({\"key\": value, ...})", type(None): "null"}


def _kind_of(value, none: str = "null") -> str:
    """What ``value`` is, in the words of :func:`type_words`."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (list, tuple)):
        return "a list"
    return _WORDS.get(type(value), type(value).__name__).split(" (")[0]


def _shown(value, source) -> str:
    """``value`` as the user wrote it: JSON for a file, Python otherwise."""
    if source is not None:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            pass
    return repr(value)


def _fix(key: str, value, annotation, field: dataclasses.Field, source) -> str:
    """What to write instead: the value a string spells (``"2"`` -> ``2``) or an integral float is,
    else the type with an example (the field's default)."""
    spelled = None
    if isinstance(value, str):
        try:
            spelled = json.loads(value)
        except ValueError:
            spelled = None
    elif isinstance(value, float) and value.is_integer():
        spelled = int(value)
    if spelled is not None and value_matches(spelled, annotation):
        example, words = spelled, ""
    else:
        example = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        example = None if example is dataclasses.MISSING else example
        words = type_words(annotation, "null" if source is not None else "None")
    if source is not None:
        shown = "" if example is None else f"{json.dumps(key)}: {_shown(example, source)}"
        if not words:
            return f"write {shown} in {source}"
        return f"write {words} for {json.dumps(key)} in {source}" + (f", e.g. {shown}" if shown else "")
    shown = "" if example is None else f"{key}={example!r}"
    if not words:
        return f"give {shown}"
    return f"give {words}" + (f", e.g. {shown}" if shown else "")


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
