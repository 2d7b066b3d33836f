"""``attncnn train``: train a preset (or resume a run) into a run folder and print its test accuracy."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..errors import InputError, MissingFileError
from ._parsing import add_config_options, flag_name, given_options

__all__ = ["register", "handle"]


def register(sub) -> None:
    """Add ``train``: one flag per :class:`~attncnn.runs.TrainConfig` field (the recipe) and per
    :class:`~attncnn.training.RunOptions` field (how this machine runs it)."""
    from ..training.run_options import RunOptions

    t = sub.add_parser("train", help="train a preset and print its test accuracy",
                       description="Train a preset (`attncnn presets` lists them; --preset demo trains a "
                                   "79 k-parameter model in minutes on a CPU) into a run folder and print its "
                                   "test accuracy. Options you do not pass take the preset's recipe.")
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

    t.set_defaults(handler=handle)


def _point_resumed_run_at_data(out: Path, given: dict, main: bool = True) -> None:
    """``train --resume RUN --data PATH``: record where the run's own data set is on this machine
    (:func:`attncnn.runs.point_at_data`); without ``--data``, a run whose data set is not here is
    refused before anything loads. Under ``torchrun`` only rank 0 rewrites ``config.json``; the other
    ranks wait for it (:func:`attncnn.runs.await_pointed`).

    Raises:
        InputError: ``--data`` names another data set (file name) than the run's; no ``--data`` for
            a run whose data set is not on this machine.
        RunFolderError: on a rank > 0, rank 0 did not rewrite ``config.json`` in time.
    """
    from ..runs import RunFolder, await_pointed, point_at_data, same_data_file

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


def handle(args: argparse.Namespace) -> int:
    from ..analysis.metrics import epoch_metrics
    from ..perf import make_plan, resume_plan
    from ..runs import RunFolder, TrainConfig, checkpoint_of, resolve_config
    from ..training import RunOptions, train
    from ..training.distributed import is_main_process

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
        if mode == "new":
            RunFolder.check_new(out)              # a repeated command: refused before anything is loaded
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
