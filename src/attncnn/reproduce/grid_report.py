"""The sample-efficiency grid's report: ``report.md`` and ``report.json`` in the grid's folder.

A table of test accuracy per model and training-set size (mean ± std over the seeds run), the
training cost of each cell, and ConViT's claims next to the numbers that test them. Everything is
read from the cells' run folders, so the report of a grid run in parts says which cells are missing.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
from pathlib import Path
from typing import Sequence

import torch

from .._io import atomic_write_text
from ..analysis.runs import open_run, shareable_dataset
from ..models import count_parameters, get_preset
from .grid import Grid, row_of
from .machines import machine_segments, segments_text
from .suites import Job, job_state
from .summary import RunResult, mean_std

__all__ = ["grid_results", "grid_rows", "accuracy_of", "layer_values", "grid_claims", "write_grid_report"]

Cells = dict[tuple[str, str], list[RunResult]]


def grid_results(jobs: Sequence[Job]) -> Cells:
    """``(row, cell) -> finished runs`` (seeds in plan order; unfinished jobs left out). A row is a
    preset, or a grid's variant of one (:func:`~attncnn.reproduce.grid.row_of`)."""
    results: Cells = {}
    for job in jobs:
        if job_state(job) == "finished":
            results.setdefault((row_of(job), job.cell), []).append(RunResult(job, open_run(job.folder)))
    return results


def _cells(jobs: Sequence[Job]) -> list[str]:
    return list(dict.fromkeys(job.cell for job in jobs))


def accuracy_of(results: Cells, preset: str, cell: str) -> float | None:
    """Mean final test accuracy of a cell over its finished seeds (None: none finished)."""
    runs = results.get((preset, cell))
    return statistics.fmean(r.final_accuracy for r in runs) if runs else None


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
                     "machines": [machine_segments(r.epoch_records) for r in runs]}
            if runs:
                entry["accuracy_mean"], entry["accuracy_std"] = mean_std(entry["accuracies"])
                entry["train_hours"] = statistics.fmean(r.train_seconds for r in runs) / 3600
                entry["images_per_second"] = statistics.fmean(r.images_per_second for r in runs)
                row["parameters"] = count_parameters(runs[0].run.model)
            row["cells"][cell] = entry
        rows.append(row)
    return rows


def layer_values(result: RunResult, key: str) -> dict[int, float]:
    """Per layer, the logged ``attn/layer{l}/{key}`` of the run's last epoch (``distance``, ``gate``)."""
    last = result.epoch_records[-1]
    values = {}
    for name, value in last.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "attn" and parts[2] == key and math.isfinite(value):
            values[int(parts[1].removeprefix("layer"))] = value
    return dict(sorted(values.items()))


def _first_accuracy(results: Cells, preset: str, cell: str) -> float | None:
    runs = results.get((preset, cell))
    return statistics.fmean(r.records[0]["test_accuracy"] for r in runs) if runs else None


def _train_accuracy(results: Cells, preset: str, cell: str) -> float | None:
    """Mean training accuracy of the cell's last epoch (on augmented images, as logged)."""
    runs = results.get((preset, cell))
    return statistics.fmean(r.epoch_records[-1]["train_accuracy"] for r in runs) if runs else None


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _points(name: str, value) -> str:
    return f"{name} {'-' if value is None else f'{100 * value:+.2f}'}"


def _gain(results: Cells, better: str, base: str | Sequence[str], cell: str, at=accuracy_of) -> float | None:
    """Accuracy of ``better`` minus that of ``base`` (the best of several, among those finished in
    the cell) in one cell; None when ``better`` or every base is missing."""
    bases = [a for b in ([base] if isinstance(base, str) else base) if (a := at(results, b, cell)) is not None]
    mine = at(results, better, cell)
    return None if mine is None or not bases else mine - max(bases)


