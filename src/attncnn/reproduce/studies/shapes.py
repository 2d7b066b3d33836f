"""The two shapes a study takes: a :class:`Suite` of Table 1 runs (each row a preset, with some seeds;
its report is Table 1 beside the paper's), or a :class:`Grid` of models x class-balanced subsets of the
training set, every cell for the same number of seen images (its report is accuracy per row and
training-set size). Planning their jobs is :mod:`attncnn.reproduce.running.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .claims import Claim, Criterion

#: the default criterion of "settled on a grid": a layer's grid distance below half a token, fixed
#: before the long runs were trained
SETTLED_BELOW = 0.5

__all__ = ["Suite", "Grid"]


@dataclass(frozen=True)
class _Study:
    """What every study declares.

    Attributes:
        name: the study's name (``attncnn reproduce <name>``, the default ``results/<name>``).
        description: one line for the help text and the report.
        rows: row -> its recipe overrides, in training order: training options over the preset's
            recipe (``{"epochs": 60}``; ``"model"``: model options, ``{"init": "random"}``), and
            ``"preset"`` where the row is not itself a preset (a grid's ``convit-mini-random`` trains
            ``convit-mini``). Each job records them in its ``config.json``, so a folder holding a run
            with other values is refused.
        seeds: default seeds of every row.
        more_seeds: rows (a suite's) or training-set fractions (a grid's) trained with more seeds than
            ``seeds`` by default: where the spread matters most.
        claims: the claims the report measures (:mod:`.claims`).
    """

    name: str
    description: str
    rows: dict[str, dict[str, object]]
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()

    def seeds_of(self, key, seeds: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The seeds of a row (a suite's) or of a fraction's cells (a grid's): ``seeds`` when given,
        else the study's defaults."""
        return self.more_seeds.get(key, self.seeds) if seeds is None else seeds


@dataclass(frozen=True, kw_only=True)
class Suite(_Study):
    """A named set of Table 1 runs; its rows are presets. ``--epochs`` on the command line replaces
    every row's ``epochs`` (smoke runs; the report gives every row's epochs).

    Attributes:
        paper_names: preset -> the paper's Table 1 preset it stands for (for the paper's numbers).
        evolution_preset: the preset whose first seed's centres are drawn over epochs (paper Fig. 3).
        evolution_from: where those centres come from: ``"checkpoints"`` (its periodic checkpoints,
            which trimming for committing keeps, weights only) or ``"metrics"`` (the centres and spreads that
            ``metrics.jsonl`` records every epoch; trimming keeps no periodic checkpoint).
        last: presets trained after every other job (all their seeds), e.g. the most expensive one.
        settle_epochs: epochs at which the report judges, per layer and seed, whether the heads have
            settled on a grid (grid distance below ``settled_below`` tokens). Non-empty makes the
            report a study over epochs (:func:`~attncnn.reproduce.reporting.table1.epoch_sections`).
        settled_below: the criterion of "settled on a grid": a layer's grid distance below this many
            tokens (default :data:`SETTLED_BELOW`, half a token).
        baseline: another suite whose ``report.json`` beside this suite's folder gives the accuracy to
            show beside this one's (``mini-long``: ``"mini"``, the 6-epoch runs).
        differs: what this suite changes from ``baseline``, as the report words it ("the length",
            "CutMix").
        compare_at: the epochs at which each run is set beside the baseline's same model and seed
            (those of them the baseline judged); empty (the default): at the baseline's last judged
            epoch and at this run's end, which is what a comparison of lengths needs.
    """

    paper_names: dict[str, str] = field(default_factory=dict)
    evolution_preset: str | None = None
    evolution_from: str = "checkpoints"
    last: tuple[str, ...] = ()
    settle_epochs: tuple[int, ...] = ()
    settled_below: float = SETTLED_BELOW
    baseline: str | None = None
    differs: str = "the length"
    compare_at: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Grid(_Study):
    """Rows x training-set fractions, trained for equal seen images. ``--lr`` replaces the ``lr`` of
    every row whose recipe sets one (the rate the grid's content models share).

    Attributes:
        fractions: training-set fractions, smallest first (the cells the scarce-data claims are about).
        passes: seen images per cell, in units of the full training set.
        evaluations: about how many test evaluations per cell.
        train_images: size of the full training set (CIFAR-10: 50,000).
        notes: row -> one line for the report, for rows that are not presets.
        sweep_rows: rows whose smallest cell the learning-rate sweep trains
            (:mod:`~attncnn.reproduce.running.measurements`).
        calibrate_rows: rows whose train-test gap the calibration of ``passes`` measures.
        overfit: when the smallest cell counts as scarce data (a criterion on the train - test
            ``gap``): the calibration judges ``passes`` by it, and the report lists the gap of
            every smallest cell beside it. None: neither.
        gate_rows: GPSA rows whose gates the figures show.
        recipe: the training recipe in words, for the report.
    """

    fractions: tuple[float, ...]
    passes: int = 2
    evaluations: int = 4
    train_images: int = 50_000
    notes: dict[str, str] = field(default_factory=dict)
    sweep_rows: tuple[str, ...] = ()
    calibrate_rows: tuple[str, ...] = ()
    overfit: Criterion | None = None
    gate_rows: tuple[str, ...] = ()
    recipe: str = ""
