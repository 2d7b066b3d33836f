"""Any study's claims, evaluated from their declarations (:mod:`attncnn.reproduce.studies.claims`).

Each claim's measure reads its numbers, as :class:`Term` values (named numbers of one row and
cell), and writes them as the report's ``values``; its criteria judge the numbers they name
(:func:`judge`) and :func:`verdict` combines the conditions. A grid's claims read
:class:`CellNumbers` (the finished cells' ``metrics.jsonl``: no model is loaded); a Table 1 suite's
read :class:`RunNumbers` (its Table 1 rows, its per-layer analysis and its finished runs).
Accuracies are fractions in the numbers and points (percent) in the text.
"""

from __future__ import annotations

import math
import operator
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..running.runner import Job, rows_and_cells
from ..studies.claims import Accuracies, Claim, Criterion, Curve, Gain, Layers, PerLayer, PerRow, Scarcity, Versus
from .results import Records, RunResult, layer_curves, layer_values, read_records, tested, train_test_gap

__all__ = ["HOLDS", "FAILS", "MISSING", "Term", "Reading", "CellNumbers", "RunNumbers", "cell_numbers", "judge",
           "verdict", "read_claim", "evaluate_claims", "points"]

HOLDS, FAILS, MISSING = "holds", "fails", "not measured yet"

_COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}

#: a grid's quantities of one seed's epoch records (see :mod:`attncnn.reproduce.studies.claims`)
_PER_SEED: dict[str, Callable[[list[dict]], float | None]] = {
    "first": lambda records: tested(records)[0]["test_accuracy"] if tested(records) else None,
    "last": lambda records: tested(records)[-1]["test_accuracy"] if tested(records) else None,
    "train": lambda records: records[-1].get("train_accuracy") if records else None,
    "gap": train_test_gap,
}


