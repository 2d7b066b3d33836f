"""ConViT's three claims measured on the ``efficiency-scarce`` grid (issue 26), each with a verdict.

ConViT (d'Ascoli et al., ICML 2021) claims that (a) GPSA beats a DeiT of the same size when data is
scarce, by less as data grows; (b) the local (convolutional) init gives a head start early in
training; (c) after training, the gates of the early layers stay positional while later layers
turn to content. Each claim here is a conjunction of conditions on the cells' numbers: it ``fails``
as soon as one measured condition is false, is ``not measured yet`` while a cell it needs has not
finished, and ``holds`` otherwise. The precondition (the smallest cell is scarce data: the ResNet
and the DeiT-style model end it at least :data:`SCARCE_GAP` above their test accuracy on their
training images) is judged the same way.

Everything is read from the cells' ``metrics.jsonl`` (no model is loaded): final and first test
accuracy, the last epoch's ``train_accuracy`` (augmented images, as logged) and the per-layer mean
gate ``attn/layer{L}/gate`` = mean over heads of sigmoid(lambda_h). Accuracies are fractions in the
records and points (percent) in the text.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from ..training import RunFolder
from .grid import Grid, row_of
from .suites import Job, job_state

__all__ = ["Records", "SCARCE_GAP", "read_records", "train_test_gap", "verdict", "scarce_claims", "gap_lines"]

#: per (row, cell): each finished seed's per-epoch records, seeds in plan order
Records = dict[tuple[str, str], list[list[dict]]]

#: the issue's criterion: the smallest cell overfits by at least this much (train - test accuracy)
SCARCE_GAP = 0.15

HOLDS, FAILS, MISSING = "holds", "fails", "not measured yet"

#: (conv/local init, its random-init twin) pairs of claim (b)
HEAD_START_PAIRS = (("convit-mini", "convit-mini-random"), ("quadratic-conv-mini", "quadratic-mini"))


def read_records(jobs: Sequence[Job]) -> Records:
    """``(row, cell) -> [epoch records of each finished seed]`` from the cells' ``metrics.jsonl``.

    Raises:
        ValueError: a job folder holding another run (from :func:`~attncnn.reproduce.suites.job_state`).
    """
    found: Records = {}
    for job in jobs:
        if job_state(job) == "finished":
            found.setdefault((row_of(job), job.cell), []).append(_epoch_records(job))
    return found


def _epoch_records(job: Job) -> list[dict]:
    return [r for r in RunFolder(job.folder, mode="read").read_metrics() if isinstance(r.get("epoch"), int)]


def _tested(records: list[dict]) -> list[dict]:
    return [r for r in records if isinstance(r.get("test_accuracy"), (int, float))]


def _mean(values: Sequence[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else statistics.fmean(values)


def train_test_gap(records: list[dict]) -> float | None:
    """The last epoch's ``train_accuracy`` minus its ``test_accuracy`` (fractions; None when either
    is missing: a cell's last epoch is always evaluated)."""
    last = records[-1] if records else {}
    train, test = last.get("train_accuracy"), last.get("test_accuracy")
    return None if train is None or test is None else train - test


def _final(found: Records, row: str, cell: str) -> float | None:
    return _mean([_tested(seed)[-1]["test_accuracy"] if _tested(seed) else None for seed in found.get((row, cell), [])])


def _first(found: Records, row: str, cell: str) -> float | None:
    return _mean([_tested(seed)[0]["test_accuracy"] if _tested(seed) else None for seed in found.get((row, cell), [])])


def _gap(found: Records, row: str, cell: str) -> float | None:
    return _mean([train_test_gap(seed) for seed in found.get((row, cell), [])])


def _gates(found: Records, row: str, cell: str) -> dict[int, float]:
    """Layer (1-based) -> mean over seeds of the last epoch's mean gate (empty when missing)."""
    per_seed = []
    for seed in found.get((row, cell), []):
        last = seed[-1] if seed else {}
        gates = {}
        for name, value in last.items():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "attn" and parts[2] == "gate" and math.isfinite(value):
                gates[int(parts[1].removeprefix("layer"))] = value
        per_seed.append(gates)
    layers = set.intersection(*(set(g) for g in per_seed)) if per_seed else set()
    return {layer: statistics.fmean(g[layer] for g in per_seed) for layer in sorted(layers)}


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _above(value: float | None, bound: float) -> bool | None:
    return None if value is None else value > bound


def _pts(value: float | None, sign: bool = False) -> str:
    return "-" if value is None else f"{100 * value:{'+' if sign else ''}.2f}"


def verdict(conditions: Sequence[bool | None]) -> str:
    """``"fails"`` if a condition is False, else ``"not measured yet"`` if one is None (or there are
    none), else ``"holds"``."""
    if any(c is False for c in conditions):
        return FAILS
    return MISSING if not conditions or any(c is None for c in conditions) else HOLDS


def _cells(jobs: Sequence[Job]) -> list[str]:
    return list(dict.fromkeys(job.cell for job in jobs))