def grid_claims(jobs: Sequence[Job], results: Cells) -> list[dict]:
    """ConViT's claims next to the grid's numbers (points of test accuracy; no verdict: docs/study-efficiency.md
    gives it). Each: ``claim``, ``metric``, ``values`` (text; ``-`` where a cell is missing)."""
    cells, out = _cells(jobs), []
    presets = list(dict.fromkeys(row_of(j) for j in jobs))
    # Every claim below is about scarce data; it is only tested if the smallest subset is scarce at
    # the grid's budget, i.e. it costs accuracy (vs the largest) and the model fits it better than the
    # test set. An underfitted grid measures optimisation speed instead, whatever the subset size.
    small, large = cells[0], cells[-1]

    def scarcity(preset: str) -> str:
        cost = _difference(accuracy_of(results, preset, large), accuracy_of(results, preset, small))
        gap = _difference(_train_accuracy(results, preset, small), accuracy_of(results, preset, small))
        return f"{preset}: {_points(f'{large} vs {small}', cost)}, {_points('train - test', gap)}"

    out.append({"claim": "precondition: the smallest subset is scarce data at this budget (it costs accuracy, "
                         "the model overfits it)",
                "metric": f"per model, accuracy on {large} minus on {small}, and on {small} the last epoch's "
                          "training accuracy (augmented images) minus the test accuracy, points",
                "values": "; ".join(scarcity(p) for p in presets if any((p, c) in results for c in cells))})
    for random, conv in (("quadratic-mini", "quadratic-conv-mini"), ("learned-mini", "learned-conv-mini")):
        out.append({"claim": f"starting attention as a convolution helps most with little data ({conv} vs {random})",
                    "metric": "accuracy gain in points per training-set size",
                    "values": ", ".join(_points(c, _gain(results, conv, random, c)) for c in cells)})
        out.append({"claim": f"the gain of convolutional init is largest early in training ({conv} vs {random})",
                    "metric": "gain at the first evaluation vs after the last, per training-set size",
                    "values": ", ".join(f"{c}: {_points('first', _gain(results, conv, random, c, _first_accuracy))}"
                                        f" / {_points('last', _gain(results, conv, random, c))}" for c in cells)})
    out.append({"claim": "GPSA (local init, gated content) beats random-init attention, most with little data",
                "metric": "gpsa-mini minus the better of quadratic-mini and learned-mini (of those finished), points",
                "values": ", ".join(_points(c, _gain(results, "gpsa-mini", ("quadratic-mini", "learned-mini"), c))
                                    for c in cells)})
    gates = [(c, results[("gpsa-mini", c)][0]) for c in cells if ("gpsa-mini", c) in results]
    out.append({"claim": "GPSA's early layers stay positional, later layers turn to content (gates fall with depth)",
                "metric": "mean gate sigmoid(lambda) per layer after training (first seed)",
                "values": "; ".join(f"{c}: " + ", ".join(f"L{layer} {g:.2f}" for layer, g in
                                                          layer_values(r, "gate").items()) for c, r in gates) or "-"})
    attention = [p for p in presets if p != "resnet18-mini"]
    out.append({"claim": "a real convolution (ResNet) is still the most sample-efficient at this scale",
                "metric": "resnet18-mini minus the best attention model finished in the cell, points",
                "values": ", ".join(_points(c, _gain(results, "resnet18-mini", attention, c)) for c in cells)})
    return out


def _table(rows: Sequence[dict], cells: Sequence[str], recipe: str) -> list[str]:
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


def _model_lines(grid: Grid, rows: Sequence[str]) -> list[str]:
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


def _claim_line(claim: dict) -> str:
    verdict = f"**{claim['verdict']}**: " if claim.get("verdict") else ""
    return f"- {verdict}{claim['claim']}: {claim['metric']}: {claim['values']}"


def write_grid_report(grid: Grid, out: str | Path, jobs: Sequence[Job], results: Cells,
                      figures: dict[str, Path], *, command: str, claims: list[dict] | None = None,
                      sections: Sequence[str] = ()) -> Path:
    """Write ``<out>/report.md`` and ``<out>/report.json``; returns the Markdown file.

    Args:
        claims: the claims section, dicts with ``claim``, ``metric``, ``values`` and optionally
            ``verdict`` (None: :func:`grid_claims`, issue 14's).
        sections: further Markdown lines, written after the claims (``efficiency-scarce``: the
            train-test gap of every scarce cell).

    Raises:
        OSError: ``out`` not writable.
    """
    out = Path(out)
    rows, cells = grid_rows(jobs, results), _cells(jobs)
    found = grid_claims(jobs, results) if claims is None else claims
    missing = [j.label for j in jobs if (row_of(j), j.cell) not in results
               or j.seed not in [r.job.seed for r in results[(row_of(j), j.cell)]]]
    dataset = shareable_dataset(next(iter(results.values()))[0].run.metadata) if results else None
    md = [f"# Sample-efficiency grid `{grid.name}`", "", grid.description + ".", "",
          f"Data: {dataset}. Report written by `{command}` with torch {torch.__version__}, Python "
          f"{platform.python_version()}.", "", "## Test accuracy (%) per training-set size", "",
          *_table(rows, cells, grid.recipe), "",
          "Cells not finished yet: " + (", ".join(missing) if missing else "none") + ".", "",
          "## ConViT's claims, measured", ""]
    md += [_claim_line(c) for c in found] + ([""] + list(sections) if sections else [])
    md += ["", "## Machines", "", "Where each cell's epochs trained (hours and images/s compare only within one machine):",
           "", "| cell | seed | trained on |", "|---|---|---|"]
    md += [f"| {row['preset']} {cell} | {seed} | {segments_text(segments)} |" for row in rows
           for cell, entry in row["cells"].items() for seed, segments in zip(entry["seeds"], entry["machines"])]
    md += ["", "## Figures", ""] + [f"- {key}: [{path.name}]({path.relative_to(out).as_posix()})"
                                     for key, path in figures.items()]
    md += ["", "## Models", ""] + _model_lines(grid, list(dict.fromkeys(row_of(j) for j in jobs)))
    report = {"grid": grid.name, "command": command, "dataset": dataset, "rows": rows, "claims": found,
              "missing": missing, "figures": {k: p.relative_to(out).as_posix() for k, p in figures.items()}}
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return out / "report.md"
