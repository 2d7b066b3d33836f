"""The sections of a Table 1 suite's report (:func:`~.report.write_report` puts them together): Table 1
beside the paper's (:func:`table_rows`, :func:`markdown_table`), every run, the attention per layer after
training (:func:`final_layer_metrics`) and, for a suite followed over epochs, :func:`epoch_sections`
(with a baseline suite's ``report.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ...analysis.metrics import model_metrics
from ...analysis.report import PAPER_FLOPS, macs_per_image, paper_flops_per_image
from ...analysis.runs import shareable_dataset, test_count, test_images
from ...layers import attention_modules
from ...models import count_parameters, get_preset
from ...runs.loading import OLD_MACHINE_FIELDS
from ...runs.machine_file import run_precision
from ..running.runner import Job
from ..running.machines import (machine_segments, read_machine_file, report_segments, run_segments, segments_text,
                                shared_epochs)
from ..studies import Suite
from .epochs import SETTLED_BELOW, Run, compare_settling, quadratic_heads, run_settling, settled_table, settling_lines
from .locality import locality_cell
from .results import RunResult, epoch_records, run_stats

__all__ = ["CONVENTIONS", "table_rows", "markdown_table", "final_layer_metrics", "seed_lines", "layer_lines",
           "SHARP_ALPHA", "settled_lines", "center_rows", "center_lines", "run_costs", "cost_lines", "baseline_rows",
           "baseline_lines", "epoch_sections"]

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
            lines.append(f"| {preset} | {r.job.seed} | {100 * r.final_accuracy:.2f} | {100 * best:.2f} ({epoch}) | "
                         f"{len(r.epoch_records)} | {r.train_seconds / 3600:.2f} | {r.images_per_second:.0f} | "
                         f"{r.run.metadata.get('dataset_name') or '-'} | {_machine(r)} |")
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
    for preset in suite.rows:
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
            row.update(run_stats(done), epochs=len(done[0].epoch_records), parameters=count_parameters(model),
                       macs=macs_per_image(model), paper_flops=paper_flops_per_image(model),
                       precision=_precision(done[0]), dataset=shareable_dataset(done[0].run.metadata))
        rows.append(row)
    return rows


def _precision(result: RunResult) -> str | None:
    """The precision the run trained at when it started: its ``machine.json``'s first segment, else
    what an older run's configuration stored (the recipe no longer holds it), else None."""
    old = result.run.metadata.get(OLD_MACHINE_FIELDS) or {}
    return run_precision(result.job.folder) or old.get("precision")


