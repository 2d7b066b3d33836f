"""Command line: ``attncnn train | evaluate | presets``. Thin: parses arguments, calls the library.

User errors (:class:`attncnn.AttncnnError`) become one line on stderr and exit status 2; any other
exception keeps its traceback (exit status 1). A training run stopped
by SIGINT / SIGTERM saves a resumable checkpoint, prints the ``--resume`` command on stderr and
exits with 130 / 143. Called in-process, :func:`main` lets Ctrl-C through as KeyboardInterrupt
(so that a test suite calling it stops); the executable, :func:`console_main`, makes it 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

from .analysis import command as analysis_command
from .analysis.viewer import command as viewer_command
from .api import download_command
from .errors import AttncnnError, InputError, MissingFileError
from .perf.bench import command as bench_command
from .perf.precision import PRECISIONS
from .reproduce import command as reproduce_command
from .reproduce import prune as prune_command
from .runs.options import add_config_options, flag_name, given_options
from .theory import command as theory_command

__all__ = ["main", "console_main", "build_parser", "DefaultsHelpFormatter"]

log = logging.getLogger("attncnn")


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


class _Parser(argparse.ArgumentParser):
    """The parser of ``attncnn`` and every subcommand: defaults shown in ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "(default: %(default)s)"      # argparse prints no line for an option without help
        return action


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attncnn", description=(
        "Self-attention as convolution (Cordonnier, Loukas & Jaggi, ICLR 2020): train, evaluate, inspect."))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train a preset and print its test accuracy",
                       description="Train a preset (`attncnn presets` lists them; --preset demo trains a "
                                   "79 k-parameter model in minutes on a CPU) into a run folder and print its "
                                   "test accuracy. Options you do not pass take the preset's recipe.")
    from .training.run_options import RunOptions

    add_config_options(t)     # the recipe: one flag per TrainConfig field, with the field's help
    t.add_argument("--out", help="run folder (default: runs/<preset>)")
    t.add_argument("--resume", nargs="?", const=True, metavar="RUN",
                   help="continue the run in --out (or RUN) from its last checkpoint with its recipe (config.json) "
                        "and this command's run-time options (without --precision: the run's own, but fp32 for a "
                        "bf16 run on a device without fast bf16; without --deterministic or --no-deterministic: as "
                        "it ran before); --data says where the run's own data set (the same file name) is on this "
                        "machine: a run shipped from another machine records only its name")
    t.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    machine = t.add_argument_group("run-time options", "how this machine runs the run: never part of its recipe "
                                   "(config.json); machine.json records them for each segment of the run")
    add_config_options(machine, RunOptions)

    e = sub.add_parser("evaluate", help="test accuracy and loss of a run folder or checkpoint")
    e.add_argument("path", metavar="RUN_OR_CHECKPOINT")
    e.add_argument("--checkpoint", metavar="NAME",
                   help="which checkpoint of a run folder: last (default: the final weights, the epoch the "
                        "reports quote), best (the epoch of highest test accuracy), epoch_0010, ...")
    e.add_argument("--data", help="dataset (default: the run's own: its recorded path, or for an older or shared "
                                  "run a relative one looked for from here, the run folder and the folders above "
                                  "it; never another data set)")
    e.add_argument("--data-dir", help="cache folder for official archives (default: $ATTNCNN_DATA_DIR or "
                                      "~/.cache/attncnn)")
    e.add_argument("--download", action="store_true", help="download official archives if missing")
    e.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    e.add_argument("--batch-size", type=int, default=500, help="images per forward pass")
    e.add_argument("--precision", choices=PRECISIONS,
                   help="default: the run's own (fp32 for runs from before --precision existed), but fp32 for a "
                        "bf16 run on a device without fast bf16 (a CPU without AVX512-BF16 or AMX); auto: the "
                        "device's choice")
    e.add_argument("--sample", type=int, metavar="N",
                   help="evaluate a fixed sample of N test images, as equally many of each class as possible "
                        "(the same images every time: seed 0), instead of all of them")
    e.add_argument("--predictions", metavar="FILE",
                   help="also write the top-1 class predicted for each evaluated image to FILE (JSON; beside a "
                        "run: its folder's predictions.json, which checks of the run compare a --sample with)")
    e.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("presets", help="list presets with exact parameter counts")
    p.add_argument("--json", action="store_true", help="print JSON (with each preset's model options and recipe)")

    t.set_defaults(handler=_cmd_train)
    e.set_defaults(handler=_cmd_evaluate)
    p.set_defaults(handler=_cmd_presets)
    # The other subcommands live beside their library: each module's register(sub) adds parsers whose
    # handler is a function (args) -> exit status and imports that library only when the command runs.
    theory_command.register(sub)
    analysis_command.register(sub)
    prune_command.register(sub)
    viewer_command.register(sub)
    bench_command.register(sub)
    reproduce_command.register(sub)
    download_command.register(sub)
    return parser


