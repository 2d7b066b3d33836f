"""The two shapes a study takes: a :class:`Suite` of Table 1 runs, or a :class:`Grid` of models x
training-set sizes. Each study of :mod:`attncnn.reproduce.studies` is one value of one of them:
its runs, its recipe over the presets', and the claims it measures (:mod:`.claims`).

A suite trains each preset with some seeds into ``<out>/<preset>/seed<N>``; its report is Table 1
beside the paper's. A grid trains each row (a preset, or a :class:`Variant` of one) on
class-balanced subsets of the training set, every cell for the same number of seen images, into
``<out>/<row>/<pct>pct/seed<N>``; its report is accuracy per row and training-set size. Planning
their jobs is :mod:`attncnn.reproduce.running.jobs`; nothing here reads or trains anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .claims import Claim, Criterion

#: the default criterion of "settled on a grid": a layer's grid distance below half a token, fixed
#: before the long runs were trained
SETTLED_BELOW = 0.5

__all__ = ["Suite", "Grid", "Variant", "ModelOptions"]


@dataclass(frozen=True)
class Suite:
    """A named set of Table 1 runs.

    Attributes:
        name: ``"mini"``, ``"mini-long"``, ``"paper-long"`` or ``"paper"``.
        description: one line for the help text and the report.
        presets: the presets, in the order they are trained (one Table 1 row each).
        seeds: default seeds of every preset.
        more_seeds: presets trained with more seeds than ``seeds`` by default (at least three
            seeds of the models whose spread matters most).
        paper_names: preset -> the paper's Table 1 preset it stands for (for the paper's numbers).
        evolution_preset: the preset whose first seed's centres are drawn over epochs (paper Fig. 3).
        evolution_from: where those centres come from: ``"checkpoints"`` (its periodic checkpoints,
            which trimming for committing keeps, weights only) or ``"metrics"`` (the centres and spreads that
            ``metrics.jsonl`` records every epoch; trimming keeps no periodic checkpoint).
        overrides: training options the suite sets over every preset's recipe, as ``(name, value)``
            pairs, e.g. ``(("epochs", 60),)``; they become each job's ``overrides``, so a folder holding a
            run with other values is refused. ``--epochs`` on the command line still wins (smoke runs).
        preset_overrides: preset -> training options over ``overrides`` for that preset alone, e.g.
            ``{"learned-content": (("epochs", 40),)}``: a shorter schedule where the full one does
            not fit the machine it trains on (the report gives every row's epochs).
        last: presets trained after every other job (all their seeds), e.g. the most expensive one.
        settle_epochs: epochs at which the report judges, per layer and seed, whether the heads have
            settled on a grid (grid distance below ``settled_below`` tokens). Non-empty makes the
            report a study over epochs (:func:`~attncnn.reproduce.reporting.table1.epoch_sections`): that
            table, the efficiency and machines of each run, the accuracy of the seeds as bands, the
            grid distance of every seed.
        settled_below: the criterion of "settled on a grid": a layer's grid distance below this many
            tokens (default :data:`SETTLED_BELOW`, half a token).
        baseline: another suite whose ``report.json`` beside this suite's folder gives the accuracy to
            show beside this one's (``mini-long``: ``"mini"``, the 6-epoch runs).
        differs: what this suite changes from ``baseline``, as the report words it ("the length":
            ``mini-300`` is ``mini-long`` trained longer; "CutMix": ``locality-mini`` is ``mini-long``
            with CutMix on).
        compare_at: the epochs at which each run is set beside the baseline's same model and seed
            (those of them the baseline judged); empty (the default): at the baseline's last judged
            epoch and at this run's end, which is what a comparison of lengths needs.
        claims: the paper's claims the report measures; their rows are the paper's names of the
            presets (``paper_names``' values).
    """

    name: str
    description: str
    presets: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    paper_names: dict[str, str] = field(default_factory=dict)
    evolution_preset: str | None = None
    evolution_from: str = "checkpoints"
    overrides: tuple[tuple[str, object], ...] = ()
    preset_overrides: dict[str, tuple[tuple[str, object], ...]] = field(default_factory=dict)
    last: tuple[str, ...] = ()
    settle_epochs: tuple[int, ...] = ()
    settled_below: float = SETTLED_BELOW
    baseline: str | None = None
    differs: str = "the length"
    compare_at: tuple[int, ...] = ()
    claims: tuple[Claim, ...] = ()

    @property
    def epochs(self) -> int | None:
        """The epochs the suite sets for every model (None: each preset's own)."""
        return dict(self.overrides).get("epochs")

    def overrides_of(self, preset: str) -> tuple[tuple[str, object], ...]:
        """The training options the suite sets for ``preset``: ``overrides`` updated by its
        ``preset_overrides``."""
        return tuple({**dict(self.overrides), **dict(self.preset_overrides.get(preset, ()))}.items())

    def seeds_of(self, preset: str, seeds: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The seeds ``preset`` is trained with: ``seeds`` when given, else the suite's defaults."""
        if seeds is not None:
            return seeds
        return self.more_seeds.get(preset, self.seeds)


class ModelOptions(dict):
    """Model options over a preset's (``{"init": "random"}``), as a job's ``model`` override.

    A plain dict to everything that reads it (it equals the ``model`` of a ``config.json`` and is
    written as one), but hashable, as every field of a :class:`~attncnn.reproduce.running.jobs.Job`
    must be. Treat it as read-only: its hash is its items'.
    """

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.items())))


@dataclass(frozen=True)
class Variant:
    """A grid row that is a preset with other model options (``attncnn train --preset P --set K=V``).

    Attributes:
        preset: the preset it is made from.
        model: the model options over the preset's, as ``(key, value)`` pairs.
        description: one line for the report.
    """

    preset: str
    model: tuple[tuple[str, object], ...]
    description: str = ""


@dataclass(frozen=True)
class Grid:
    """Models x training-set fractions, trained for equal seen images.

    Attributes:
        name: the study's name (``attncnn reproduce <name>``, the default ``results/<name>``).
        description: one line for the help text and the report.
        presets: the rows (presets, or names of ``variants``), in training order within a fraction
            (the cheap baseline first).
        fractions: training-set fractions, smallest first (the cells the scarce-data claims are about).
        passes: seen images per cell, in units of the full training set.
        seeds: default seeds (each seed draws its own subsets).
        more_seeds: fractions trained with more seeds than ``seeds`` by default: the scarce-data
            cells, where the claims live and where one seed's subset varies most.
        evaluations: about how many test evaluations per cell.
        train_images: size of the full training set (CIFAR-10: 50,000).
        variants: rows of ``presets`` that are not presets: name -> :class:`Variant`.
        lr: the learning rate shared by ``lr_rows`` (None: each preset's own).
        lr_rows: rows trained at ``lr`` (their cells record it).
        sweep_rows: rows whose smallest cell the learning-rate sweep trains
            (:mod:`~attncnn.reproduce.running.measurements`).
        calibrate_rows: rows whose train-test gap the calibration of ``passes`` measures.
        overfit: when the smallest cell counts as scarce data (a criterion on the train - test
            ``gap``): the calibration judges ``passes`` by it, and the report lists the gap of
            every smallest cell beside it. None: neither.
        gate_rows: GPSA rows whose gates the figures show.
        recipe: the training recipe in words, for the report.
        claims: the claims the report measures (:mod:`.claims`).
    """

    name: str
    description: str
    presets: tuple[str, ...]
    fractions: tuple[float, ...]
    passes: int = 2
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict[float, tuple[int, ...]] = field(default_factory=dict)
    evaluations: int = 4
    train_images: int = 50_000
    variants: dict[str, Variant] = field(default_factory=dict)
    lr: float | None = None
    lr_rows: tuple[str, ...] = ()
    sweep_rows: tuple[str, ...] = ()
    calibrate_rows: tuple[str, ...] = ()
    overfit: Criterion | None = None
    gate_rows: tuple[str, ...] = ()
    recipe: str = ""
    claims: tuple[Claim, ...] = ()

    def preset_of(self, row: str) -> str:
        """The preset row ``row`` trains (a variant's preset, else the row itself)."""
        return self.variants[row].preset if row in self.variants else row

    def row_overrides(self, row: str, lr: float | None = None) -> dict:
        """Options that row ``row`` sets over its cells' (none for a plain preset row): ``model``
        (a variant's, as :class:`ModelOptions`) and ``lr`` (``lr``, else the grid's, for ``lr_rows``)."""
        found: dict = {}
        if row in self.variants:
            found["model"] = ModelOptions(self.variants[row].model)
        rate = self.lr if lr is None else lr
        if row in self.lr_rows and rate is not None:
            found["lr"] = rate
        return found

    def seeds_of(self, fraction: float, seeds: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The seeds of ``fraction``'s cells: ``seeds`` when given, else the grid's defaults."""
        if seeds is not None:
            return seeds
        return self.more_seeds.get(fraction, self.seeds)
