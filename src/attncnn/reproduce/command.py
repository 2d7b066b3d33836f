"""``attncnn reproduce <study>``: train any study of :data:`~attncnn.reproduce.studies.STUDIES`
(resumable), then write its report and figures (and a suite's viewer page); ``--dry-run`` prints the
commands and the estimated time instead. A Table 1 suite (``mini``, ``mini-long``, ``paper-long``,
``paper``) and a sample-efficiency grid (``efficiency``, ``efficiency-scarce``) take the same path
through :mod:`.running` and :mod:`.reporting`; a grid's ``--calibrate`` and ``--lr-sweep`` measure
its seen images per cell and its shared rate."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
from pathlib import Path

from ..errors import InputError
from ..perf.precision import PRECISIONS
from .studies import EFFICIENCY, EFFICIENCY_SCARCE, GRIDS, STUDIES, SUITES, Grid, Study, Suite

log = logging.getLogger("attncnn.reproduce")
__all__ = ["register", "cmd_reproduce"]

#: test images of the viewer page: the first of the paper's website (2, 3, 19, 56). Only content
#: models store maps per image (a few MB of page each, beside a few MB for all position-only models
#: together), so one image and no average keep the shipped page near 10 MB; the average is paper
#: Fig. 6 in the figures folder, and the options bring the rest back.
VIEWER_IMAGES = (2,)
VIEWER_AVERAGE = 0


def register(subparsers) -> None:
    """Add the ``reproduce`` subcommand."""
    r = subparsers.add_parser(
        "reproduce", help="train a Table 1 suite (resumable) and write its report, figures and viewer page",
        description="Train every model of a suite in sequence into <out>/<preset>/seed<N> (ordinary run folders "
                    "with periodic checkpoints), skipping finished runs and resuming interrupted ones, then write "
                    "<out>/report.md (Table 1 beside the paper's, per-seed results, the paper's claims measured), "
                    "<out>/figures/ (Figs. 2-6, per-layer distances) and <out>/viewer.html. Stop it at any time "
                    "(Ctrl-C): the same command continues. Suites: " +
                    "; ".join(f"{s.name}: {s.description} ({', '.join(s.presets)})" for s in SUITES.values()) +
                    "".join(f"; {g.name}: {g.description} ({', '.join(g.presets)})" for g in GRIDS.values()) +
                    ": the grids write <out>/report.md (accuracy per model and training-set size, ConViT's claims "
                    "measured) and <out>/figures/.")
    r.add_argument("suite", choices=sorted(STUDIES))
    r.add_argument("--data", help="cifar10 (default) or an image folder/zip, as for `train`; for the report's "
                                   "test images: default each run's own")
    r.add_argument("--data-dir", help="cache folder for official archives")
    r.add_argument("--download", action="store_true", help="download official archives if missing")
    r.add_argument("--out", help="suite folder (default: results/<suite>)")
    r.add_argument("--seeds", help="comma-separated seeds for every model (default: 0, and 0,1,2 for the "
                                   "mini suite's quadratic and learned models, mini-long's quadratic, learned "
                                   "and resnet18 models, 0,1 for the efficiency grid's 10 %% cells)")
    r.add_argument("--only", help="comma-separated presets of the suite (rows of a grid, or of its --calibrate or "
                                  "--lr-sweep) to train (the report still covers every finished run under --out, "
                                  "so a suite run in parts keeps one report)")
    r.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N")
    r.add_argument("--precision", choices=PRECISIONS,
                   help="training precision of new runs and of resumed ones (default: the preset's, auto, for a new "
                        "run; a resumed run's own, but fp32 for a bf16 run on a device without fast bf16)")
    r.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the training step of new runs and of resumed ones (a machine's choice: "
                        "each epoch record says whether a compiled step trained it); --no-compile never "
                        "(default: this machine's measured choice, for a resumed run too)")
    r.add_argument("--epochs", type=int, help="override every model's epochs (smoke runs; the report shows it)")
    r.add_argument("--train-subset", type=int, metavar="N", help="train on N images (smoke runs)")
    r.add_argument("--batch-size", type=int, help="override every model's batch size (smoke runs on tiny data)")
    efficiency, scarce = EFFICIENCY, EFFICIENCY_SCARCE          # the grids whose defaults the help names
    r.add_argument("--train-images", type=int, metavar="N",
                   help=f"{efficiency.name}: size of the full training set, the 100 %% cell (default "
                        f"{efficiency.train_images:,}, CIFAR-10's)")
    r.add_argument("--passes", type=int, help=f"grids: seen images per cell in full training sets "
                                              f"(default {efficiency.name} {efficiency.passes}, {scarce.name} "
                                              f"{scarce.passes})")
    r.add_argument("--fractions", metavar="F,G,...",
                   help=f"grids: the training-set fractions of the cells (default {efficiency.name} "
                        f"{','.join(f'{f:g}' for f in efficiency.fractions)}, {scarce.name} "
                        f"{','.join(f'{f:g}' for f in scarce.fractions)}; e.g. 0.1,0.25,1 adds the 25 %% cell); "
                        "--calibrate and --lr-sweep train the smallest")
    r.add_argument("--lr", type=float, metavar="RATE",
                   help=f"{scarce.name}: the learning rate shared by its content models "
                        f"({', '.join(scarce.lr_rows)}; default {scarce.lr:g})")
    r.add_argument("--calibrate", action="store_true",
                   help=f"{scarce.name}: train {' and '.join(scarce.calibrate_rows)} on the 10 %% cell "
                        "(seed 0) for --passes into <out>/calibrate/passes<P>/ and print their train - test gap "
                        "beside the criterion (>= 15 points)")
    r.add_argument("--lr-sweep", metavar="R,S,...",
                   help=f"{scarce.name}: train {' and '.join(scarce.sweep_rows)} on the 10 %% cell (seed "
                        "0) at each rate (e.g. 2.5e-4,5e-4,1e-3) into <out>/lr-sweep/ and report the best rate for "
                        "both")
    r.add_argument("--dry-run", action="store_true",
                   help="print each job's train command and its time estimated from a short measurement here")
    r.add_argument("--report-only", action="store_true", help="train nothing; report what has finished")
    r.add_argument("--trim", action="store_true",
                   help="before reporting, trim finished run folders for committing (see "
                        "attncnn.reproduce.running.ship)")
    r.add_argument("--ship", action="store_true",
                   help="train nothing; prepare --out for `git add` when work stops: finished runs trimmed as with "
                        "--trim, each unfinished run reduced to its config, metrics and newest resumable checkpoint "
                        "(optimiser state included), then the report of what has finished. The same command "
                        "without --ship resumes the unfinished runs, also from a fresh clone (give --data)")
    r.add_argument("--without-weights", metavar="PRESET,...",
                   help="with --trim or --ship: ship the finished runs of these presets without their weights (too "
                        "large for the clone): their records stay (config, metrics, prediction record, attention per "
                        "layer measured now), and weights-withheld.json says what the weights were and how to train "
                        "them again; every command that needs them says so")
    r.add_argument("--weights-to", metavar="DIR",
                   help="with --without-weights: where the withheld weights go, as <DIR>/<preset>/seed<N>/checkpoints "
                        "(default: withheld-weights/<suite> in the working directory, ignored by git in a clone)")
    r.add_argument("--no-viewer", action="store_true", help="skip the viewer page")
    r.add_argument("--viewer-images", default=",".join(map(str, VIEWER_IMAGES)), metavar="I,J,...",
                   help="test images of the viewer page (default %(default)s; each costs a content model 3-5 MB "
                        "of page at width 64, position-only models nothing; the paper's site shows 2,3,19,56)")
    r.add_argument("--viewer-average", type=int, default=VIEWER_AVERAGE, metavar="N",
                   help="test images averaged in the viewer page's 'average' entry of content models (default "
                        "%(default)s: none, ~8 MB at width 64 for 100; paper Fig. 6's average is in figures/)")
    r.add_argument("--formats", default="png", help="figure formats, comma-separated (default png)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.set_defaults(handler=cmd_reproduce)


def _options(args: argparse.Namespace):
    from ..perf import resolve_device
    from .running.runner import TrainOptions

    for name in ("epochs", "train_subset", "batch_size", "train_images", "passes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    resolve_device(args.device)                 # a typo (--device gpu) is refused now, not in the first job
    _viewer_images(args.viewer_images)         # refused now, not after hours of training
    if args.viewer_average < 0:
        raise InputError(f"--viewer-average must be >= 0 (0: no average), got {args.viewer_average}")
    if args.precision is not None and (args.report_only or args.ship):
        raise InputError(f"--precision is the precision runs train at, and --{'ship' if args.ship else 'report-only'} "
                         "trains nothing (the report's figures and maps are computed in fp32); drop --precision")
    if args.compile is not None and (args.report_only or args.ship):
        raise InputError(f"--{'' if args.compile else 'no-'}compile is how runs train, and "
                         f"--{'ship' if args.ship else 'report-only'} trains nothing; drop it")
    return TrainOptions(data=args.data or "cifar10", data_dir=args.data_dir, download=args.download, device=args.device,
                        precision=args.precision, compile=args.compile, epochs=args.epochs,
                        train_subset=args.train_subset, batch_size=args.batch_size)


def _dry_run(jobs, options, out: Path, suite: str) -> int:
    from ..data import peek_dataset
    from ..perf import resolve_device
    from .running.jobs import job_state
    from .running.runner import busy_cpu, cpu_load, estimate_job, resume_command, train_command

    states = {job: job_state(job) for job in jobs}
    if all(state == "finished" for state in states.values()):
        fresh = Path("runs") / suite                 # a dry run writes nothing: any empty folder will do
        fresh = fresh if fresh.resolve() != out.resolve() else out.parent / f"{out.name}-fresh"
        print(f"# the {len(jobs)} run(s) of {suite} under {out} are all finished: nothing to train, nothing to "
              f"estimate. To estimate a fresh run on this machine, point --out at an empty folder:\n"
              f"attncnn reproduce {suite} --dry-run --out {fresh}")
        return 0
    data = peek_dataset(options.data, data_dir=options.data_dir)        # sizes only: decoding may take minutes
    print(f"# {data.describe()}")
    measured: dict = {}
    total = 0.0
    loads = [cpu_load()]
    for job in jobs:
        if states[job] == "finished":
            print(f"# {job.label}: finished in {job.folder}, skipped")
            continue
        if states[job] == "interrupted":
            print(f"# {job.label}: interrupted, resumed with: {resume_command(job, options)}")
        estimate = estimate_job(job, options, measured=measured, data=data)
        total += estimate.total_seconds
        print(f"{train_command(job, options)}\n    # {estimate.step_seconds:.2f} s/step, "
              f"~{estimate.epoch_seconds / 60:.1f} min/epoch, ~{estimate.total_seconds / 3600:.2f} h "
              f"({estimate.precision}; {estimate.compile})")
    print(f"# total ~{total / 3600:.1f} h on this device for what is left (from one timed step per model on "
          f"images of {data.image_shape[2]}x{data.image_shape[1]}; an interrupted run needs less)")
    warning = busy_cpu(loads + [cpu_load()]) if resolve_device(options.device).type == "cpu" else None
    if warning:
        print(f"# {warning}")
    return 0


def _train(jobs, options, args, command: str) -> None:
    from ..analysis.metrics import epoch_metrics
    from .running.runner import train_jobs

    train_jobs(jobs, options, progress=not args.no_progress, epoch_metrics=epoch_metrics,
               resume_hint=f"`{command}`")


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Run the command; returns the exit status."""
    from .reporting.figures import draw_figures
    from .reporting.report import write_report
    from .reporting.results import finished_results
    from .running.jobs import plan_study

    study = STUDIES[args.suite]
    out = Path(args.out or f"results/{args.suite}")
    only = tuple(p.strip() for p in args.only.split(",") if p.strip()) if args.only else None
    options = _options(args)
    from_cli = sys.argv[1:2] == ["reproduce"]
    command = shlex.join(["attncnn", *sys.argv[1:]]) if from_cli else f"attncnn reproduce {args.suite}"
    _check_study_options(args, study, options)
    if isinstance(study, Grid) and (args.calibrate or args.lr_sweep):
        return _measure(args, study, out, options, command)
    planned = _plan_options(args, study, options)
    jobs = plan_study(study, out, only=only, **planned)
    if args.dry_run:
        return _dry_run(jobs, options, out, args.suite)
    if not (args.report_only or args.ship):
        _train(jobs, options, args, command)
    jobs = _whole_study(study, out, planned)
    if args.trim or args.ship:
        _trim(study, jobs)
    if args.without_weights:
        from .withhold import presets_named, withhold_jobs
        presets = presets_named(study, args.without_weights, "--without-weights")
        for job, record, where in withhold_jobs(study, out, jobs, presets, weights_to=args.weights_to, data=args.data,
                                                data_dir=args.data_dir):
            print(f"{job.label}: shipped without its weights ({record['bytes'] / 1e6:.1f} MB, sha256 "
                  f"{record['sha256'][:16]}...); they are in {where}, outside what is committed")
    if args.ship:
        _ship_unfinished(study, jobs)
    results = finished_results(study, jobs)
    run = "cell" if isinstance(study, Grid) else "run"
    if not results and args.ship:
        print(f"no finished {run} under {out} yet, so no report; the unfinished {run}s are ready for `git add {out}`")
        return 0
    if not results:
        raise InputError(f"no finished {run} under {out} to report; train first (without --report-only)")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    figures = draw_figures(study, jobs, results, out / "figures", formats=formats, data=args.data,
                           data_dir=args.data_dir)
    if isinstance(study, Suite) and not args.no_viewer:
        _viewer(results, out, args)
    path = write_report(study, out, jobs, results, figures, command=command, data=args.data, data_dir=args.data_dir)
    print(f"report: {path}")
    return 0