def _point_resumed_run_at_data(out: Path, given: dict, main: bool = True) -> None:
    """``train --resume RUN --data PATH``: record where the run's own data set is on this machine
    (:func:`attncnn.runs.point_at_data`). Without ``--data``, a run whose data set is not here is
    refused before anything loads, with the flag that fixes it. Under ``torchrun`` only rank 0
    (``main``) rewrites ``config.json``; the other ranks check the same options and wait for it
    (:func:`attncnn.runs.await_pointed`), so no rank resumes with the old configuration.

    Raises:
        InputError: ``--data`` names another data set (file name) than the run's; no ``--data`` for
            a run whose data set is not on this machine.
        RunFolderError: on a rank > 0, rank 0 did not rewrite ``config.json`` in time.
    """
    from .runs import RunFolder, await_pointed, point_at_data, same_data_file

    stored = RunFolder(out, mode="read").read_config().get("data")
    if not isinstance(stored, str):
        return
    if "data" not in given:
        # found here (a relative path is recorded absolute), or refused with the flag that fixes it
        (point_at_data if main else await_pointed)(out, None)
        return
    if not same_data_file(stored, given["data"]):
        raise InputError(f"{out} was trained on {Path(stored).name}; with --resume, --data can only say where that "
                         f"data set is on this machine, got {given['data']!r} (start a new run with --init-from "
                         "to train on another)")
    (point_at_data if main else await_pointed)(out, given["data"])


