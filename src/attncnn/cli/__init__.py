"""Command line: ``attncnn <command>``. Thin: parses arguments, calls the library.

One module per command (:data:`COMMANDS`), each with ``register(sub)``: it adds its parser(s) with
``set_defaults(handler=fn)``, where ``fn(args)`` runs the command (importing the library only then)
and returns the exit status. Shared parser pieces: :mod:`._parsing`. Nothing in the library imports
this package.

User errors (:class:`attncnn.AttncnnError`) become one line on stderr and exit status 2; any other
exception keeps its traceback (status 1). A training run stopped by SIGINT / SIGTERM saves a
resumable checkpoint, prints the ``--resume`` command and exits with 130 / 143.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import signal
import sys

from ..errors import AttncnnError
from ._parsing import DefaultsHelpFormatter, Parser

__all__ = ["main", "console_main", "build_parser", "DefaultsHelpFormatter", "COMMANDS"]

log = logging.getLogger("attncnn")

#: the modules of this package that each add a command (or a few), in the order ``attncnn --help``
#: lists them. Adding a command: a module with ``register(sub)`` here, and its name in this list.
COMMANDS = ("train", "evaluate", "presets", "theorem", "plot", "inspect", "report", "prune", "viewer", "bench",
            "reproduce", "reference", "download")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``attncnn`` with every command of :data:`COMMANDS`."""
    parser = Parser(prog="attncnn", description=(
        "Self-attention as convolution (Cordonnier, Loukas & Jaggi, ICLR 2020): train, evaluate, inspect."))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


#: the commands that run models here: the process-wide settings of :func:`_process_setup` are theirs
_MODEL_COMMANDS = ("train", "evaluate", "bench", "reproduce", "prune")


def _process_setup(args: argparse.Namespace) -> None:
    """The process-wide state the library leaves to its caller, set once before the command runs (an
    environment already set wins): ``CUBLAS_WORKSPACE_CONFIG`` for ``train --deterministic`` and
    ``train --resume`` (cuBLAS reads it when CUDA is first used;
    :func:`attncnn.training.components.deterministic_algorithms` checks it), and on the CPU glibc's
    keeping of freed memory (:mod:`attncnn.perf.host_memory`)."""
    if args.command == "train" and (getattr(args, "deterministic", False) or args.resume):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.command in _MODEL_COMMANDS:
        from ..perf import resolve_device
        from ..perf.host_memory import reuse_freed_memory

        if resolve_device(getattr(args, "device", None) or "auto").type == "cpu":
            reuse_freed_memory()


class _ReportedInterrupt(KeyboardInterrupt):
    """Ctrl-C whose consequence (the saved checkpoint, the ``--resume`` command) is already printed."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``attncnn`` command given by ``argv`` in this process; returns the exit status.

    Errors a user can fix (:class:`attncnn.AttncnnError`) become one line on stderr,
    ``attncnn <command>: error: <message>``, and status 2; SIGTERM during training, status 143 after
    the ``--resume`` line. Any other exception propagates with its traceback.

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT), also after training saved a checkpoint (the ``--resume``
            line is printed first), so that an in-process caller stops too; :func:`console_main`
            turns it into status 130.
    """
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["attncnn", *argv])      # what a command says to run again (reproduce)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from ..training import TrainingInterrupted

    try:
        _process_setup(args)
        return args.handler(args)
    except TrainingInterrupted as err:
        print(f"attncnn {args.command}: {err}", file=sys.stderr)
        if err.signum == signal.SIGINT:
            raise _ReportedInterrupt() from err
        return err.exit_status
    except AttncnnError as err:       # a user error; any other exception is a bug and keeps its traceback
        print(f"attncnn {args.command}: error: {err}", file=sys.stderr)
        return 2


def console_main(argv: list[str] | None = None) -> int:
    """The ``attncnn`` executable: :func:`main`, with Ctrl-C as one line and exit status 130
    (the shell's convention for SIGINT) instead of a traceback."""
    try:
        return main(argv)
    except KeyboardInterrupt as err:
        if not isinstance(err, _ReportedInterrupt):
            print("attncnn: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT

