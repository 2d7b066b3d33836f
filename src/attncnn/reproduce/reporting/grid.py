"""The sections of a sample-efficiency grid's report: accuracy per row and training-set size
(:func:`grid_rows`, :func:`table_lines`), where each cell trained, the models, and the train - test
gap of every smallest cell (:func:`gap_lines`, for a grid with an ``overfit`` criterion).
:func:`~attncnn.reproduce.reporting.report.write_report` puts them together.

Everything is read from the cells' run folders, so the report of a grid run in parts says which
cells are missing.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ...models import count_parameters, get_preset
from ..running.jobs import Job, job_state, row_of
from ..running.machines import run_segments, segments_text
from ..studies import Grid
from .results import Cells, epoch_records, mean_std, train_test_gap

__all__ = ["grid_rows", "table_lines", "machine_lines", "model_lines", "gap_lines"]


def _cells(jobs: Sequence[Job]) -> list[str]:
    return list(dict.fromkeys(job.cell for job in jobs))


def grid_rows(jobs: Sequence[Job], results: Cells) -> list[dict]:
    """One row per grid row: ``preset`` (the row's name: a preset or a grid's variant of one),
    ``parameters`` and ``cells``: cell -> ``seeds``, ``accuracies``, ``accuracy_mean``/``accuracy_std``
    (fractions), ``train_images``, ``epochs``, ``seen_images``, ``train_hours`` (mean per seed),
    ``images_per_second`` (None where not run)."""
    rows = []
    for preset in dict.fromkeys(row_of(job) for job in jobs):
        row: dict = {"preset": preset, "parameters": None, "cells": {}}
        for cell in _cells(jobs):
            job = next(j for j in jobs if (row_of(j), j.cell) == (preset, cell))
            options, runs = dict(job.overrides), results.get((preset, cell), [])
            entry = {"seeds": [r.job.seed for r in runs], "accuracies": [r.final_accuracy for r in runs],
                     "accuracy_mean": None, "accuracy_std": None, "train_images": options["train_subset"],
                     "epochs": options["epochs"], "seen_images": options["train_subset"] * options["epochs"],
                     "train_hours": None, "images_per_second": None,
                     "machines": [run_segments(r.job.folder, r.epoch_records) for r in runs]}
            if runs:
                entry["accuracy_mean"], entry["accuracy_std"] = mean_std(entry["accuracies"])
                entry["train_hours"] = statistics.fmean(r.train_seconds for r in runs) / 3600
                entry["images_per_second"] = statistics.fmean(r.images_per_second for r in runs)
                row["parameters"] = count_parameters(runs[0].run.network())
            row["cells"][cell] = entry
        rows.append(row)
    return rows


def machine_lines(rows: Sequence[dict]) -> list[str]:
    """Markdown table: the machines each seed of each cell of :func:`grid_rows` trained on."""
    lines = ["| cell | seed | trained on |", "|---|---|---|"]
    return lines + [f"| {row['preset']} {cell} | {seed} | {segments_text(segments)} |" for row in rows
                    for cell, entry in row["cells"].items()
                    for seed, segments in zip(entry["seeds"], entry["machines"])]


def table_lines(rows: Sequence[dict], cells: Sequence[str], recipe: str) -> list[str]:
    """Markdown: test accuracy per row and cell of :func:`grid_rows`, then how the cells trained."""
    first = next(iter(rows[0]["cells"].values())) if rows else None
    head = ["model", "params"] + [f"{c} ({rows[0]['cells'][c]['train_images']:,} img, "
                                  f"{rows[0]['cells'][c]['epochs']} ep)" for c in cells]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        out = [row["preset"], "-" if row["parameters"] is None else f"{row['parameters']:,}"]
        for cell in cells:
            e = row["cells"][cell]
            text = "not run yet" if e["accuracy_mean"] is None else f"{100 * e['accuracy_mean']:.2f}"
            if e["accuracy_std"] is not None:
                text += f" ± {100 * e['accuracy_std']:.2f}"
            if e["seeds"]:
                text += f" ({len(e['seeds'])} seed{'s' if len(e['seeds']) > 1 else ''}, {e['train_hours']:.2f} h)"
            out.append(text)
        lines.append("| " + " | ".join(out) + " |")
    seen = f"{first['seen_images']:,}" if first else "-"
    return lines + ["", f"Every cell: {seen} seen images (the preset's recipe: {recipe}); test accuracy after the "
                        "last epoch on the full test set, mean ± sample std over seeds; hours: logged training + "
                        "evaluation time per seed."]


def model_lines(grid: Grid, rows: Sequence[str]) -> list[str]:
    """One line per row: the preset's description, or a variant's preset, options and description."""
    lines = []
    for row in rows:
        if row in grid.variants:
            variant = grid.variants[row]
            options = " ".join(f"--set {k}={v}" for k, v in variant.model)
            lines.append(f"- `{row}`: `{variant.preset}` with `{options}`: {variant.description}")
        else:
            lines.append(f"- `{row}`: {get_preset(row).description}")
    return lines


def _pts(value: float | None, sign: bool = False) -> str:
    return "-" if value is None else f"{100 * value:{'+' if sign else ''}.2f}"


def gap_lines(grid: Grid, jobs: Sequence[Job]) -> list[str]:
    """Markdown: the train - test gap at the end of every planned cell of the smallest fraction,
    per seed, read from its ``metrics.jsonl`` (``not finished yet`` for the others), beside the
    grid's ``overfit`` criterion."""
    small = _cells(jobs)[0]
    lines = [f"## Train - test gap of the {small} cells", "",
             f"Last epoch's training accuracy (augmented images) minus its test accuracy; the study's criterion "
             f"for scarce data is {grid.overfit.op} {100 * grid.overfit.threshold:.0f} points for the ResNet and the "
             "DeiT-style model.", "", "| cell | train (%) | test (%) | gap (points) |", "|---|---|---|---|"]
    for job in (j for j in jobs if j.cell == small):
        if job_state(job) != "finished":
            lines.append(f"| {job.label} | not finished yet | | |")
            continue
        records = epoch_records(job)
        last = records[-1] if records else {}
        lines.append(f"| {job.label} | {_pts(last.get('train_accuracy'))} | {_pts(last.get('test_accuracy'))} | "
                     f"{_pts(train_test_gap(records), True)} |")
    return lines