def _cmd_train(args: argparse.Namespace) -> int:
    from .analysis.metrics import epoch_metrics
    from .perf import make_plan, resume_plan
    from .runs import RunFolder, TrainConfig, checkpoint_of, resolve_config
    from .training import RunOptions, train
    from .training.distributed import is_main_process

    given = given_options(args)                  # only the recipe's options the user passed
    options = RunOptions(**given_options(args, RunOptions))     # this machine's: never in config.json
    if "preset" not in given and not args.resume:
        raise InputError("--preset is required: e.g. --preset demo (a 79 k-parameter model, 5 epochs, minutes on "
                         "a CPU); `attncnn presets` lists them all with their parameter counts")
    preset = given.pop("preset", TrainConfig.preset)
    resume_path = args.resume if isinstance(args.resume, str) else None
    out = Path(resume_path or args.out or f"runs/{preset}")
    if args.resume and args.overwrite:
        raise InputError("--resume and --overwrite exclude each other")
    mode = "resume" if args.resume else ("overwrite" if args.overwrite else "new")
    config = None
    if mode == "resume":
        # A resumed run uses its stored recipe; silently dropping a changed option would let a
        # user believe e.g. --epochs took effect. The run-time options are this machine's: a run
        # started on a GPU in bf16 may resume on a CPU without bf16 units, in fp32.
        flags = [flag_name(f) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name) and f.name != "data"]
        if flags:
            raise InputError(f"--resume continues with the run's stored recipe (config.json); {', '.join(flags)} "
                             "cannot change it (only the run-time options can, and --data says where its data "
                             "set is here). Drop them, or start a new run with --init-from on its checkpoint")
    if is_main_process():
        RunFolder.check_not_in_use(out)           # before the plan's measurements: another process trains there
    if mode == "resume":
        _point_resumed_run_at_data(out, given, main=is_main_process())
        plan = resume_plan(out, options)
    else:
        if "init_from" in given:                  # a run folder means its last checkpoint, as for every command
            try:
                given["init_from"] = str(checkpoint_of(given["init_from"]))
            except FileNotFoundError as err:
                raise MissingFileError(f"--init-from: {err}") from err
        config = resolve_config(preset, **given)  # rejects bad model options from their configuration alone
        plan = make_plan(config, options)         # this machine's device, precision, paths, compile
    summary = train(config, out, plan, mode=mode, progress=not args.no_progress, epoch_metrics=epoch_metrics)
    if not is_main_process():
        return 0          # under torchrun, rank 0 reports for every process
    final = summary["final"]
    print(f"run folder: {out}")
    if final:
        print(f"test accuracy: {final['test_accuracy']:.4f}  (test loss {final['test_loss']:.4f}, "
              f"epoch {final['epoch']}, best {summary['best']['accuracy']:.4f} at epoch {summary['best']['epoch']})")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from .api.classifier import training_image_size
    from .data import DeviceLoader, ImageSplit, class_balanced_subset, load_dataset, run_data
    from .perf import device_name, machine_precision, resolve_device
    from .runs import PredictionRecord, checkpoint_of, load_model, trained_precision, write_predictions
    from .runs.loading import OLD_MACHINE_FIELDS
    from .training import evaluate

    device = resolve_device(args.device)
    checkpoint = checkpoint_of(args.path, args.checkpoint)     # a run folder: its last, unless --checkpoint
    model, meta = load_model(checkpoint, device)
    stored = meta.get("config", {})
    spec = run_data(stored.get("data"), args.data, run=checkpoint)
    dataset = load_dataset(spec, data_dir=args.data_dir or meta.get(OLD_MACHINE_FIELDS, {}).get("data_dir"),
                           download=args.download)
    classes = meta.get("classes")
    if classes is not None and len(classes) != dataset.num_classes:
        raise InputError(f"the model has {len(classes)} classes but {spec} has {dataset.num_classes}; "
                         "pass the --data the model was trained on")
    trained, given = training_image_size(meta), tuple(dataset.test.images.shape[-2:])
    if trained is not None and given != trained:
        raise InputError(f"{checkpoint} was trained on {trained[0]}x{trained[1]} images (height x width), but the "
                         f"test images of {spec} are {given[0]}x{given[1]}; its answers for another size are "
                         f"unreliable. Evaluate it on images of {trained[0]}x{trained[1]} (the data set it was "
                         "trained on), or resize them first")
    test, indices = dataset.test, None
    if args.sample is not None:
        if not 1 <= args.sample <= len(test):
            raise InputError(f"--sample must be between 1 and {len(test)} (the test images of {spec}), "
                             f"got {args.sample}")
        indices = class_balanced_subset(test.labels, args.sample, seed=0)
        test = ImageSplit(test.images[indices], test.labels[indices])
    loader = DeviceLoader(test, batch_size=args.batch_size, device=device, train=False)
    precision = machine_precision(trained_precision(checkpoint, meta), device, args.precision, what=str(args.path))
    result = evaluate(model, loader, precision=precision, keep_predictions=args.predictions is not None)
    out = {"path": str(args.path), "checkpoint": str(checkpoint), "dataset": dataset.source,
           "epoch": meta.get("epoch"), "precision": precision,
           "test_accuracy": result.accuracy, "test_loss": result.loss, "examples": result.examples,
           "seconds": round(result.seconds, 3)}
    if args.sample is not None:
        out["sample"] = args.sample
    if args.predictions is not None:
        write_predictions(args.predictions, PredictionRecord(
            checkpoint=checkpoint.name, epoch=meta.get("epoch"), dataset=dataset.shareable_name, precision=precision,
            torch=torch.__version__, test_accuracy=result.accuracy,
            indices=None if indices is None else indices.tolist(), predictions=result.predictions.tolist(),
            device=device_name(device)))
        out["predictions"] = str(args.predictions)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"test accuracy: {result.accuracy:.4f}  test loss: {result.loss:.4f}  "
              f"({result.examples} {'sampled ' if indices is not None else ''}images of {dataset.source}, "
              f"epoch {meta.get('epoch')}, {precision})")
        print(f"checkpoint: {checkpoint}")
        if args.predictions is not None:
            print(f"predictions: {args.predictions}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from .models import build_model, count_parameters, get_preset, list_presets

    rows = []
    for name in list_presets():
        preset = get_preset(name)
        rows.append({"name": name, "parameters": count_parameters(build_model(name)), "arch": preset.arch,
                     "description": preset.description, "paper_accuracy": preset.paper.get("accuracy"),
                     "paper_parameters": preset.paper.get("params"), "model": preset.model,
                     "recipe": preset.train})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len("preset"), *(len(r["name"]) for r in rows))
    print(f"{'preset':<{width}} {'parameters':>12}  {'paper acc.':>10}  description")
    for r in rows:
        acc = "-" if r["paper_accuracy"] is None else f"{r['paper_accuracy']:.3f}"
        print(f"{r['name']:<{width}} {r['parameters']:>12,}  {acc:>10}  {r['description']}")
    return 0


