"""Run one ``attncnn reproduce`` call (:class:`~.request.StudyRequest`), :func:`run_study`: train any
study (resumable), then write its report and figures (and a suite's viewer page); or only estimate, or
only report. A Table 1 suite and a sample-efficiency grid take the same path through :mod:`.running`
and :mod:`.reporting`."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ..errors import InputError
from .request import StudyRequest, check_request, parse_fractions, parse_rates, parse_seeds, viewer_images
from .studies import Grid, Suite

log = logging.getLogger("attncnn.reproduce")
__all__ = ["run_study", "VIEWER_IMAGES", "VIEWER_AVERAGE"]

#: test images of the viewer page: the first of the paper's website (2, 3, 19, 56). Only content
#: models store maps per image (a few MB of page each, beside a few MB for all position-only models
#: together), so one image and no average keep the shipped page near 10 MB; the average is paper
#: Fig. 6 in the figures folder, and the options bring the rest back.
VIEWER_IMAGES = (2,)
VIEWER_AVERAGE = 0


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
    from ..analysis.metrics import epoch_metrics
    from .reporting.figures import draw_figures
    from .reporting.report import write_report
    from .reporting.results import finished_results
    from .running.estimate import dry_run
    from .running.runner import TrainOptions, plan_study, study_jobs, train_jobs

    study = check_request(request)
    out = Path(request.out or f"results/{request.study}")
    options = TrainOptions(data=request.data or "cifar10", data_dir=request.data_dir, download=request.download,
                           device=request.device, precision=request.precision, compile=request.compile,
                           epochs=request.epochs, train_subset=request.train_subset, batch_size=request.batch_size)
    planned = dict(seeds=parse_seeds(request.seeds))            # plan_study's options the request sets
    if isinstance(study, Grid):
        planned.update(train_images=request.train_images, passes=request.passes,
                       fractions=parse_fractions(request.fractions), lr=request.lr)
    else:
        planned["epochs"] = request.epochs
    only = tuple(p.strip() for p in request.only.split(",") if p.strip()) if request.only else None
    if request.measurement is None:
        jobs = plan_study(study, out, only=only, **planned)
    else:
        jobs = _measurement_jobs(request, study, out, only)
    if request.action == "dry-run":
        dry_run(jobs, options, out, request.study)
        return None
    if request.action == "train":
        train_jobs(jobs, options, progress=request.progress, epoch_metrics=epoch_metrics,
                   resume_hint=f"`{_command(request)}`")
    if request.measurement is not None:
        _report_measurement(request, study, out, options)
        return None
    jobs = study_jobs(study, out, **planned)
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


def _measurement_jobs(request: StudyRequest, grid, out: Path, only: tuple[str, ...] | None = None) -> list:
    """A grid's calibration or learning-rate sweep: its jobs (``only``: of these rows; one process per
    model, e.g. side by side on a GPU, while the printed result still covers every row)."""
    from .running.measurements import plan_calibration, plan_lr_sweep
    from .running.runner import row_of

    if request.measurement == "calibrate":
        jobs = plan_calibration(grid, out, lr=request.lr, **_sizes(request))
    else:
        jobs = plan_lr_sweep(grid, out, parse_rates(request.rates), **_sizes(request))
    if only is None:
        return jobs
    rows = sorted({row_of(job) for job in jobs})
    unknown = [name for name in only if name not in rows]
    if unknown:
        raise InputError(f"--only {','.join(unknown)}: not measured by --{request.measurement}, which trains "
                         f"{', '.join(rows)}")
    return [job for job in jobs if row_of(job) in only]


def _sizes(request: StudyRequest) -> dict:
    """A measurement's cell: ``passes``, ``train_images`` and ``fraction`` (default: the grid's smallest)."""
    fraction = min(parse_fractions(request.fractions)) if request.fractions else None
    return dict(passes=request.passes, train_images=request.train_images, fraction=fraction)


def _report_measurement(request: StudyRequest, grid, out: Path, options) -> None:
    """Print what a calibration or a sweep measured (a sweep's report covers every rate already swept
    under ``out``)."""
    from ..data import load_dataset
    from .running.measurements import (calibration_lines, held_out_results, plan_lr_sweep, swept_rates,
                                       write_sweep_report)

    jobs = _measurement_jobs(request, grid, out)
    if request.measurement == "calibrate":
        lines = calibration_lines(jobs, grid.overfit)
    else:
        rates = swept_rates(jobs, parse_rates(request.rates))
        jobs = plan_lr_sweep(grid, out, rates, **_sizes(request))
        # evaluated on training images outside their cell (cached in each run folder; the data set is
        # loaded only when a run has none)
        held_out = held_out_results([job.folder for job in jobs], lambda: load_dataset(
            options.data, data_dir=options.data_dir, download=options.download), device=options.device)
        lines = write_sweep_report(grid, out, jobs, rates, command=_command(request), held_out=held_out)
    print("\n".join(lines))