def _mean(values: Sequence[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else statistics.fmean(values)


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def points(value: float | None, sign: bool = False) -> str:
    """A fraction in points (``0.123`` -> ``"12.30"``, ``"+12.30"`` with ``sign``), ``"-"`` for None."""
    return "-" if value is None else f"{100 * value:{'+' if sign else ''}.2f}"


@dataclass(frozen=True)
class Term:
    """Numbers a measure read (``numbers``: name -> value, None where missing) for one ``row``
    and ``cell`` (None where the numbers span several)."""

    numbers: dict[str, float | None]
    row: str | None = None
    cell: str | None = None


@dataclass(frozen=True)
class Reading:
    """What a measure read: the report's ``values``, the :class:`Term` list the criteria judge,
    and the ``fields`` its claim's texts may name."""

    values: object
    terms: list[Term]
    fields: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CellNumbers:
    """What a grid's claims read: ``records`` of the finished cells (:func:`read_records`), the
    planned ``cells`` (smallest first) and ``rows`` (in plan order)."""

    records: Records
    cells: list[str]
    rows: list[str]

    def value(self, row: str, cell: str, quantity: str) -> float | None:
        """``quantity`` of a cell, mean over its finished seeds (None: none, or one lacks it)."""
        return _mean([_PER_SEED[quantity](seed) for seed in self.records.get((row, cell), [])])

    def layers(self, row: str, cell: str, key: str, seeds: str = "mean") -> dict[int, float]:
        """Layer (1-based) -> the last epoch's ``attn/layer{L}/{key}``: the mean over the cell's
        seeds of the layers every seed logs (``seeds="mean"``) or its first seed's (``"first"``)."""
        runs = self.records.get((row, cell), [])
        per_seed = [{layer: value for layer, value in layer_values(seed[-1] if seed else {}, key).items()
                     if math.isfinite(value)} for seed in runs[:1 if seeds == "first" else None]]
        layers = set.intersection(*(set(values) for values in per_seed)) if per_seed else set()
        return {layer: statistics.fmean(values[layer] for values in per_seed) for layer in sorted(layers)}


def cell_numbers(jobs: Sequence[Job]) -> CellNumbers:
    """What a grid's claims read from its planned ``jobs`` (their cells, smallest first, and rows).

    Raises:
        ValueError: a job folder holding another run (from :func:`read_records`).
    """
    rows, cells = rows_and_cells(jobs)
    return CellNumbers(read_records(jobs), cells, rows)


@dataclass(frozen=True)
class RunNumbers:
    """What a Table 1 suite's claims read: its Table 1 ``rows`` (the report's), ``layers`` (preset
    -> the per-layer analysis of its first seed, None without attention) and the finished runs
    (``results``: preset -> runs)."""

    rows: Sequence[dict]
    layers: dict[str, list[dict] | None]
    results: dict[str, list[RunResult]]

    def preset(self, paper_name: str) -> str | None:
        """The suite's preset that stands for the paper's ``paper_name`` (None: none)."""
        return {row["paper_preset"]: row["preset"] for row in self.rows}.get(paper_name)


def judge(criterion: Criterion, value: float | None) -> bool | None:
    """Whether ``value`` meets ``criterion`` (None: not measured)."""
    return None if value is None else bool(_COMPARE[criterion.op](value, criterion.threshold))


def verdict(conditions: Sequence[bool | None]) -> str:
    """``"fails"`` if a condition is False, else ``"not measured yet"`` if one is None (or there are
    none), else ``"holds"``."""
    if any(c is False for c in conditions):
        return FAILS
    return MISSING if not conditions or any(c is None for c in conditions) else HOLDS


def _conditions(criteria: Sequence[Criterion], terms: Sequence[Term], cells: Sequence[str]) -> list[bool | None]:
    """Each criterion judged on every term holding its number (of its row and cell, if it names them)."""
    return [judge(c, term.numbers[c.number]) for c in criteria for term in terms
            if c.number in term.numbers and c.row in (None, term.row)
            and (c.cell is None or (cells and term.cell == cells[c.cell]))]


def read_claim(claim: Claim, numbers: CellNumbers | RunNumbers) -> Reading | None:
    """What ``claim``'s measure reads from ``numbers`` (None: a Table 1 claim no finished run has
    numbers for yet)."""
    return _MEASURES[type(claim.measure)](claim.measure, numbers)


def evaluate_claims(claims: Sequence[Claim], numbers: CellNumbers | RunNumbers) -> list[dict]:
    """The report's entries of ``claims``: dicts with ``claim`` (the statement), ``metric``,
    ``values`` (a grid's as text, ``-`` where a cell is missing; a suite's as a list) and, for a
    claim with criteria, ``verdict`` (:func:`verdict`). Table 1 claims without numbers are left out."""
    found = []
    cells = getattr(numbers, "cells", [])
    fields = {"small": cells[0], "large": cells[-1]} if cells else {}
    for claim in claims:
        reading = read_claim(claim, numbers)
        if reading is None:
            continue
        texts = {**fields, **reading.fields}
        entry = {"claim": claim.statement.format(**texts), "metric": claim.metric.format(**texts),
                 "values": reading.values}
        if claim.criteria:
            entry["verdict"] = verdict(_conditions(claim.criteria, reading.terms, cells))
        found.append(entry)
    return found


# -- a grid's measures --------------------------------------------------------------------------

def _per_row(measure: PerRow, numbers: CellNumbers) -> Reading:
    cell = numbers.cells[measure.cell]
    terms = [Term({measure.quantity: numbers.value(row, cell, measure.quantity)}, row, cell) for row in measure.rows]
    return Reading(", ".join(f"{t.row} {points(t.numbers[measure.quantity])}" for t in terms), terms)


def _scarcity(measure: Scarcity, numbers: CellNumbers) -> Reading:
    small, large = numbers.cells[0], numbers.cells[-1]
    terms = [Term({"cost": _difference(numbers.value(row, large, "last"), numbers.value(row, small, "last")),
                   "gap": _difference(numbers.value(row, small, "train"), numbers.value(row, small, "last"))}, row)
             for row in numbers.rows if any((row, cell) in numbers.records for cell in numbers.cells)]
    return Reading("; ".join(f"{t.row}: {large} vs {small} {points(t.numbers['cost'], True)}, train - test "
                             f"{points(t.numbers['gap'], True)}" for t in terms), terms)


def _versus(measure: Versus, numbers: CellNumbers) -> Reading:
    terms, parts = [], []
    for cell in (numbers.cells[position] for position in measure.cells):
        mine, theirs = (numbers.value(row, cell, measure.quantity) for row in (measure.row, measure.base))
        terms.append(Term({"difference": _difference(mine, theirs)}, measure.row, cell))
        parts.append(f"{cell}: {measure.row} {points(mine)} vs {measure.base} {points(theirs)} "
                     f"({points(terms[-1].numbers['difference'], True)})")
    shrink = _difference(terms[0].numbers["difference"], terms[-1].numbers["difference"])
    terms.append(Term({"shrink": shrink}, measure.row))
    return Reading("; ".join(parts) + f"; shrinks by {points(shrink, True)}", terms)


def _gain_of(numbers: CellNumbers, row: str, bases: Sequence[str], cell: str, quantity: str) -> float | None:
    """``row``'s quantity minus the best of ``bases``' finished in the cell (None: ``row`` or every
    base missing)."""
    found = [value for base in bases if (value := numbers.value(base, cell, quantity)) is not None]
    mine = numbers.value(row, cell, quantity)
    return None if mine is None or not found else mine - max(found)


def _gain(measure: Gain, numbers: CellNumbers) -> Reading:
    several = len(measure.pairs) > 1
    terms, parts = [], []
    for row, bases in measure.pairs:
        for cell in numbers.cells:
            gains = {quantity: _gain_of(numbers, row, bases, cell, quantity) for quantity in measure.at}
            terms.append(Term(gains, row, cell))
            label = f"{row} - {', '.join(bases)} {cell}" if several else cell
            if len(gains) == 1:
                parts.append(f"{label} {points(next(iter(gains.values())), True)}")
            else:
                parts.append(f"{label}: " + " / ".join(f"{q} {points(value, True)}" for q, value in gains.items()))
    return Reading(("; " if several else ", ").join(parts), terms)


def _layers(measure: Layers, numbers: CellNumbers) -> Reading:
    several, first_seed = len(measure.rows) > 1, measure.seeds == "first"
    terms, parts = [], []
    for row in measure.rows:
        for cell in numbers.cells:
            if first_seed and (row, cell) not in numbers.records:
                continue                                  # a first seed only where one finished
            values = numbers.layers(row, cell, measure.key, measure.seeds)
            ends = (values[min(values)], values[max(values)]) if values else (None, None)
            terms.append(Term(dict(zip(("first layer", "last layer"), ends)), row, cell))
            text = ", ".join(f"L{layer} {value:.2f}" for layer, value in values.items())
            parts.append(f"{f'{row} {cell}' if several else cell}: " + (text if first_seed else text or "-"))
    return Reading("; ".join(parts) or "-", terms)


# -- a Table 1 suite's measures -----------------------------------------------------------------

def _curve(measure: Curve, numbers: RunNumbers) -> Reading | None:
    preset = numbers.preset(measure.row)
    curve = layer_curves(numbers.results[preset], measure.key).get(measure.layer) \
        if preset in numbers.results else None
    if not curve:
        return None
    epochs, values = curve
    ends = {"first": values[0], "last": values[-1]}
    seeds = [result.job.seed for result in numbers.results[preset]]
    return Reading([round(value, 3) for value in ends.values()], [Term(ends, preset)],
                   {"row": preset, "first_epoch": epochs[0], "last_epoch": epochs[-1],
                    "seeds": _seeds_label(seeds)})


def _seeds_label(seeds: Sequence[int]) -> str:
    """``"seed 0"``, or ``"mean over seeds 0, 1, 2"``: which runs a claim's number comes from."""
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {', '.join(map(str, seeds))}"


def _per_layer(measure: PerLayer, numbers: RunNumbers) -> Reading | None:
    preset = numbers.preset(measure.row)
    per_layer = numbers.layers.get(preset)
    if not per_layer:
        return None
    values = [layer[measure.key] if measure.digits is None else round(layer[measure.key], measure.digits)
              for layer in per_layer]
    first = numbers.results[preset][0].job.seed if numbers.results.get(preset) else 0
    return Reading(values, [Term({f"layer {n}": v for n, v in enumerate(values, 1)}, preset)],
                   {"row": preset, "seeds": _seeds_label([first])})


def _accuracies(measure: Accuracies, numbers: RunNumbers) -> Reading | None:
    by_paper = {row["paper_preset"]: row for row in numbers.rows}
    means = [by_paper.get(name, {}).get("accuracy_mean") for name in measure.rows]
    if any(mean is None for mean in means):
        return None
    return Reading([round(100 * mean, 2) for mean in means],
                   [Term({"accuracy": mean}, by_paper[name]["preset"]) for name, mean in zip(measure.rows, means)])


_MEASURES: dict[type, Callable] = {PerRow: _per_row, Scarcity: _scarcity, Versus: _versus, Gain: _gain,
                                   Layers: _layers, Curve: _curve, PerLayer: _per_layer, Accuracies: _accuracies}
