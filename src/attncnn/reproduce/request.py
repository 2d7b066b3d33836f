"""What one ``attncnn reproduce`` call does, as plain values (:class:`StudyRequest`), and the one
table of which options each kind of call takes (:data:`RULES`, checked by :func:`check_request`).

A call has an action (:data:`ACTIONS`: train then report, the default; estimate only; report
only), a target (the study itself, or a grid's measurement of :data:`MEASUREMENTS`)
and a study whose shape is a Table 1 suite or a grid. Every option is refused, with the reason, in
the calls that would ignore it; nothing else in the package repeats these checks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from ..errors import InputError
from .studies import GRIDS, STUDIES, Grid, Study

__all__ = ["ACTIONS", "MEASUREMENTS", "StudyRequest", "Rule", "RULES", "check_request", "flag_of", "viewer_images",
           "one_of", "parse_list", "parse_seeds", "parse_rates", "parse_fractions"]

#: what a call does: ``train`` (train what is left, then report; the default), ``dry-run`` (print
#: each job's command and estimated time), ``report-only`` (train nothing, report what has
#: finished), each with what it does
ACTIONS = {"train": "trains what is left, then reports", "dry-run": "prints the commands and writes nothing",
           "report-only": "trains nothing"}
#: a grid's measurements beside the study itself: its seen images per cell, its shared rate
MEASUREMENTS = ("calibrate", "lr-sweep")


@dataclasses.dataclass(frozen=True)
class StudyRequest:
    """One call of :func:`attncnn.reproduce.orchestration.run_study`. Each field is the option of
    ``attncnn reproduce`` of that name (``train_images``: ``--train-images``); ``None`` leaves the
    choice to the study, the preset or the machine.

    Attributes:
        study: a name of :data:`~attncnn.reproduce.studies.STUDIES`.
        action: one of :data:`ACTIONS`.
        measurement: None (the study itself) or one of :data:`MEASUREMENTS`.
        rates: the learning rates of ``lr-sweep``, comma-separated (``"2.5e-4,5e-4"``).
        out: the study's folder (default ``results/<study>``).
        seeds, only, fractions, viewer_images, formats: comma-separated lists.
        command: the command line that made the call, for the report and the resume hint.
    """

    study: str
    action: str = "train"
    measurement: str | None = None
    rates: str | None = None
    out: str | None = None
    data: str | None = None
    data_dir: str | None = None
    download: bool = False
    device: str = "auto"
    precision: str | None = None
    compile: bool | None = None
    epochs: int | None = None
    train_subset: int | None = None
    batch_size: int | None = None
    seeds: str | None = None
    only: str | None = None
    train_images: int | None = None
    passes: int | None = None
    fractions: str | None = None
    lr: float | None = None
    viewer: bool = True
    viewer_images: str = "2"
    viewer_average: int = 0
    formats: str = "png"
    progress: bool = True
    command: str | None = None


def flag_of(name: str, value=True) -> str:
    """The command-line spelling of a :class:`StudyRequest` option given as ``value``
    (``compile=False`` is ``--no-compile``; a measurement is its own flag)."""
    if name in ("action", "measurement"):
        return f"--{value}"
    return f"--{'no-' if value is False else ''}{name.replace('_', '-')}"


@dataclasses.dataclass(frozen=True)
class Rule:
    """Options that only some calls take: ``options`` are taken where the call's ``context``
    (``action``, ``shape``: suite or grid, ``measurement``, ``shared_rate``: whether the grid has one) is
    one of ``takes``; elsewhere they are refused with ``why`` (formatted with ``flags``, ``belongs``,
    ``study``, ``grids``, ``does``: what the action does, and the context's values)."""

    options: tuple[str, ...]
    context: str
    takes: tuple
    why: str


#: which calls take which options, declared once (see :class:`Rule`); checked in this order
RULES = (
    Rule(("train_images", "passes", "fractions", "lr", "measurement"), "shape", ("grid",),
         "{flags} {belongs} to the grids ({grids}), not to suite {study}"),
    Rule(("epochs", "train_subset"), "shape", ("suite",),
         "the {study} grid sets each cell's epochs and subset itself; for a smoke run use --train-images (a small "
         "training set) and --passes instead of --epochs/--train-subset"),
    Rule(("precision",), "action", ("train", "dry-run"),
         "--precision is the precision runs train at, and --{action} {does} (the report's figures and maps are "
         "computed in fp32); drop --precision"),
    Rule(("compile",), "action", ("train", "dry-run"), "{flags} is how runs train, and --{action} {does}; drop it"),
    Rule(("seeds",), "measurement", (None,), "--calibrate and --lr-sweep choose their own seed (0); leave out --seeds"),
    Rule(("lr",), "measurement", (None, "calibrate"), "--lr-sweep trains at each of its rates; leave out --lr"),
    Rule(("lr",), "shared_rate", (True,), "--lr sets the shared rate of a grid's content models; the {study} grid "
                                          "has none"),
)


def check_request(request: StudyRequest) -> Study:
    """Refuse a request whose options do not fit together (:data:`RULES`) or whose values are out
    of range, before anything trains; returns its study.

    Raises:
        InputError: an unknown study, action or measurement; an option the call would ignore; a
            count below 1, a bad device, a bad list of viewer images.
    """
    if request.study not in STUDIES:
        raise InputError(f"unknown study {request.study!r}; choose from {', '.join(sorted(STUDIES))}")
    if request.action not in ACTIONS or request.measurement not in (None, *MEASUREMENTS):
        raise InputError(f"unknown action {request.action!r} or measurement {request.measurement!r}")
    if (request.measurement == "lr-sweep") != (request.rates is not None):
        raise InputError("--lr-sweep takes its rates (e.g. --lr-sweep 2.5e-4,5e-4,1e-3); rates go with it only")
    study = STUDIES[request.study]
    grid = isinstance(study, Grid)
    context = {"action": request.action, "shape": "grid" if grid else "suite", "measurement": request.measurement,
               "shared_rate": grid and any("lr" in recipe for recipe in study.rows.values())}
    given = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)   # those not left at their default
             if getattr(request, f.name) != f.default}
    for rule in RULES:
        refused = [name for name in rule.options if name in given]
        if refused and context[rule.context] not in rule.takes:
            flags = [flag_of(name, given[name]) for name in refused]
            raise InputError(rule.why.format(
                flags=", ".join(flags), belongs="belongs" if len(flags) == 1 else "belong", study=study.name,
                grids=", ".join(GRIDS), action=request.action, does=ACTIONS[request.action],
                measurement=request.measurement))
    _check_values(request)
    return study


