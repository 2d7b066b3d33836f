"""The arguments of the commands that read trained runs (``evaluate``, ``prune``, ``inspect``,
``report``): where the run is, and which data, device, precision and output it runs with. Declared
once here; each command names the ones it takes, in its ``--help`` order, with its own help text
where its meaning differs, and passes them on with :func:`run_keywords`."""

from __future__ import annotations

import argparse

from ..runs.config import PRECISIONS
from ._parsing import RUN_HELP, run_or_model

__all__ = ["add_run_arguments", "run_keywords"]

#: flag -> argparse settings; the help a command gives replaces the one here
_OPTIONS = {
    "--checkpoint": {"metavar": "NAME"},
    "--data": {},
    "--data-dir": {},
    "--download": {"action": "store_true", "help": "download official archives if missing"},
    "--device": {"default": "auto", "help": "auto, cpu, cuda, cuda:N"},
    "--batch-size": {"type": int},
    "--precision": {"choices": PRECISIONS},
    "--json": {"action": "store_true", "help": "print one JSON object"},
    "--no-progress": {"action": "store_true"},
}
#: the settings that become keyword arguments of the library call, by name (and ``--no-progress``: ``progress``)
_KEYWORDS = ("checkpoint", "data", "data_dir", "download", "device", "batch_size", "precision")


def add_run_arguments(parser: argparse.ArgumentParser, *names: str, **settings) -> None:
    """Add ``names`` to ``parser`` in this order: ``"RUN"`` (one run argument, dest ``run``),
    ``"RUN..."`` (any number, dest ``runs``), ``"RUN_OR_CHECKPOINT"`` (one, dest ``path``), each read
    by :func:`~attncnn.cli._parsing.run_or_model`; ``"--precision=measure"`` (fp32 by default) or a
    flag of :data:`_OPTIONS`.

    ``settings`` are argparse settings by destination (``data_dir={"help": ...}``) or a help text
    alone (``data="..."``), taking the place of the defaults here.
    """
    for name in names:
        if name == "RUN":
            parser.add_argument("run", metavar="RUN", type=run_or_model, help=RUN_HELP)
        elif name == "RUN...":
            parser.add_argument("runs", nargs="*", metavar="RUN", type=run_or_model, help=RUN_HELP)
        elif name == "RUN_OR_CHECKPOINT":
            parser.add_argument("path", metavar=name, type=run_or_model, **_given(settings.get("path")))
        elif name == "--precision=measure":         # the maps and metrics a command prints are measurements
            parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                                help="precision of the model's forward passes (default fp32: maps and metrics are "
                                     "measurements; bf16 or auto to see them as a bf16 run computes them)")
        else:
            parser.add_argument(name, **{**_OPTIONS[name], **_given(settings.get(name[2:].replace("-", "_")))})


def _given(setting) -> dict:
    """A command's setting as argparse keywords (a text alone is a help text)."""
    return {} if setting is None else {"help": setting} if isinstance(setting, str) else setting


def run_keywords(args: argparse.Namespace) -> dict:
    """The keyword arguments of the library call from the run arguments a command took
    (``--no-progress`` as ``progress=False``)."""
    found = {dest: getattr(args, dest) for dest in _KEYWORDS if hasattr(args, dest)}
    if hasattr(args, "no_progress"):
        found["progress"] = not args.no_progress
    return found
