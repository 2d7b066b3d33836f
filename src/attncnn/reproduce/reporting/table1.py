"""The sections of a Table 1 suite's report: Table 1 beside the paper's (:func:`table_rows`,
:func:`markdown_table`), every run, and the attention per layer after training
(:func:`final_layer_metrics`). :func:`~attncnn.reproduce.reporting.report.write_report` puts them
together.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ...analysis.metrics import model_metrics
from ...analysis.report import PAPER_FLOPS, macs_per_image, paper_flops_per_image
from ...analysis.runs import shareable_dataset, test_count, test_images
from ...layers import attention_modules
from ...models import count_parameters, get_preset
from ...runs.loading import OLD_MACHINE_FIELDS
from ...runs.machine_file import run_precision
from ..running.jobs import Job
from ..running.machines import machine_segments, read_machine_file, report_segments, segments_text
from ..studies import Suite
from .locality import locality_cell
from .results import RunResult, mean_std

__all__ = ["CONVENTIONS", "table_rows", "markdown_table", "final_layer_metrics", "seed_lines", "layer_lines"]

#: how Table 1's columns are measured, below the table
CONVENTIONS = (
    "Accuracy: test accuracy after the last epoch on the 10,000 test images of the data set named below, "
    "mean ± sample standard deviation over the seeds run. GMAC/img (ours): multiply-accumulates of one "
    "forward pass, attention products included (dense-attention convention, FlopCounterMode / 2). "
    "Paper-style GFLOPS: the paper's Table 1 convention reconstructed: 2 x the MACs of the linear layers "
    "for attention models (6.2 B / 15 B at paper scale), plain MACs for the ResNet (0.56 B). Train time: "
    "logged training + evaluation seconds, mean per seed; img/s: median over epochs of the logged training "
    "speed. Precision: of training (bf16 = bfloat16 autocast, loss and softmax in float32). Most local head: the "
    "smallest mean attention distance of any head in any layer (ViT's Fig. 7 measure, averaged over queries and test "
    "images), in tokens, mean ± sample standard deviation over the seeds, and in brackets over the side of the token "
    "grid (arXiv 2605.16390's normalisation); per layer in the locality section below.")


def final_layer_metrics(result: RunResult, *, images: int = 100, data: str | None = None,
                        data_dir: str | None = None) -> list[dict] | None:
    """Per layer of the trained model: attention distance, distance to the 3x3 grid of shifts,
    degenerate heads (quadratic), from ``images`` test images (position-only models need none).
    None for a model without attention layers. A run shipped without its weights gives what was
    measured before they were withheld (its record's ``final_layers``), or None."""
    model = result.run.model
    if model is None:
        return (result.run.withheld or {}).get("final_layers")
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


def seed_lines(results: dict[str, list[RunResult]]) -> list[str]:
    """Markdown table: every finished run with its accuracy, cost, data set and machine."""
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
    """The machine cell of a run: ``machine.json``'s (:func:`read_machine_file`); where that file is
    malformed (a warning names it), the epoch records' machines, else ``unknown``."""
    info = read_machine_file(result.job.folder)
    if info is None:
        return "not recorded"
    if not info:
        segments = machine_segments(result.epoch_records)
        known = any(segment["machine"] for segment in segments)
        return segments_text(segments) if known else "unknown (machine.json unreadable)"
    segments = report_segments(info.get("segments") or [])
    if len(segments) > 1:                                  # the run changed machine or precision mid-way
        return segments_text(segments)
    return f"{info.get('cpu', '?')}, {info.get('torch_threads', '?')} threads, torch {info.get('torch', '?')}" + \
        (f", {info['gpu']}" if info.get("gpu") else "")


def layer_lines(layers: dict[str, list[dict] | None]) -> list[str]:
    """Markdown table of :func:`final_layer_metrics` per preset."""
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


def table_rows(suite: Suite, results: dict[str, list[RunResult]], planned: Sequence[Job]) -> list[dict]:
    """One Table 1 row per preset of the suite (in suite order), finished or not.

    Row keys: ``preset``, ``paper_preset``, ``seeds`` (finished), ``planned_seeds``, ``accuracies``
    (final epoch, one per seed), ``accuracy_mean``/``accuracy_std`` (fractions; None when nothing
    finished), ``best`` (per seed ``(accuracy, epoch)``), ``epochs``, ``parameters``,
    ``macs`` (our convention), ``paper_flops`` (the paper's), ``train_hours`` (mean per seed),
    ``images_per_second``, ``precision``, ``dataset``, ``paper`` (its Table 1 entry).
    """
    rows = []
    for preset in suite.presets:
        paper_name = suite.paper_names.get(preset, preset)
        done = results.get(preset, [])
        row = {"preset": preset, "paper_preset": paper_name, "paper": dict(get_preset(paper_name).paper),
               "planned_seeds": [j.seed for j in planned if j.preset == preset],
               "seeds": [r.job.seed for r in done], "accuracies": [r.final_accuracy for r in done],
               "best": [r.best for r in done], "accuracy_mean": None, "accuracy_std": None,
               "epochs": None, "parameters": None, "macs": None, "paper_flops": None, "train_hours": None,
               "images_per_second": None, "precision": None, "dataset": None}
        if done:
            model = done[0].run.network()      # counts only
            row["accuracy_mean"], row["accuracy_std"] = mean_std(row["accuracies"])
            row.update(epochs=len(done[0].epoch_records), parameters=count_parameters(model),
                       macs=macs_per_image(model), paper_flops=paper_flops_per_image(model),
                       train_hours=statistics.fmean(r.train_seconds for r in done) / 3600,
                       images_per_second=statistics.fmean(r.images_per_second for r in done),
                       precision=_precision(done[0]), dataset=shareable_dataset(done[0].run.metadata))
        rows.append(row)
    return rows


def _precision(result: RunResult) -> str | None:
    """The precision the run trained at when it started: its ``machine.json``'s first segment, else
    what an older run's configuration stored (the recipe no longer holds it), else None."""
    old = result.run.metadata.get(OLD_MACHINE_FIELDS) or {}
    return run_precision(result.job.folder) or old.get("precision")


def _accuracy_cell(row: dict) -> str:
    if row["accuracy_mean"] is None:
        return f"unfinished ({row['unfinished']})" if row.get("unfinished") else "not run yet"
    text = f"{100 * row['accuracy_mean']:.2f}"
    if row["accuracy_std"] is not None:
        text += f" ± {100 * row['accuracy_std']:.2f}"
    return text + f" ({len(row['seeds'])} seed{'s' if len(row['seeds']) != 1 else ''})"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


_HEADER = ["model", "test acc. % (ours)", "params", "GMAC/img (ours)", "paper-style GFLOPS", "epochs",
           "train time (h/seed)", "train img/s", "precision", "most local head, tokens (/ side)",
           "paper: acc. / params / FLOPS"]


def markdown_table(rows: Sequence[dict]) -> str:
    """Rows of :func:`table_rows` as a Markdown table, the paper's numbers in the last column; a row's
    ``locality`` (:func:`~.locality.locality_summary`, where the report measured it) fills the
    most-local-head column."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    for row in rows:
        paper = row["paper"]
        paper_acc = "-" if paper.get("accuracy") is None else f"{100 * paper['accuracy']:.1f}"
        cells = [row["preset"], _accuracy_cell(row), _fmt(row["parameters"], ","),
                 _fmt(None if row["macs"] is None else row["macs"] / 1e9, ".3f"),
                 _fmt(None if row["paper_flops"] is None else row["paper_flops"] / 1e9, ".3f"),
                 _fmt(row["epochs"], "d"), _fmt(row["train_hours"], ".2f"), _fmt(row["images_per_second"], ".0f"),
                 row["precision"] or "-", locality_cell(row.get("locality")),
                 f"{paper_acc} / {paper.get('params') or '-'} / {PAPER_FLOPS.get(row['paper_preset'], '-')}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
