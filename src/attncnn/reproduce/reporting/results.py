"""What a study's finished runs hold, read from their run folders: each finished job's run and
records (:class:`RunResult`), grouped as a suite's (by preset) or a grid's (by row and cell), and
the per-epoch records alone (:func:`read_records`: no model is loaded).

Everything here is read from the run folders (``config.json``, ``metrics.jsonl``, the checkpoint),
so a report can be rebuilt from shipped, trimmed folders without training or timing anything.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ...analysis.runs import Run, open_run
from ...runs import RunFolder
from ..running.runner import Job, job_state, row_of
from ..studies import Grid, Study

__all__ = ["RunResult", "Cells", "Records", "finished_results", "read_records",
           "epoch_records", "tested", "layer_values", "train_test_gap", "run_stats", "layer_curves"]

#: a grid's finished runs: ``(row, cell) -> runs`` (seeds in plan order)
Cells = dict[tuple[str, str], list["RunResult"]]
#: per (row, cell): each finished seed's per-epoch records, seeds in plan order
Records = dict[tuple[str, str], list[list[dict]]]


@dataclass
class RunResult:
    """One finished job with its run (model from the ``last`` checkpoint) and its per-epoch records."""

    job: Job
    run: Run

    @property
    def epoch_records(self) -> list[dict]:
        """Every epoch's record (with ``eval_every`` > 1 some have no test metrics)."""
        return [r for r in self.run.metrics if isinstance(r.get("epoch"), int)]

    @property
    def records(self) -> list[dict]:
        """The records of the epochs evaluated on the test set (every epoch by default)."""
        return tested(self.epoch_records)

    @property
    def final_accuracy(self) -> float:
        return self.records[-1]["test_accuracy"]

    @property
    def best(self) -> tuple[float, int]:
        best = max(self.records, key=lambda r: r["test_accuracy"])
        return best["test_accuracy"], best["epoch"]

    @property
    def train_seconds(self) -> float:
        """Wall-clock seconds of the training epochs plus their evaluations, as logged."""
        return sum(r.get("seconds", 0.0) + r.get("eval_seconds", 0.0) for r in self.epoch_records)

    @property
    def images_per_second(self) -> float:
        """Training images per second, the median over epochs (robust to one slow, shared epoch)."""
        return statistics.median(r.get("images_per_second", 0.0) for r in self.epoch_records)


def finished_results(study: Study, jobs: Sequence[Job]) -> dict:
    """The finished runs of any study's jobs (jobs without ``finished.json`` are left out), seeds in
    plan order: a suite's by preset (``preset -> runs``), a grid's by row and cell (:data:`Cells`; a
    row is a preset, or a name whose recipe names its preset: :func:`~attncnn.reproduce.running.runner.row_of`)."""
    results: dict = {}
    for job in jobs:
        if job_state(job) == "finished":
            key = (row_of(job), job.cell) if isinstance(study, Grid) else job.preset
            results.setdefault(key, []).append(RunResult(job, open_run(job.folder, withheld=True)))
    return results


def read_records(jobs: Sequence[Job]) -> Records:
    """``(row, cell) -> [epoch records of each finished seed]`` from the cells' ``metrics.jsonl``.

    Raises:
        ValueError: a job folder holding another run (from :func:`~attncnn.reproduce.running.runner.job_state`).
    """
    found: Records = {}
    for job in jobs:
        if job_state(job) == "finished":
            found.setdefault((row_of(job), job.cell), []).append(epoch_records(job))
    return found


def epoch_records(job: Job) -> list[dict]:
    """The records of ``job``'s epochs in its ``metrics.jsonl``."""
    return [r for r in RunFolder(job.folder, mode="read").read_metrics() if isinstance(r.get("epoch"), int)]


def tested(records: Sequence[dict]) -> list[dict]:
    """The ``records`` with a test accuracy (with ``eval_every`` > 1 some epochs have none)."""
    return [r for r in records if isinstance(r.get("test_accuracy"), (int, float))]


def train_test_gap(records: list[dict]) -> float | None:
    """The last epoch's ``train_accuracy`` minus its ``test_accuracy`` (fractions; None when either
    is missing: a cell's last epoch is always evaluated)."""
    last = records[-1] if records else {}
    train, test = last.get("train_accuracy"), last.get("test_accuracy")
    return None if train is None or test is None else train - test


def run_stats(runs: Sequence[RunResult]) -> dict:
    """A row's (or a cell's) finished ``runs``: ``accuracy_mean`` and ``accuracy_std`` of their final
    accuracies (fractions; sample standard deviation, None for one run), ``train_hours`` (mean per
    seed) and ``images_per_second`` (mean of :attr:`RunResult.images_per_second`)."""
    accuracies = [r.final_accuracy for r in runs]
    return {"accuracy_mean": statistics.fmean(accuracies),
            "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else None,
            "train_hours": statistics.fmean(r.train_seconds for r in runs) / 3600,
            "images_per_second": statistics.fmean(r.images_per_second for r in runs)}


def layer_values(record: dict, key: str) -> dict[int, float]:
    """Layer (1-based) -> ``attn/layer{L}/{key}`` of one record, layers ascending (numbers only,
    non-finite ones included; ``{}`` when not logged)."""
    found = {}
    for name, value in record.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "attn" and parts[2] == key and isinstance(value, (int, float)):
            found[int(parts[1].removeprefix("layer"))] = float(value)
    return dict(sorted(found.items()))


def layer_curves(results: Sequence[RunResult], key: str) -> dict[int, tuple[list[int], list[float]]]:
    """Per layer, ``(epochs, values)`` of the logged ``attn/layer{l}/{key}`` averaged over the runs.

    ``key`` is ``"distance"`` (mean attention distance, tokens) or ``"grid_distance"`` (mean
    distance of the heads to the nearest K x K grid of shifts, tokens). Only position-only models
    log these per epoch; others give ``{}``.
    """
    curves: dict[int, dict[int, list[float]]] = {}
    for result in results:
        for record in result.epoch_records:
            for layer, value in layer_values(record, key).items():
                if math.isfinite(value):
                    curves.setdefault(layer, {}).setdefault(record["epoch"], []).append(value)
    return {layer: (sorted(by_epoch), [statistics.fmean(by_epoch[e]) for e in sorted(by_epoch)])
            for layer, by_epoch in sorted(curves.items())}