def _accuracy_cell(mean, std, seeds, unfinished: str | None = None, epochs: int | None = None) -> str:
    """``"71.35 ± 0.20 (3 seeds)"`` (``", 60 epochs"`` inside the brackets where ``epochs`` is given), or
    how far an ``unfinished`` run got, or ``"not run yet"``."""
    if mean is None:
        return f"unfinished ({unfinished})" if unfinished else "not run yet"
    text = f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")
    count = len(seeds or [])
    return text + f" ({count} seed{'s' if count != 1 else ''}{'' if epochs is None else f', {epochs} epochs'})"


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
        cells = [row["preset"], _accuracy_cell(row["accuracy_mean"], row["accuracy_std"], row["seeds"],
                                               row.get("unfinished")), _fmt(row["parameters"], ","),
                 _fmt(None if row["macs"] is None else row["macs"] / 1e9, ".3f"),
                 _fmt(None if row["paper_flops"] is None else row["paper_flops"] / 1e9, ".3f"),
                 _fmt(row["epochs"], "d"), _fmt(row["train_hours"], ".2f"), _fmt(row["images_per_second"], ".0f"),
                 row["precision"] or "-", locality_cell(row.get("locality")),
                 f"{paper_acc} / {paper.get('params') or '-'} / {PAPER_FLOPS.get(row['paper_preset'], '-')}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: A quadratic head is called sharp when its attention one token away from its centre is below e^-1 of
#: the centre's, i.e. alpha > 1 (for a full Sigma^-1: half its smaller eigenvalue); chosen after the
#: runs, to say where the centres went, not to judge the grid (that is the grid distance's job).
SHARP_ALPHA = 1.0


def settled_lines(table: Sequence[dict], threshold: float = SETTLED_BELOW) -> list[str]:
    """Markdown table of :func:`~attncnn.reproduce.reporting.epochs.settled_table` rows: per model, seed and
    epoch, every layer's grid distance (tokens), marked ✓ when below ``threshold``."""
    if not table:
        return ["(no finished run logs grid distances at these epochs)"]
    layers = max(len(row["grid_distance"]) for row in table)
    lines = ["| model | seed | epoch | " + " | ".join(f"layer {n}" for n in range(1, layers + 1)) +
             " | settled layers |", "|---|---|---|" + "---|" * layers + "---|"]
    for row in table:
        cells = [f"{d:.2f}{' ✓' if ok else ''}" for d, ok in zip(row["grid_distance"], row["settled"])]
        cells += ["-"] * (layers - len(cells))
        lines.append(f"| {row['preset']} | {row['seed']} | {row['epoch']} | " + " | ".join(cells) +
                     f" | {row['settled_layers']} of {len(row['grid_distance'])} |")
    return lines + ["", f"✓: settled on a grid, i.e. grid distance below {threshold} tokens (the criterion fixed "
                        "before the runs)."]


def center_rows(results: dict[str, list[RunResult]], sharp_alpha: float = SHARP_ALPHA) -> list[dict]:
    """Where the quadratic heads went, per finished run and layer at its last epoch: ``heads``, the
    ``sharp`` ones (alpha > ``sharp_alpha``, see :data:`SHARP_ALPHA`), their centres rounded to the
    nearest shift (``shifts``, (row, col) in tokens, sorted), the largest distance of a sharp centre
    from its shift (``off_shift``, tokens; None without sharp heads) and the largest alpha of the other
    heads (``others_alpha``; None when every head is sharp). Runs without quadratic heads give none.
    The centres are those of the paper's quadratic encoding (Eq. 9, Sec. 3; the learned ones are
    drawn in its Fig. 4, Sec. 4).

    Raises:
        numpy.linalg.LinAlgError: a logged Sigma^-1 that is not a finite symmetric matrix."""
    rows = []
    for preset, runs in results.items():
        for result in runs:
            records = result.epoch_records
            if not records:
                continue
            layer = 1
            while (heads := quadratic_heads(records[-1], layer)) is not None:
                centers, inverse = heads
                alpha = np.linalg.eigvalsh(inverse)[:, 0] / 2
                sharp = alpha > sharp_alpha
                shifts = np.rint(centers[sharp])
                rows.append({"preset": preset, "seed": result.job.seed, "epoch": records[-1]["epoch"], "layer": layer,
                             "heads": len(alpha), "sharp": int(sharp.sum()),
                             "shifts": sorted((int(r), int(c)) for r, c in shifts),
                             "off_shift": float(np.linalg.norm(centers[sharp] - shifts, axis=1).max()) if sharp.any()
                             else None,
                             "others_alpha": float(alpha[~sharp].max()) if (~sharp).any() else None})
                layer += 1
    return rows


def center_lines(rows: Sequence[dict], sharp_alpha: float = SHARP_ALPHA) -> list[str]:
    """Markdown table of :func:`center_rows`."""
    if not rows:
        return ["(no finished run has quadratic heads)"]
    lines = ["| model | seed | epoch | layer | sharp heads | their shifts (row, col) | farthest from its shift | "
             "other heads' largest alpha |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        off = "-" if r["off_shift"] is None else f"{r['off_shift']:.2f}"
        rest = "-" if r["others_alpha"] is None else f"{r['others_alpha']:.2f}"
        shifts = " ".join(f"({a:+d}, {b:+d})" for a, b in r["shifts"]) or "-"
        lines.append(f"| {r['preset']} | {r['seed']} | {r['epoch']} | {r['layer']} | {r['sharp']} of {r['heads']} | "
                     f"{shifts} | {off} | {rest} |")
    return lines + ["", f"Sharp: alpha > {sharp_alpha:g} (attention one token from the centre below e^-1 of the "
                        "centre's; for a full Sigma^-1 half its smaller eigenvalue), a description chosen after the "
                        "runs; whether a layer settled on a grid is judged by the grid distance above, which assigns "
                        "every head."]


def run_costs(results: dict[str, list[RunResult]]) -> list[dict]:
    """Per finished run: ``preset``, ``seed``, ``epochs``, ``hours`` (logged training +
    evaluation), ``images_per_second`` (median over epochs), ``machines`` (segments of epochs per
    machine) and ``shared_epochs`` (epochs that shared the CPU, by their load average, or a GPU
    with other runs of the same job)."""
    return [{"preset": preset, "seed": r.job.seed, "epochs": len(r.epoch_records), "hours": r.train_seconds / 3600,
             "images_per_second": r.images_per_second, "machines": run_segments(r.job.folder, r.epoch_records),
             "shared_epochs": shared_epochs(r.epoch_records)}
            for preset, runs in results.items() for r in runs]


def _ranges(epochs: Sequence[int]) -> str:
    parts: list[list[int]] = []
    for e in epochs:
        if parts and parts[-1][1] == e - 1:
            parts[-1][1] = e
        else:
            parts.append([e, e])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts) or "none"


def cost_lines(costs: Sequence[dict]) -> list[str]:
    """Markdown table of :func:`run_costs`."""
    lines = ["| model | seed | epochs | train + eval time (h) | train img/s (median) | machine (epochs) | "
             "epochs that shared the machine |", "|---|---|---|---|---|---|---|"]
    for c in costs:
        lines.append(f"| {c['preset']} | {c['seed']} | {c['epochs']} | {c['hours']:.2f} | "
                     f"{c['images_per_second']:.0f} | {segments_text(c['machines'])} | {_ranges(c['shared_epochs'])} |")
    return lines + ["", "Time: the logged seconds of training and evaluation (not the per-epoch metrics, checkpoints "
                        "or pauses between sessions). Machine: the one that finished each epoch (an epoch resumed "
                        "mid-way ran partly on the machine before). Shared: other runs of the same GPU job trained on "
                        "its GPU during the epoch (their img/s is a share of the GPU, not what one run gets alone), or "
                        "the 5-minute load average at the end of the epoch exceeded the run's own threads by more "
                        "than one (other work on the CPU)."]


def baseline_rows(rows: Sequence[dict], baseline: dict | None) -> list[dict]:
    """Per Table 1 row: ``preset``, this suite's accuracy (``mean``, ``std``, ``seeds``), the
    baseline suite's (``baseline_mean``, ``baseline_std``, ``baseline_seeds``, ``baseline_epochs``;
    None when it has no such row), the paper's ``paper`` accuracy (fractions) and ``unfinished`` (how far
    this suite's unfinished run got, e.g. ``"epoch 18 of 60"``, when the row has no finished run)."""
    theirs = {row["preset"]: row for row in (baseline or {}).get("rows", [])}
    out = []
    for row in rows:
        other = theirs.get(row["preset"], {})
        out.append({"preset": row["preset"], "mean": row["accuracy_mean"], "std": row["accuracy_std"],
                    "seeds": row["seeds"], "epochs": row["epochs"], "baseline_mean": other.get("accuracy_mean"),
                    "baseline_std": other.get("accuracy_std"), "baseline_seeds": other.get("seeds"),
                    "baseline_epochs": other.get("epochs"), "paper": row["paper"].get("accuracy"),
                    "unfinished": row.get("unfinished")})
    return out


def baseline_lines(table: Sequence[dict], baseline: str) -> list[str]:
    """Markdown table of :func:`baseline_rows`."""
    lines = [f"| model | test acc. % (this suite) | test acc. % (`{baseline}`) | paper (300 epochs) |",
             "|---|---|---|---|"]
    for row in table:
        paper = "-" if row["paper"] is None else f"{100 * row['paper']:.1f}"
        ours = _accuracy_cell(row["mean"], row["std"], row["seeds"], row.get("unfinished"), row["epochs"])
        theirs = _accuracy_cell(row["baseline_mean"], row["baseline_std"], row["baseline_seeds"],
                                epochs=row["baseline_epochs"])
        lines.append(f"| {row['preset']} | {ours} | {theirs} | {paper} |")
    return lines


def _settling_runs(suite: Suite, results: dict[str, list[RunResult]], unfinished: Sequence[Job]) -> list[Run]:
    """The finished runs and the started, unfinished ``unfinished`` jobs (their records so far, their
    planned epochs), in the suite's order of presets, then seed."""
    runs = [(preset, r.job.seed, r.epoch_records, None) for preset, found in results.items() for r in found]
    runs += [(job.preset, job.seed, epoch_records(job), dict(job.overrides).get("epochs")) for job in unfinished]
    order = {preset: n for n, preset in enumerate(suite.rows)}
    return sorted(runs, key=lambda run: (order.get(run[0], len(order)), run[1]))


def epoch_sections(suite: Suite, out: Path, rows: Sequence[dict], results: dict[str, list[RunResult]],
                   unfinished: Sequence[Job] = ()) -> tuple[list[str], dict]:
    """The Markdown lines and the ``report.json`` entry of a suite with ``settle_epochs``; the
    started, ``unfinished`` jobs join the answer of whether a layer settled with their epochs so far
    (:func:`run_settling`), not the table of finished runs."""
    table = settled_table(results, suite.settle_epochs, suite.settled_below)
    costs = run_costs(results)
    centers = center_rows(results)
    path = out.parent / str(suite.baseline) / "report.json"
    baseline = json.loads(path.read_text()) if suite.baseline and path.is_file() else None
    runs = run_settling(_settling_runs(suite, results, unfinished), suite.settle_epochs, suite.settled_below)
    comparison = compare_settling(runs, baseline, suite.settled_below, suite.compare_at) if baseline else None
    md = [f"## Settled on a grid? (epochs {', '.join(map(str, suite.settle_epochs))})", "",
          *settled_lines(table, suite.settled_below), "",
          *settling_lines(runs, suite.settle_epochs, suite.settled_below, comparison, suite.baseline, suite.differs),
          "",
          "## Where the centres went (last epoch of each run)", "", *center_lines(centers), "",
          "## What each run cost, and where it ran", "", *cost_lines(costs), ""]
    entry = {"settled_below": suite.settled_below, "settle_epochs": list(suite.settle_epochs), "settled": table,
             "settling": runs, "centres": centers, "costs": costs}
    if comparison is not None:
        entry["settling_beside_baseline"] = comparison
    if suite.baseline:
        beside = baseline_rows(rows, baseline)
        note = (f"`{suite.baseline}`: from ../{suite.baseline}/report.json; each suite's cosine schedule ends at its "
                "own last epoch, so an epoch-6 accuracy of a 60-epoch run is not the 6-epoch result." if baseline else
                f"No `{suite.baseline}` report beside this folder (../{suite.baseline}/report.json).")
        md += [f"## Table 1 beside the `{suite.baseline}` suite and the paper", "",
               *baseline_lines(beside, suite.baseline), "", note, ""]
        entry["baseline"] = {"suite": suite.baseline, "rows": beside}
    while md and not md[-1]:
        md.pop()
    return md, entry