def _precondition(grid: Grid, cells: list[str], found: Records) -> dict:
    small = cells[0]
    gaps = {row: _gap(found, row, small) for row in grid.calibrate_rows}
    return {"claim": f"precondition: the {small} cell is scarce data (the models overfit it)",
            "metric": f"train - test accuracy at the end of the {small} cell (last epoch; mean over seeds), points; "
                      f"needs >= {100 * SCARCE_GAP:.0f} for {' and '.join(grid.calibrate_rows)}",
            "values": ", ".join(f"{row} {_pts(gap)}" for row, gap in gaps.items()),
            "verdict": verdict([None if g is None else g >= SCARCE_GAP for g in gaps.values()])}


def _gpsa_beats_deit(cells: list[str], found: Records) -> dict:
    small, large = cells[0], cells[-1]
    diff = {c: _difference(_final(found, "convit-mini", c), _final(found, "deit-mini", c)) for c in (small, large)}
    values = "; ".join(f"{c}: convit-mini {_pts(_final(found, 'convit-mini', c))} vs deit-mini "
                       f"{_pts(_final(found, 'deit-mini', c))} ({_pts(diff[c], True)})" for c in (small, large))
    return {"claim": "(a) GPSA beats DeiT with scarce data, and the gap shrinks with more data (convit-mini vs "
                     "deit-mini)",
            "metric": f"final test accuracy, points; holds if convit-mini - deit-mini > 0 on {small} and larger on "
                      f"{small} than on {large}",
            "values": values + f"; shrinks by {_pts(_difference(diff[small], diff[large]), True)}",
            "verdict": verdict([_above(diff[small], 0.0), _above(_difference(diff[small], diff[large]), 0.0)])}


def _head_start(cells: list[str], found: Records) -> dict:
    conditions, parts = [], []
    for local, random in HEAD_START_PAIRS:
        for cell in cells:
            first = _difference(_first(found, local, cell), _first(found, random, cell))
            last = _difference(_final(found, local, cell), _final(found, random, cell))
            conditions.append(_above(first, 0.0))
            parts.append(f"{local} - {random} {cell}: first {_pts(first, True)} / last {_pts(last, True)}")
    return {"claim": "(b) local (conv) init gives a head start early in training",
            "metric": "test accuracy at the cell's first evaluation (and, for comparison, after the last), local "
                      "init minus random init, points; holds if every first-evaluation difference is > 0",
            "values": "; ".join(parts), "verdict": verdict(conditions)}


def _gate_claim(grid: Grid, cells: list[str], found: Records) -> dict:
    conditions, parts = [], []
    judged = grid.gate_rows[0] if grid.gate_rows else "convit-mini"
    for row in grid.gate_rows or (judged,):
        for cell in cells:
            gates = _gates(found, row, cell)
            if row == judged:
                first, last = (gates[min(gates)], gates[max(gates)]) if gates else (None, None)
                conditions += [None if first is None else first >= 0.5, None if last is None else last < 0.5]
            parts.append(f"{row} {cell}: " + (", ".join(f"L{layer} {g:.2f}" for layer, g in gates.items()) or "-"))
    return {"claim": "(c) gates: early layers stay positional, later layers turn to content",
            "metric": f"mean gate sigmoid(lambda) per layer after the last epoch (mean over heads and seeds); holds "
                      f"if {judged}'s first layer is >= 0.5 (mostly positional) and its last layer < 0.5 (mostly "
                      "content) in every cell",
            "values": "; ".join(parts), "verdict": verdict(conditions)}


def scarce_claims(grid: Grid, jobs: Sequence[Job], found: Records) -> list[dict]:
    """The precondition and ConViT's claims (a), (b), (c): dicts with ``claim``, ``metric``,
    ``values`` (text, points; ``-`` where a cell is missing) and ``verdict`` (:func:`verdict`).

    Args:
        jobs: the grid's planned jobs (their cells, smallest first, are the claims' cells).
        found: the finished cells' records (:func:`read_records`).
    """
    cells = _cells(jobs)
    return [_precondition(grid, cells, found), _gpsa_beats_deit(cells, found), _head_start(cells, found),
            _gate_claim(grid, cells, found)]


def gap_lines(jobs: Sequence[Job]) -> list[str]:
    """Markdown: the train - test gap at the end of every planned cell of the smallest fraction,
    per seed, read from its ``metrics.jsonl`` (``not finished yet`` for the others)."""
    small = _cells(jobs)[0]
    lines = [f"## Train - test gap of the {small} cells", "",
             f"Last epoch's training accuracy (augmented images) minus its test accuracy; the issue's criterion "
             f"for scarce data is >= {100 * SCARCE_GAP:.0f} points for the ResNet and the DeiT-style model.", "",
             "| cell | train (%) | test (%) | gap (points) |", "|---|---|---|---|"]
    for job in (j for j in jobs if j.cell == small):
        if job_state(job) != "finished":
            lines.append(f"| {job.label} | not finished yet | | |")
            continue
        records = _epoch_records(job)
        last = records[-1] if records else {}
        lines.append(f"| {job.label} | {_pts(last.get('train_accuracy'))} | {_pts(last.get('test_accuracy'))} | "
                     f"{_pts(train_test_gap(records), True)} |")
    return lines
