"""What the commands of :mod:`attncnn.cli` share: the parser class (every option's default shown in
``--help``), ``attncnn train``'s flags built from the fields of :class:`TrainConfig`, ``KEY=VALUE``
values, and quiet logs for machine-readable output.

Each field ``name`` becomes ``--name`` (booleans also ``--no-name``; the ``model`` dict as repeated
``--set KEY=VALUE``). No flag has a default, so :func:`given_options` returns exactly what was given
on the command line (a preset's recipe fills in the rest, and ``--resume`` can refuse what it would
ignore).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import difflib
import logging
import types
import typing
from pathlib import Path

from ..models import get_preset, list_presets
from ..runs.config import TrainConfig

__all__ = ["Parser", "DefaultsHelpFormatter", "add_config_options", "given_options", "flag_name", "key_value",
           "default_text", "quiet_logs", "run_or_model", "RUN_HELP"]

log = logging.getLogger(__name__)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` that states each option's default: ``(default: X)`` is added to the help of every
    option that has one and does not state it already (flags that are off by default say nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or default is None or default is False
                or default is argparse.SUPPRESS or isinstance(action, argparse._HelpAction)):
            return text
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """The parser of ``attncnn`` and every subcommand: defaults shown in ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "(default: %(default)s)"      # argparse prints no line for an option without help
        return action


def key_value(text: str) -> tuple[str, object]:
    """Parse ``key=value`` with a Python literal value (``num_heads=16``, ``head_dim=None``); a value
    that is not a literal stays a string (``attention=learned``).

    Raises:
        argparse.ArgumentTypeError: no ``=`` in ``text``.
    """
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key.strip(), value


def flag_name(field: dataclasses.Field) -> str:
    """The command-line flag of a :class:`TrainConfig` field (``--batch-size``, ``--set``)."""
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


def _argparse_settings(annotation) -> dict:
    """How argparse reads a value of type ``annotation`` (``X | None`` reads an ``X``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation is dict:
        return {"action": "append", "type": key_value}
    if typing.get_origin(annotation) is list:
        return {"nargs": "+", "type": typing.get_args(annotation)[0]}
    return {"type": annotation}


def _shown(value) -> str:
    """A default as ``--help`` shows it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return "none" if value is None else str(value)


def default_text(field: dataclasses.Field) -> str:
    """What ``--help`` says about a field's default: its :class:`TrainConfig` value, and whether a
    preset's recipe may set another (``attncnn presets --json`` lists the recipes)."""
    if field.name == "preset":
        return "required, except with --resume"
    if field.name == "model":
        return "default: the preset's model options"
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if all(get_preset(name).train.get(field.name, value) == value for name in list_presets()):
        return f"default: {_shown(value)}"
    return f"default: the preset's recipe, else {_shown(value)}; see `attncnn presets --json`"


def add_config_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       fields_of: type = TrainConfig) -> None:
    """Add one flag per field of the dataclass ``fields_of`` (default :class:`TrainConfig`) to
    ``parser`` or an argument group (destination = the field name), its help the field's, followed by
    its default (:func:`default_text`) unless the help states it."""
    hints = typing.get_type_hints(fields_of)
    for field in dataclasses.fields(fields_of):
        extra = {k: v for k, v in field.metadata.items() if k not in ("flag", "help")}
        text = field.metadata["help"]
        if "default" not in text or field.name in ("preset", "model"):   # else the help states it already
            text = f"{text} ({default_text(field)})"
        parser.add_argument(flag_name(field), dest=field.name, default=argparse.SUPPRESS, help=text,
                            **_argparse_settings(hints[field.name]), **extra)


def given_options(args: argparse.Namespace, fields_of: type = TrainConfig) -> dict:
    """The fields of ``fields_of`` (default :class:`TrainConfig`) the user passed on the command
    line, by field name (``model`` as a dict)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(fields_of) if hasattr(args, f.name)}
    if "model" in given:
        given["model"] = dict(given["model"])
    return given


@contextlib.contextmanager
def quiet_logs(quiet: bool):
    """Keep the package's INFO lines (which the command line sends to stderr) out of machine-readable
    output (``--json``)."""
    logger = logging.getLogger("attncnn")
    level = logger.level
    if quiet:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


#: the help of a ``RUN`` argument read by :func:`run_or_model`
RUN_HELP = "run folder, checkpoint file, or a trained model's name (quadratic-mini: its shipped run folder)"


def run_or_model(text: str) -> str:
    """A ``RUN`` argument (argparse ``type``): a run folder or checkpoint file as given, or, where no
    such path exists and ``text`` is a preset's name, the run folder of that trained model as
    :func:`attncnn.pretrained` finds it (seed 0). A path that exists wins, with one warning naming
    both. Anything else is returned as given, except a bare name close to a preset's.

    Raises:
        argparse.ArgumentTypeError: a preset's name with no trained model found (where it looked and
            the ways to get one); a bare name that is no path and no preset but close to one.
    """
    from ..api.pretrained import pretrained_path
    from ..errors import AttncnnError

    presets = list_presets()
    if Path(text).exists():
        if text in presets:
            _say_path_wins(text, pretrained_path)
        return text
    if text not in presets:
        close = difflib.get_close_matches(text, presets, n=3) if _bare_name(text) else []
        if close:
            raise argparse.ArgumentTypeError(f"no run folder or checkpoint at {text!r}, and no trained model of that "
                                             f"name; did you mean {' or '.join(close)}?")
        return text
    try:
        return str(pretrained_path(text))
    except (AttncnnError, FileNotFoundError) as err:
        raise argparse.ArgumentTypeError(f"no run folder or checkpoint at {text!r}, and no trained model of that "
                                         f"name: {err}") from None


def _bare_name(text: str) -> bool:
    """``text`` reads as a model's name, not a path (no folder in it, not a checkpoint file)."""
    return len(Path(text).parts) == 1 and not text.endswith(".safetensors") and not text.startswith(".")


def _say_path_wins(text: str, find) -> None:
    """Warn that the path ``text`` here is used although a trained model has that name too."""
    try:
        model = find(text)
    except (FileNotFoundError, ValueError):
        return                                  # no trained model of that name: nothing is shadowed
    log.warning(
        "%s: using the path %s here, not the trained model of that name (%s); name that one by its path, or run "
        "from another folder", text, Path(text).resolve(), model)
