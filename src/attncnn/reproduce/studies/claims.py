"""A study's claims as data: what each measures, and the criterion that judges it.

A :class:`Claim` is a statement, a metric in words, a *measure* (which rows, cells and quantity it
reads: one of the dataclasses below, each naming its numbers) and its :class:`Criterion` list; one
generic evaluator, :mod:`attncnn.reproduce.reporting.claims`, computes the report's numbers and
verdicts from them. Nothing here reads a run.

A grid's measures read, per row and cell, the mean over the cell's finished seeds (fractions) of a
quantity: ``"first"`` (test accuracy at the cell's first evaluation), ``"last"`` (after the last
epoch), ``"train"`` (the last epoch's training accuracy, augmented images, as logged) or ``"gap"``
(the last epoch's training minus test accuracy, per seed, then the mean); they name cells by
position, :data:`SMALLEST` (0) and :data:`LARGEST` (-1). A Table 1 suite's measures (:class:`Curve`,
:class:`PerLayer`, :class:`Accuracies`) name rows by the paper's preset (``"quadratic"``), which each
suite maps to its own (``quadratic-mini``).

Texts (``statement``, ``metric``) may name ``{small}`` and ``{large}`` (a grid's smallest and
largest cell), ``{row}`` (a suite's preset the claim reads), ``{first_epoch}`` and ``{last_epoch}``
(the epochs a :class:`Curve` spans).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

__all__ = ["SMALLEST", "LARGEST", "OPERATORS", "Criterion", "Claim", "PerRow", "Scarcity", "Versus",
           "Gain", "Layers", "Curve", "PerLayer", "Accuracies", "Measure"]

#: positions of a grid's cells, smallest fraction first
SMALLEST, LARGEST = 0, -1

#: the comparisons a criterion may make
OPERATORS = (">", ">=", "<", "<=")


@dataclass(frozen=True)
class Criterion:
    """A condition on the numbers a claim's measure reads: ``number op threshold``.

    It judges every number named ``number`` that the measure reads (each measure's description
    names its numbers), or only those of row ``row`` and of the cell at position ``cell``. A claim
    fails as soon as one judged number fails it, is not measured yet while a judged number is
    missing (or none is judged), and holds otherwise.

    Attributes:
        number: which of the measure's numbers, e.g. ``"gap"``, ``"difference"``, ``"first layer"``.
        op: one of :data:`OPERATORS`.
        threshold: a fraction for accuracies (``0.15``: 15 points), a value for gates.
        row: judge only the numbers of this row (None: every row).
        cell: judge only the numbers of the cell at this position (None: every cell).
    """

    number: str
    op: str
    threshold: float
    row: str | None = None
    cell: int | None = None

    def __post_init__(self):
        if self.op not in OPERATORS:
            raise ValueError(f"a criterion compares with one of {', '.join(OPERATORS)}, not {self.op!r}")


@dataclass(frozen=True)
class PerRow:
    """A grid's ``quantity`` of each of ``rows`` in the cell at position ``cell``.

    Numbers: one per row, named after ``quantity``. Values: ``"resnet18-mini 30.00, deit-mini 20.00"``.
    """

    quantity: str
    rows: tuple[str, ...]
    cell: int = SMALLEST


@dataclass(frozen=True)
class Scarcity:
    """Whether a grid's smallest cell is scarce data, for every row with a finished cell: what it
    costs (``last`` on the largest cell minus on the smallest: number ``"cost"``) and how much the
    row overfits it (``train`` minus ``last`` on the smallest: number ``"gap"``).

    Values: ``"quadratic-mini: 100 % vs 10 % +12.30, train - test +5.10; ..."``.
    """


@dataclass(frozen=True)
class Versus:
    """``row`` against ``base`` on a grid's cells at positions ``cells``: both rows' ``quantity``
    and their difference (number ``"difference"``, one per cell), and how much the difference on
    the first of ``cells`` exceeds that on the last (number ``"shrink"``).

    Values: ``"10 %: convit-mini 55.00 vs deit-mini 50.00 (+5.00); 100 %: ...; shrinks by +3.00"``.
    """

    row: str
    base: str
    quantity: str = "last"
    cells: tuple[int, ...] = (SMALLEST, LARGEST)


@dataclass(frozen=True)
class Gain:
    """Per pair ``(row, bases)`` and cell of a grid: ``row``'s quantity minus the best of those of
    ``bases`` finished in the cell, for each quantity of ``at`` (the numbers are named after them).

    Values, one pair: ``"10 % +1.20, 25 % -0.40"``; with several quantities ``"10 %: first +3.00 /
    last +1.20, ..."``; with several pairs each is named: ``"quadratic-conv-mini - quadratic-mini
    10 %: first +2.00 / last -5.00; ..."``.
    """

    pairs: tuple[tuple[str, tuple[str, ...]], ...]
    at: tuple[str, ...] = ("last",)


@dataclass(frozen=True)
class Layers:
    """A value every layer logs (``attn/layer{L}/{key}``, e.g. ``"gate"``) at the last epoch of
    each of ``rows``' cells of a grid: the mean over the cell's seeds (``seeds="mean"``: every
    cell, ``-`` where none is finished), or its first seed's (``seeds="first"``: the finished
    cells only). Numbers per row and cell: ``"first layer"`` and ``"last layer"``.

    Values: ``"convit-mini 10 %: L1 0.80, L2 0.70, L3 0.30; ..."`` (one row: ``"10 %: L1 0.80, ..."``).
    """

    key: str
    rows: tuple[str, ...]
    seeds: str = "mean"


@dataclass(frozen=True)
class Curve:
    """A Table 1 row's per-epoch value ``attn/layer{layer}/{key}`` (mean over its seeds) at the
    first and the last logged epoch, rounded to 3 decimals: ``[2.013, 0.412]``."""

    row: str
    key: str
    layer: int = 1


@dataclass(frozen=True)
class PerLayer:
    """Per layer of a Table 1 row's trained model (its first seed), the layer analysis' ``key``
    (``"distance"``, ``"degenerate_heads"``), rounded to ``digits`` (None: as it is)."""

    row: str
    key: str
    digits: int | None = 3


@dataclass(frozen=True)
class Accuracies:
    """The mean final test accuracy (percent, 2 decimals) of each of ``rows`` (Table 1 rows), when
    every one has finished: ``[87.1, 91.8]``."""

    rows: tuple[str, ...]


Measure = Union[PerRow, Scarcity, Versus, Gain, Layers, Curve, PerLayer, Accuracies]


@dataclass(frozen=True)
class Claim:
    """One claim a study measures.

    Attributes:
        name: a short name for people and tests (``"head start"``).
        statement: the claim as the report states it.
        metric: what is measured and, for a judged claim, when it holds (in words).
        measure: which numbers it reads (one of the measures above).
        criteria: the conditions of :class:`Criterion` that judge it; none: the report gives the
            numbers without a verdict (the study's document judges them).
    """

    name: str
    statement: str
    metric: str
    measure: Measure
    criteria: tuple[Criterion, ...] = ()