def _check_study_options(args: argparse.Namespace, study: Study, options) -> None:
    """Refuse options the study's shape does not take, before anything trains.

    Raises:
        InputError: a grid's option given to a suite; ``--ship`` with ``--dry-run``; ``--epochs`` or
            ``--train-subset`` given to a grid (its cells set them); ``--lr`` to a grid without a
            shared rate.
    """
    if isinstance(study, Suite):
        given = [flag for flag, value in (("--train-images", args.train_images), ("--passes", args.passes),
                                          ("--fractions", args.fractions), ("--lr", args.lr),
                                          ("--calibrate", args.calibrate), ("--lr-sweep", args.lr_sweep)) if value]
        if given:
            raise InputError(f"{', '.join(given)} {'belongs' if len(given) == 1 else 'belong'} to the grids "
                             f"({', '.join(GRIDS)}), not to suite {args.suite}")
    if args.ship and args.dry_run:
        raise InputError("--ship trains nothing and writes the folder for committing; leave out --dry-run")
    if args.without_weights and (not (args.trim or args.ship) or args.dry_run):
        raise InputError("--without-weights ships finished runs without their weights: give it with --trim or --ship "
                         "(and without --dry-run)")
    if args.without_weights:
        from .withhold import presets_named
        presets_named(study, args.without_weights, "--without-weights")       # refused now, not after training
    if isinstance(study, Grid):
        if options.epochs is not None or options.train_subset is not None:
            raise InputError(f"the {study.name} grid sets each cell's epochs and subset itself; for a smoke run use "
                             "--train-images (a small training set) and --passes instead of --epochs/--train-subset")
        if args.lr is not None and not study.lr_rows:
            raise InputError(f"--lr sets the shared rate of a grid's content models; the {study.name} grid has none")