#: the commands that run models here: the process-wide settings of :func:`_process_setup` are theirs
_MODEL_COMMANDS = ("train", "evaluate", "bench", "reproduce", "prune")


def _process_setup(args: argparse.Namespace) -> None:
    """The process-wide state the library leaves to its caller, set once before the command runs.

    cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when CUDA first uses it, so a deterministic run's value is
    set before anything touches CUDA: for ``train --deterministic``, and for ``train --resume``, whose
    stored recipe may be deterministic (the value only fixes cuBLAS's workspace: 8 buffers of 4 MiB;
    the library checks it, :func:`attncnn.training.components.deterministic_algorithms`). On the
    CPU, glibc keeps freed memory for reuse (:mod:`attncnn.perf.host_memory`): the large tensors of
    a step no longer page-fault in every step. An environment already set wins.
    """
    if args.command == "train" and (getattr(args, "deterministic", False) or args.resume):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.command in _MODEL_COMMANDS:
        from .perf import resolve_device
        from .perf.host_memory import reuse_freed_memory

        if resolve_device(getattr(args, "device", None) or "auto").type == "cpu":
            reuse_freed_memory()


class _ReportedInterrupt(KeyboardInterrupt):
    """Ctrl-C whose consequence (the saved checkpoint, the ``--resume`` command) is already printed."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``attncnn`` command given by ``argv`` in this process; returns the exit status.

    Errors a user can fix (:class:`attncnn.AttncnnError` and its subclasses) become one line on stderr,
    ``attncnn <command>: error: <message>``, and status 2; SIGTERM during training, status 143 after the
    ``--resume`` line. Any other exception is a bug: it propagates with its traceback
    (:func:`console_main` then exits with Python's status 1).

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT), also when training turned it into a saved checkpoint
            (the ``--resume`` line is printed first). It is not turned into a status here so that
            an in-process caller stops too: a test suite calling ``main`` must end on Ctrl-C, not
            record one failed test and go on. :func:`console_main` turns it into status 130.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from .training import TrainingInterrupted

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


if __name__ == "__main__":
    sys.exit(console_main())
