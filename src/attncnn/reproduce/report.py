"""The suite's report: ``report.md`` (Table 1 beside the paper's, per-seed results, the measured
claims, figures) and ``report.json`` (the same numbers for programs), written atomically.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Sequence

import torch

from .._io import atomic_write_text
from ..analysis.metrics import model_metrics
from ..analysis.runs import test_count, test_images
from ..layers import attention_modules
from ..models import get_preset
from .epoch_report import epoch_sections
from .machines import segments_text
from .runner import MACHINE_FILE
from .suites import Job, Suite
from .summary import RunResult, layer_curves, markdown_table, table_rows
from .unfinished import progress_text, run_progress

__all__ = ["write_report", "final_layer_metrics", "claims"]

_CONVENTIONS = (
    "Accuracy: test accuracy after the last epoch on the 10,000 test images of the data set named below, "
    "mean ± sample standard deviation over the seeds run. GMAC/img (ours): multiply-accumulates of one "
    "forward pass, attention products included (dense-attention convention, FlopCounterMode / 2). "
    "Paper-style GFLOPS: the paper's Table 1 convention reconstructed: 2 x the MACs of the linear layers "
    "for attention models (6.2 B / 15 B at paper scale), plain MACs for the ResNet (0.56 B). Train time: "
    "logged training + evaluation seconds, mean per seed; img/s: median over epochs of the logged training "
    "speed. Precision: of training (bf16 = bfloat16 autocast, loss and softmax in float32).")


def final_layer_metrics(result: RunResult, *, images: int = 100, data: str | None = None,
                        data_dir: str | None = None) -> list[dict] | None:
    """Per layer of the trained model: attention distance, distance to the 3x3 grid of shifts,
    degenerate heads (quadratic), from ``images`` test images (position-only models need none).
    None for a model without attention layers."""
    model = result.run.model
    if not hasattr(getattr(model, "config", None), "attention"):
        return None
    batch = None
    if not all(layer.position_only for layer in attention_modules(model)):
        images = min(images, test_count(result.run, data=data, data_dir=data_dir))
        batch, _ = test_images(result.run, list(range(images)), data=data, data_dir=data_dir)
    metrics = model_metrics(model, batch)
    return [{"layer": lay["layer"], "distance": lay["distance"], "grid_distance": lay["grid_distance"],
             "degenerate_heads": lay.get("degenerate_heads"), "num_heads": lay["num_heads"]}
            for lay in metrics["layers"]]


def claims(rows: Sequence[dict], layers: dict[str, list[dict] | None],
           results: dict[str, list[RunResult]]) -> list[dict]:
    """The paper's claims next to the numbers that test them (no verdict: docs/study-mini.md gives it)."""
    by_kind = {row["paper_preset"]: row for row in rows}
    preset_of = {row["paper_preset"]: row["preset"] for row in rows}
    out = []
    quad = preset_of.get("quadratic")
    if quad in results:
        grid = layer_curves(results[quad], "grid_distance").get(1)
        if grid:
            out.append({"claim": "early-layer quadratic heads settle on a grid of shifts around the query",
                        "metric": f"{quad} layer 1: mean head distance to the nearest 3x3 grid of shifts, "
                                  f"epoch {grid[0][0]} -> {grid[0][-1]} (tokens)",
                        "values": [round(grid[1][0], 3), round(grid[1][-1], 3)]})
    for paper_name in ("quadratic", "learned"):
        name = preset_of.get(paper_name)
        if layers.get(name):
            out.append({"claim": "deeper layers attend further" if paper_name == "quadratic"
                        else "learned position-only heads are local in early layers",
                        "metric": f"{name}: mean attention distance per layer 1..L after training (tokens)",
                        "values": [round(lay["distance"], 3) for lay in layers[name]]})
    if by_kind.get("learned-content", {}).get("accuracy_mean") is not None and \
            by_kind.get("learned", {}).get("accuracy_mean") is not None:
        out.append({"claim": "adding content attention does not raise accuracy (paper: 87.1 % vs 91.8 %)",
                    "metric": "test accuracy %: learned + content vs learned position-only",
                    "values": [round(100 * by_kind["learned-content"]["accuracy_mean"], 2),
                               round(100 * by_kind["learned"]["accuracy_mean"], 2)]})
    gen = preset_of.get("quadratic-generalized")
    if layers.get(gen):
        out.append({"claim": "full-covariance heads degenerate and can be pruned",
                    "metric": f"{gen}: degenerate heads per layer (condition number > 1000 or an "
                              "eigenvalue < 1e-5, PAPER.md 3.8), of 9",
                    "values": [lay["degenerate_heads"] for lay in layers[gen]]})
    return out