def _whole_study(study: Study, out: Path, planned: dict) -> list:
    """The jobs to trim and report: the whole study, not only what this call trained. A study run in
    parts (``--only`` one model, ``--seeds`` one seed at a time) must not drop the runs made earlier
    from its report. So: every preset (row) with this call's seeds, and every run folder that exists
    of the study's own seeds or of any other seed (``seed<N>`` beside a planned one; a smoke run
    with ``--seeds 0`` does not list the default seeds it never meant to train). Ordered as planned,
    each row's (and cell's) seeds ascending, so that its first run is its lowest seed whatever this
    call's ``--seeds`` (the figures draw a row's first run)."""
    from .running.jobs import plan_study, row_of

    jobs = plan_study(study, out, **planned)
    candidates = plan_study(study, out, **{**planned, "seeds": None})
    on_disk = {int(folder.name.removeprefix("seed")) for job in [*jobs, *candidates]
               for folder in job.folder.parent.glob("seed*")
               if folder.is_dir() and folder.name.removeprefix("seed").isdigit()}
    if on_disk:
        candidates += plan_study(study, out, **{**planned, "seeds": tuple(sorted(on_disk))})
    folders = {job.folder for job in jobs}
    for job in candidates:
        if job.folder not in folders and job.folder.is_dir():
            jobs.append(job)
            folders.add(job.folder)
    places = list(dict.fromkeys((row_of(job), job.cell) for job in jobs))
    return sorted(jobs, key=lambda job: (places.index((row_of(job), job.cell)), job.seed))


