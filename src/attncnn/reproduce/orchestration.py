"""Run one ``attncnn reproduce`` call (:class:`~.request.StudyRequest`): train any study of
:data:`~attncnn.reproduce.studies.STUDIES` (resumable), then write its report and figures (and a
suite's viewer page); or only estimate, or only report. A Table 1
suite (``mini``, ``mini-long``, ``paper-long``, ``paper``) and a sample-efficiency grid
(``efficiency``, ``efficiency-scarce``) take the same path through :mod:`.running` and
:mod:`.reporting`; a grid's calibration and learning-rate sweep measure its seen images per cell
and its shared rate."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ..errors import InputError
from .request import StudyRequest, check_request, viewer_images
from .studies import Grid, Study, Suite

log = logging.getLogger("attncnn.reproduce")
__all__ = ["run_study", "VIEWER_IMAGES", "VIEWER_AVERAGE"]

#: test images of the viewer page: the first of the paper's website (2, 3, 19, 56). Only content
#: models store maps per image (a few MB of page each, beside a few MB for all position-only models
#: together), so one image and no average keep the shipped page near 10 MB; the average is paper
#: Fig. 6 in the figures folder, and the options bring the rest back.
VIEWER_IMAGES = (2,)
VIEWER_AVERAGE = 0


def _options(request: StudyRequest):
    from .running.runner import TrainOptions

    return TrainOptions(data=request.data or "cifar10", data_dir=request.data_dir, download=request.download,
                        device=request.device, precision=request.precision, compile=request.compile,
                        epochs=request.epochs, train_subset=request.train_subset, batch_size=request.batch_size)


def _dry_run(jobs, options, out: Path, suite: str) -> None:
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
        return
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


def _train(jobs, options, request: StudyRequest) -> None:
    from ..analysis.metrics import epoch_metrics
    from .running.runner import train_jobs

    train_jobs(jobs, options, progress=request.progress, epoch_metrics=epoch_metrics,
               resume_hint=f"`{_command(request)}`")


def _command(request: StudyRequest) -> str:
    """The command line for the report and the resume hint: the call's own, else the study's plain run."""
    return request.command or f"attncnn reproduce {request.study}"


def run_study(request: StudyRequest) -> Path | None:
    """Do what ``request`` asks (its action on its study or measurement), printing what it does;
    returns the report written (None: a dry run or a measurement).

    Raises:
        InputError: options that do not fit (:func:`~.request.check_request`), nothing finished to
            report. TrainingInterrupted: a job stopped by Ctrl-C or SIGTERM (resumable: the same call
            continues). Anything training or reporting raises.
    """
    from .reporting.figures import draw_figures
    from .reporting.report import write_report
    from .reporting.results import finished_results
    from .running.jobs import plan_study

    study = check_request(request)
    out = Path(request.out or f"results/{request.study}")
    options = _options(request)
    if request.measurement is not None:
        _measure(request, study, out, options)
        return None
    only = tuple(p.strip() for p in request.only.split(",") if p.strip()) if request.only else None
    planned = _plan_options(request, study, options)
    jobs = plan_study(study, out, only=only, **planned)
    if request.action == "dry-run":
        _dry_run(jobs, options, out, request.study)
        return None
    if request.action == "train":
        _train(jobs, options, request)
    jobs = _whole_study(study, out, planned)
    results = finished_results(study, jobs)
    run = "cell" if isinstance(study, Grid) else "run"
    if not results:
        raise InputError(f"no finished {run} under {out} to report; train first (without --report-only)")
    formats = [f.strip() for f in request.formats.split(",") if f.strip()]
    figures = draw_figures(study, jobs, results, out / "figures", formats=formats, data=request.data,
                           data_dir=request.data_dir)
    if isinstance(study, Suite) and request.viewer:
        _viewer(results, out, request)
    path = write_report(study, out, jobs, results, figures, command=_command(request), data=request.data,
                        data_dir=request.data_dir)
    print(f"report: {path}")
    return path


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


def _plan_options(request: StudyRequest, study: Study, options) -> dict:
    """The options of :func:`~attncnn.reproduce.running.jobs.plan_study` the request sets."""
    from .running.jobs import parse_seeds

    if isinstance(study, Grid):
        return dict(seeds=parse_seeds(request.seeds), train_images=request.train_images, passes=request.passes,
                    fractions=_fractions(request.fractions), lr=request.lr)
    return dict(seeds=parse_seeds(request.seeds), epochs=options.epochs)


def _viewer(results, out: Path, request: StudyRequest) -> None:
    from ..analysis.runs import test_count
    from ..analysis.viewer.page import write_viewer
    from ..perf.precision import running_at

    # a run shipped without its weights has no maps to show
    firsts = [runs[0] for runs in results.values()
              if runs[0].run.model is not None and hasattr(runs[0].run.model.config, "attention")]
    if firsts:
        count = test_count(firsts[0].run, data=request.data, data_dir=request.data_dir)
        indices = [i for i in viewer_images(request.viewer_images) if i < count] or [0]   # a small data set has fewer
        with running_at("fp32"):
            # named after preset and seed (the folder names are all "seed0")
            runs = [dataclasses.replace(r.run, name=r.job.label) for r in firsts]
            page = write_viewer(runs, out / "viewer.html", indices=indices,
                                average=min(request.viewer_average, count), data=request.data,
                                data_dir=request.data_dir, title=f"attncnn reproduce {request.study}: trained models")
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


def _measure(request: StudyRequest, grid, out: Path, options) -> None:
    """A grid's calibration or learning-rate sweep: train its jobs (resumable), then print its result."""
    from .running.measurements import calibration_lines, write_sweep_report
    from .running.jobs import row_of
    from .running.measurements import parse_rates, plan_calibration, plan_lr_sweep, swept_rates

    fraction = min(_fractions(request.fractions)) if request.fractions else None   # default: the grid's smallest
    sizes = dict(passes=request.passes, train_images=request.train_images, fraction=fraction)
    calibrate = request.measurement == "calibrate"
    if calibrate:
        jobs = plan_calibration(grid, out, lr=request.lr, **sizes)
    else:
        rates = parse_rates(request.rates)
        jobs = plan_lr_sweep(grid, out, rates, **sizes)
    mine = jobs
    if request.only:
        # one process per model (e.g. side by side on a GPU); the printed result still covers every row
        rows = sorted({row_of(job) for job in jobs})
        only = [name.strip() for name in request.only.split(",") if name.strip()]
        unknown = [name for name in only if name not in rows]
        if unknown:
            raise InputError(f"--only {','.join(unknown)}: not measured by --{request.measurement}, which trains "
                             f"{', '.join(rows)}")
        mine = [job for job in jobs if row_of(job) in only]
    if request.action == "dry-run":
        _dry_run(mine, options, out, request.study)
        return
    if request.action == "train":
        _train(mine, options, request)
    if not calibrate:
        rates = swept_rates(jobs, rates)       # the report covers every rate already swept under --out
        jobs = plan_lr_sweep(grid, out, rates, **sizes)
    if calibrate:
        lines = calibration_lines(jobs, grid.overfit)
    else:
        lines = write_sweep_report(grid, out, jobs, rates, command=_command(request),
                                   held_out=_held_out(jobs, options))
    print("\n".join(lines))


def _held_out(jobs, options) -> dict:
    """The sweep's finished runs evaluated on training images outside their cell (cached in each
    run folder; the data set is loaded only when one is not)."""
    from ..data import load_dataset
    from .running.measurements import held_out_results

    return held_out_results([job.folder for job in jobs], lambda: load_dataset(
        options.data, data_dir=options.data_dir, download=options.download), device=options.device)
