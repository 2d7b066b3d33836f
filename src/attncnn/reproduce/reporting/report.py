"""A study's report, :func:`write_report`: ``report.md`` and ``report.json`` in its folder, written
atomically, of the shape the study declares: a Table 1 suite's (the sections of :mod:`.table1`) or a
grid's (accuracy per row and training-set size, its claims judged, the machines, the models; a grid
run in parts lists the cells missing).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Sequence

import torch

from ..._io import atomic_write_text
from ...analysis.locality import LOCAL_HEAD_DISTANCE
from ...analysis.runs import shareable_dataset
from ...data.jpeg import describe_jpeg, jpeg_encoding
from ...models import count_parameters, get_preset
from ..running.runner import Job, job_state, row_of, rows_and_cells
from ..running.machines import progress_text, run_progress, run_segments, segments_text
from ..studies import Grid, Study, Suite
from .claims import RunNumbers, cell_numbers, evaluate_claims, points
from .locality import locality_lines, locality_summary, suite_locality
from .results import Cells, RunResult, epoch_records, run_stats, train_test_gap
from .table1 import (CONVENTIONS, epoch_sections, final_layer_metrics, layer_lines, markdown_table, seed_lines,
                     table_rows)

__all__ = ["write_report", "data_line", "grid_rows", "table_lines", "machine_lines", "model_lines", "gap_lines"]


def write_report(study: Study, out: str | Path, jobs: Sequence[Job], results: dict, figures: dict[str, Path], *,
                 command: str, data: str | None = None, data_dir: str | None = None) -> Path:
    """Write ``<out>/report.md`` and ``<out>/report.json``; returns the Markdown file.

    Args:
        jobs: the study's planned jobs (those not finished are listed as missing).
        results: the finished runs (:func:`~attncnn.reproduce.reporting.results.finished_results`).
        figures: figure key -> file (:func:`~attncnn.reproduce.reporting.figures.draw_figures`).
        command: the command line, for the report's reader.
        data, data_dir: data set of the test images a suite's content models are analysed on
            (default: each run's own).

    Raises:
        OSError: ``out`` not writable.
        attncnn.data.DataError: test images of a content model cannot be read.
    """
    out = Path(out)
    if isinstance(study, Grid):
        before, after, report, later = _grid_report(study, jobs, results, command=command, data=data)
    else:
        before, after, report, later = _suite_report(study, out, jobs, results, command=command, data=data,
                                                     data_dir=data_dir)
    md = before + ["", "## Figures", ""] + [f"- {key}: [{path.name}]({path.relative_to(out).as_posix()})"
                                             for key, path in figures.items()] + after
    report = {**report, "figures": {k: p.relative_to(out).as_posix() for k, p in figures.items()}, **later}
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return out / "report.md"


def rows_dataset(rows: Sequence[dict]) -> str | None:
    """The data set the finished rows of a table trained on (the first named; None: no row finished)."""
    return next((row["dataset"] for row in rows if row.get("dataset")), None)


def data_line(dataset: str | None, data: str | None) -> str:
    """A report's sentence naming its data set (``dataset``: :func:`~attncnn.analysis.runs.shareable_dataset`)
    and, where the report was written with the data file at hand (``data``, a path of the same file
    name), how its JPEG files were encoded (:mod:`attncnn.data.jpeg`): a JPEG copy of CIFAR-10 is not
    the official binaries, and its accuracies are not theirs."""
    if dataset is None:
        return "Data: none finished yet."
    line = f"Data: {dataset}"
    if data is not None and Path(dataset.split(" (")[0]).name == Path(data).name and Path(data).exists():
        encoding = jpeg_encoding(data)
        if encoding is not None:
            line += f", stored as {describe_jpeg(encoding)}: accuracies on it are not those on the original images"
    return line + "."


def _missing(jobs: Sequence[Job], results: dict, key) -> list[str]:
    """The labels of the planned ``jobs`` without a finished run in ``results`` (by ``key(job)``)."""
    return [j.label for j in jobs if j.seed not in [r.job.seed for r in results.get(key(j), [])]]


def _claim_line(claim: dict) -> str:
    verdict = f"**{claim['verdict']}**: " if claim.get("verdict") else ""
    return f"- {verdict}{claim['claim']}: {claim['metric']}: {claim['values']}"


def _suite_report(suite: Suite, out: Path, planned: Sequence[Job], results: dict[str, list[RunResult]], *,
                  command: str, data: str | None, data_dir: str | None) -> tuple[list[str], list[str], dict, dict]:
    """A Table 1 suite's Markdown before and after its figures, and its ``report.json`` entries
    before and after them."""
    rows = table_rows(suite, results, planned)
    layers = {preset: final_layer_metrics(runs[0], data=data, data_dir=data_dir) for preset, runs in results.items()}
    locality = suite_locality(results, data=data, data_dir=data_dir)
    for row in rows:
        if row["preset"] in locality:
            row["locality"] = locality_summary(locality[row["preset"]])
    found = evaluate_claims(suite.claims, RunNumbers(rows, layers, results))
    missing = _missing(planned, results, lambda job: job.preset)
    # unfinished runs say how far they got and what their epochs cost where they ran (why they are unfinished)
    progress = {j.label: p for j in planned if j.label in missing and (p := run_progress(j)) is not None}
    for row in rows:
        started = [p for j in planned if j.preset == row["preset"] and (p := progress.get(j.label))]
        if row["accuracy_mean"] is None and started:
            furthest = max(started, key=lambda p: p["epochs_done"])
            row["unfinished"] = f"epoch {furthest['epochs_done']} of {furthest['epochs']}"
    md = [f"# Reproduction suite `{suite.name}`", "", suite.description + ".", "",
          f"{data_line(rows_dataset(rows), data)} Report written by `{command}` with torch {torch.__version__}, "
          f"Python {platform.python_version()}; each run's own machine is in the per-run table.", "", "## Table 1", "",
          markdown_table(rows),
          CONVENTIONS, "",
          "Runs not finished yet: " + (", ".join(f"{label} ({progress_text(progress[label])})" if label in progress
                                                else label for label in missing) if missing else "none") + ".", "",
          "## Every run", "", *seed_lines(results), "",
          "## Attention per layer after training", "",
          "First seed of each model; content models averaged over 100 test images.", "", *layer_lines(layers), "",
          *_locality_section(locality, rows_dataset(rows)),
          "## The paper's claims, measured", ""]
    md += [_claim_line(c) for c in found] or ["- (no finished run tests a claim yet)"]
    report = {"suite": suite.name, "command": command, "rows": rows, "layers": layers, "locality": locality,
              "claims": found, "missing": missing, "unfinished": progress}
    later = {"presets": {p: get_preset(p).description for p in suite.rows}}
    if suite.settle_epochs:                  # a suite followed over epochs (mini-long)
        started = [j for j in planned if j.label in progress]          # unfinished, with epochs so far
        lines, later["epoch_study"] = epoch_sections(suite, out, rows, results, started)
        md += ["", *lines]
    after = ["", "## Use the trained models", "",
             "Each model folder is an ordinary run folder: `attncnn evaluate <folder> --data <data set>`, "
             "`attncnn inspect <folder>`, `attncnn plot <folder>`, `attncnn viewer <folder>`."]
    return md, after, report, later


def _locality_section(locality: dict[str, list[dict]], dataset: str | None) -> list[str]:
    """The report's locality section (:mod:`.locality`): how it was measured, then every seed's layers."""
    if not locality:
        return []
    counts = sorted({m["images"] for runs in locality.values() for m in runs} - {0})
    images = (f"content models averaged over the first {' / '.join(f'{c:,}' for c in counts)} test images of "
              f"{(dataset or 'the data set named above').split(' (')[0]} (the data set named above)") if counts else \
        "no model here needed images"
    return ["## Locality per layer after training", "",
            "Every seed. Mean attention distance (ViT, Dosovitskiy et al. 2021, Fig. 7): the attention-weighted "
            "Euclidean distance between query and key on the token grid, averaged over every query (border "
            "queries included) and the test images; normalised entropy: each query's entropy over log(number of "
            "keys) (0 one-hot, 1 uniform), averaged likewise. Position-only models (quadratic, learned) need no "
            f"images: their maps are the same for every image; {images}. Heads within "
            f"{LOCAL_HEAD_DISTANCE:g} tokens stay, on average, within a 3x3 convolution's reach. Per head: "
            "`report.json` (`locality`) and the `locality-<model>` figures.", "", *locality_lines(locality), ""]


def _grid_report(grid: Grid, jobs: Sequence[Job], results: Cells, *,
                 command: str, data: str | None = None) -> tuple[list[str], list[str], dict, dict]:
    """A grid's Markdown before and after its figures, and its ``report.json`` entries before them
    (none after)."""
    rows, (names, cells) = grid_rows(jobs, results), rows_and_cells(jobs)
    found = evaluate_claims(grid.claims, cell_numbers(jobs))
    missing = _missing(jobs, results, lambda job: (row_of(job), job.cell))
    dataset = shareable_dataset(next(iter(results.values()))[0].run.metadata) if results else None
    md = [f"# Sample-efficiency grid `{grid.name}`", "", grid.description + ".", "",
          f"{data_line(dataset, data)} Report written by `{command}` with torch {torch.__version__}, Python "
          f"{platform.python_version()}.", "", "## Test accuracy (%) per training-set size", "",
          *table_lines(rows, cells, grid.recipe), "",
          "Cells not finished yet: " + (", ".join(missing) if missing else "none") + ".", "",
          "## ConViT's claims, measured", ""]
    md += [_claim_line(c) for c in found] + (["", *gap_lines(grid, jobs)] if grid.overfit else [])
    md += ["", "## Machines", "",
           "Where each cell's epochs trained (hours and images/s compare only within one machine):", "",
           *machine_lines(rows)]
    report = {"grid": grid.name, "command": command, "dataset": dataset, "rows": rows, "claims": found,
              "missing": missing}
    after = ["", "## Models", "", *model_lines(grid, names)]
    return md, after, report, {}


def grid_rows(jobs: Sequence[Job], results: Cells) -> list[dict]:
    """One row per grid row: ``preset`` (the row's name: a preset, or a name whose recipe names its preset),
    ``parameters`` and ``cells``: cell -> ``seeds``, ``accuracies``, ``accuracy_mean``/``accuracy_std``
    (fractions), ``train_images``, ``epochs``, ``seen_images``, ``train_hours`` (mean per seed),
    ``images_per_second`` (None where not run)."""
    rows, (names, cells) = [], rows_and_cells(jobs)
    for preset in names:
        row: dict = {"preset": preset, "parameters": None, "cells": {}}
        for cell in cells:
            job = next(j for j in jobs if (row_of(j), j.cell) == (preset, cell))
            options, runs = dict(job.overrides), results.get((preset, cell), [])
            entry = {"seeds": [r.job.seed for r in runs], "accuracies": [r.final_accuracy for r in runs],
                     "accuracy_mean": None, "accuracy_std": None, "train_images": options["train_subset"],
                     "epochs": options["epochs"], "seen_images": options["train_subset"] * options["epochs"],
                     "train_hours": None, "images_per_second": None,
                     "machines": [run_segments(r.job.folder, r.epoch_records) for r in runs]}
            if runs:
                entry.update(run_stats(runs))
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
    """One line per row: the preset's description, or the preset its recipe names, its model options and note."""
    lines = []
    for row in rows:
        recipe = grid.rows[row]
        if "preset" in recipe:
            options = " ".join(f"--set {k}={v}" for k, v in recipe.get("model", {}).items())
            lines.append(f"- `{row}`: `{recipe['preset']}` with `{options}`: {grid.notes.get(row, '')}")
        else:
            lines.append(f"- `{row}`: {get_preset(row).description}")
    return lines


def gap_lines(grid: Grid, jobs: Sequence[Job]) -> list[str]:
    """Markdown: the train - test gap at the end of every planned cell of the smallest fraction,
    per seed, read from its ``metrics.jsonl`` (``not finished yet`` for the others), beside the
    grid's ``overfit`` criterion."""
    small = rows_and_cells(jobs)[1][0]
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
        lines.append(f"| {job.label} | {points(last.get('train_accuracy'))} | {points(last.get('test_accuracy'))} | "
                     f"{points(train_test_gap(records), True)} |")
    return lines