def _plan_options(args: argparse.Namespace, study: Study, options) -> dict:
    """The options of :func:`~attncnn.reproduce.running.jobs.plan_study` the command line sets."""
    from .running.jobs import parse_seeds

    if isinstance(study, Grid):
        return dict(seeds=parse_seeds(args.seeds), train_images=args.train_images, passes=args.passes,
                    fractions=_fractions(args.fractions), lr=args.lr)
    return dict(seeds=parse_seeds(args.seeds), epochs=options.epochs)


def _trim(study: Study, jobs) -> None:
    """``--trim``: finished runs trimmed for committing. A suite keeps the periodic checkpoints of
    the run that draws its centres over epochs, when they come from checkpoints; a grid's cells are
    trimmed lean (``last`` alone)."""
    from .running.ship import trim_jobs

    if isinstance(study, Grid):
        trim_jobs(jobs, keep_epochs_of=set(), lean=True)
        return
    trim_jobs(jobs, keep_epochs_of=_evolution_run(study, jobs))


def _evolution_run(study: Study, jobs) -> set[tuple[str, int]]:
    """``{(preset, seed)}`` of the run whose periodic checkpoints a suite's figure of the centres
    over the epochs (paper Fig. 3) is drawn from (its first seed), or none: a grid, or a suite that
    draws it from the epochs' records."""
    if isinstance(study, Grid) or study.evolution_from != "checkpoints":
        return set()
    seeds = [j.seed for j in jobs if j.preset == study.evolution_preset]
    return {(study.evolution_preset, min(seeds))} if seeds else set()