def _seed_lines(results: dict[str, list[RunResult]]) -> list[str]:
    lines = ["| model | seed | final acc. % | best acc. % (epoch) | epochs | train time (h) | img/s | "
             "data set | machine |", "|---|---|---|---|---|---|---|---|---|"]
    for preset, runs in results.items():
        for r in runs:
            best, epoch = r.best
            machine = _machine(r)
            lines.append(f"| {preset} | {r.job.seed} | {100 * r.final_accuracy:.2f} | {100 * best:.2f} ({epoch}) | "
                         f"{len(r.epoch_records)} | {r.train_seconds / 3600:.2f} | {r.images_per_second:.0f} | "
                         f"{r.run.metadata.get('dataset_name') or '-'} | {machine} |")
    return lines


def _machine(result: RunResult) -> str:
    path = result.job.folder / MACHINE_FILE
    if not path.is_file():
        return "not recorded"
    info = json.loads(path.read_text())
    if len(info.get("segments") or []) > 1:                # the run changed machine or precision mid-way
        return segments_text(info["segments"])
    return f"{info.get('cpu', '?')}, {info.get('torch_threads', '?')} threads, torch {info.get('torch', '?')}" + \
        (f", {info['gpu']}" if info.get("gpu") else "")


def _layer_lines(layers: dict[str, list[dict] | None]) -> list[str]:
    lines = ["| model | per layer 1..L: attention distance (tokens) | distance to 3x3 grid (tokens) | "
             "degenerate heads |", "|---|---|---|---|"]
    for preset, per_layer in layers.items():
        if per_layer:
            distance = " / ".join(f"{lay['distance']:.2f}" for lay in per_layer)
            grid = " / ".join(f"{lay['grid_distance']:.2f}" for lay in per_layer)
            degenerate = " / ".join("-" if lay["degenerate_heads"] is None else str(lay["degenerate_heads"])
                                    for lay in per_layer)
            lines.append(f"| {preset} | {distance} | {grid} | {degenerate} |")
    return lines


def write_report(suite: Suite, out: str | Path, planned: Sequence[Job], results: dict[str, list[RunResult]],
                 figures: dict[str, Path], *, command: str, data: str | None = None,
                 data_dir: str | None = None) -> Path:
    """Write ``<out>/report.md`` and ``<out>/report.json``; returns the Markdown file.

    Raises:
        OSError: ``out`` not writable.
        attncnn.data.DataError: test images of a content model cannot be read.
    """
    out = Path(out)
    rows = table_rows(suite, results, planned)
    layers = {preset: final_layer_metrics(runs[0], data=data, data_dir=data_dir) for preset, runs in results.items()}
    found = claims(rows, layers, results)
    missing = [j.label for j in planned if j.preset not in results or
               j.seed not in [r.job.seed for r in results[j.preset]]]
    # unfinished runs say how far they got and what their epochs cost where they ran (why they are unfinished)
    progress = {j.label: run_progress(j) for j in planned if j.label in missing}
    progress = {label: p for label, p in progress.items() if p is not None}
    for row in rows:
        started = [p for j in planned if j.preset == row["preset"] and (p := progress.get(j.label))]
        if row["accuracy_mean"] is None and started:
            furthest = max(started, key=lambda p: p["epochs_done"])
            row["unfinished"] = f"epoch {furthest['epochs_done']} of {furthest['epochs']}"
    md = [f"# Reproduction suite `{suite.name}`", "", suite.description + ".", "",
          f"Report written by `{command}` with torch {torch.__version__}, Python {platform.python_version()}; "
          "each run's own machine is in the per-run table.", "", "## Table 1", "", markdown_table(rows), _CONVENTIONS, "",
          "Runs not finished yet: " + (", ".join(f"{label} ({progress_text(progress[label])})" if label in progress
                                                else label for label in missing) if missing else "none") + ".", "",
          "## Every run", "", *_seed_lines(results), "",
          "## Attention per layer after training", "",
          "First seed of each model; content models averaged over 100 test images.", "", *_layer_lines(layers), "",
          "## The paper's claims, measured", ""]
    md += [f"- {c['claim']}: {c['metric']}: {c['values']}" for c in found] or ["- (no finished run tests a claim yet)"]
    study: dict = {}
    if suite.settle_epochs:                  # a suite followed over epochs (mini-long)
        lines, study = epoch_sections(suite, out, rows, results)
        md += ["", *lines]
    md += ["", "## Figures", ""] + [f"- {key}: [{path.name}]({path.relative_to(out).as_posix()})"
                                     for key, path in figures.items()]
    md += ["", "## Use the trained models", "",
           "Each model folder is an ordinary run folder: `attncnn evaluate <folder> --data <data set>`, "
           "`attncnn inspect <folder>`, `attncnn plot <folder>`, `attncnn viewer <folder>`."]
    report = {"suite": suite.name, "command": command, "rows": rows, "layers": layers, "claims": found,
              "missing": missing, "unfinished": progress, "figures": {k: p.relative_to(out).as_posix() for k, p in figures.items()},
              "presets": {p: get_preset(p).description for p in suite.presets}}
    if study:
        report["epoch_study"] = study
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return out / "report.md"