def _check_values(request: StudyRequest) -> None:
    """Refuse values out of range now, not in the first job or after hours of training."""
    from ..perf import resolve_device

    for name in ("epochs", "train_subset", "batch_size", "train_images", "passes"):
        value = getattr(request, name)
        if value is not None and value < 1:
            raise InputError(f"{flag_of(name)} must be >= 1, got {value}")
    resolve_device(request.device)              # a typo (--device gpu) is refused now, not in the first job
    viewer_images(request.viewer_images)
    if request.viewer_average < 0:
        raise InputError(f"--viewer-average must be >= 0 (0: no average), got {request.viewer_average}")


def parse_list(text: str | None, flag: str, what: str, example: str, convert=int,
               bound: tuple[str, Callable] | None = None) -> tuple | None:
    """``"0, 1,2"`` -> ``(0, 1, 2)``: ``flag``'s comma-separated ``what`` (``convert`` each entry);
    None stays None (the study's default). With ``bound`` (``(">= 0", test)``): at least one entry,
    distinct, each passing ``test``.

    Raises:
        InputError: an entry ``convert`` refuses; with ``bound``, none, a repeat or one out of bounds.
    """
    if text is None:
        return None
    try:
        values = tuple(convert(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"{flag} must be comma-separated {what} like {example}, got {text!r}") from None
    if bound and (not values or not all(map(bound[1], values)) or len(set(values)) != len(values)):
        raise InputError(f"{flag} must list distinct {what} {bound[0]}, like {example}; got {text!r}")
    return values


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """``--seeds``: ``"0,1,2"`` -> ``(0, 1, 2)`` (:func:`parse_list`: distinct integers >= 0)."""
    return parse_list(text, "--seeds", "integers", "0,1,2", bound=(">= 0", lambda seed: seed >= 0))


def parse_rates(text: str) -> tuple[float, ...]:
    """``--lr-sweep``: ``"2.5e-4,5e-4"`` -> ``(0.00025, 0.0005)`` (:func:`parse_list`: distinct, > 0)."""
    return parse_list(text, "--lr-sweep", "learning rates", "2.5e-4,5e-4,1e-3", float, ("> 0", lambda r: r > 0))


def parse_fractions(text: str | None) -> tuple[float, ...] | None:
    """``--fractions``: ``"0.1,0.25,1"`` -> ``(0.1, 0.25, 1.0)`` (:func:`parse_list`; the planner checks them)."""
    return parse_list(text, "--fractions", "fractions", "0.1,0.25,1", float)


def viewer_images(text: str) -> list[int]:
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


def one_of(flags: Iterable[str], kind: str) -> str | None:
    """The one value of ``flags`` (the names given of one kind: ``"action"`` of :data:`ACTIONS`,
    ``"measurement"`` of :data:`MEASUREMENTS`), None for none.

    Raises:
        InputError: two of them: they exclude each other (named with what the last one does).
    """
    order = list(ACTIONS if kind == "action" else MEASUREMENTS)
    given = sorted(set(flags), key=order.index)
    if len(given) <= 1:
        return given[0] if given else None
    if kind == "action":
        raise InputError(f"--{given[-1]} {ACTIONS[given[-1]]}; leave out {', '.join('--' + g for g in given[:-1])}")
    raise InputError(f"{' and '.join('--' + g for g in given)} are two measurements; run them one at a time")