def _ship_unfinished(study: Study, jobs) -> None:
    """``--ship``: started, unfinished runs reduced to what resuming them elsewhere needs (a content
    model's cell of the scarce grid outlives a session on two CPU cores, as a suite's run does), the
    periodic checkpoints of a suite's Fig. 3 run kept as weights."""
    from .running.unfinished import ship_unfinished_jobs

    for job, before, after in ship_unfinished_jobs(jobs, keep_epochs_of=_evolution_run(study, jobs)):
        print(f"unfinished {job.label}: {job.folder} ready to commit ({before / 1e6:.1f} MB -> {after / 1e6:.1f} MB, "
              "resumable)")


def _viewer_images(text: str) -> list[int]:
    """``"2,3"`` -> ``[2, 3]``.

    Raises:
        InputError: not a comma-separated list of test image indices >= 0.
    """
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        indices = []
    if not indices or min(indices) < 0:
        raise InputError(f"--viewer-images must be comma-separated test image indices >= 0 (e.g. 2,3), got {text!r}")
    return indices


def _viewer(results, out: Path, args: argparse.Namespace) -> None:
    from ..analysis.runs import test_count
    from ..analysis.viewer.page import write_viewer
    from ..perf.precision import running_at

    # a run shipped without its weights has no maps to show
    firsts = [runs[0] for runs in results.values()
              if runs[0].run.model is not None and hasattr(runs[0].run.model.config, "attention")]
    if firsts:
        count = test_count(firsts[0].run, data=args.data, data_dir=args.data_dir)
        indices = [i for i in _viewer_images(args.viewer_images) if i < count] or [0]   # a small data set has fewer
        with running_at("fp32"):
            # named after preset and seed (the folder names are all "seed0")
            runs = [dataclasses.replace(r.run, name=r.job.label) for r in firsts]
            page = write_viewer(runs, out / "viewer.html", indices=indices,
                                average=min(args.viewer_average, count), data=args.data, data_dir=args.data_dir,
                                title=f"attncnn reproduce {args.suite}: trained models")
        log.info("viewer: %s (%.1f MB)", page, page.stat().st_size / 1e6)


def _fractions(text: str | None) -> tuple[float, ...] | None:
    """``"0.1,0.25,1"`` -> ``(0.1, 0.25, 1.0)``; None stays None (the grid's).

    Raises:
        InputError: an entry that is not a number.
    """
    if text is None:
        return None
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"--fractions must be comma-separated fractions like 0.1,0.25,1, got {text!r}") from None


def _measure(args: argparse.Namespace, grid, out: Path, options, command: str) -> int:
    """``--calibrate`` or ``--lr-sweep``: train the measurement's jobs (resumable), then print its result."""
    from .reporting.measurements import calibration_lines, write_sweep_report
    from .running.jobs import row_of
    from .running.measurements import parse_rates, plan_calibration, plan_lr_sweep, swept_rates

    if args.calibrate and args.lr_sweep:
        raise InputError("--calibrate and --lr-sweep are two measurements; run them one at a time")
    if args.seeds or args.trim:
        raise InputError("--calibrate and --lr-sweep choose their own seed (0); leave out --seeds and --trim (--ship "
                         "trims what has finished)")
    fraction = min(_fractions(args.fractions)) if args.fractions else None      # default: the grid's smallest
    if args.calibrate:
        jobs = plan_calibration(grid, out, passes=args.passes, train_images=args.train_images, lr=args.lr,
                                fraction=fraction)
    else:
        if args.lr is not None:
            raise InputError("--lr-sweep trains at each of its rates; leave out --lr")
        rates = parse_rates(args.lr_sweep)
        jobs = plan_lr_sweep(grid, out, rates, passes=args.passes, train_images=args.train_images, fraction=fraction)
    mine = jobs
    if args.only:
        # one process per model (e.g. side by side on a GPU); the printed result still covers every row
        rows = sorted({row_of(job) for job in jobs})
        only = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in only if name not in rows]
        if unknown:
            measurement = "--calibrate" if args.calibrate else "--lr-sweep"
            raise InputError(f"--only {','.join(unknown)}: not measured by {measurement}, which trains "
                             f"{', '.join(rows)}")
        mine = [job for job in jobs if row_of(job) in only]
    if args.dry_run:
        return _dry_run(mine, options, out, args.suite)
    if not (args.report_only or args.ship):
        _train(mine, options, args, command)
    if not args.calibrate:
        rates = swept_rates(jobs, rates)       # the report covers every rate already swept under --out
        jobs = plan_lr_sweep(grid, out, rates, passes=args.passes, train_images=args.train_images, fraction=fraction)
    if args.ship:
        _trim(grid, jobs)                  # finished measurement runs are the grid's own seed-0 cells
        _ship_unfinished(grid, jobs)
    if args.calibrate:
        lines = calibration_lines(jobs, grid.overfit)
    else:
        lines = write_sweep_report(grid, out, jobs, rates, command=command, held_out=_held_out(jobs, options))
    print("\n".join(lines))
    return 0


def _held_out(jobs, options) -> dict:
    """The sweep's finished runs evaluated on training images outside their cell (cached in each
    run folder; the data set is loaded only when one is not)."""
    from ..data import load_dataset
    from .running.held_out import held_out_results

    return held_out_results([job.folder for job in jobs], lambda: load_dataset(
        options.data, data_dir=options.data_dir, download=options.download), device=options.device)
