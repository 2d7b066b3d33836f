"""What a suite's finished runs measured: Table 1 rows over seeds, and attention distances per epoch.

Everything here is read from the run folders (``config.json``, ``metrics.jsonl``, the checkpoint),
so a report can be rebuilt from shipped, trimmed folders without training or timing anything.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ..analysis.report import PAPER_FLOPS, macs_per_image, paper_flops_per_image
from ..analysis.runs import Run, open_run, shareable_dataset
from ..models import count_parameters, get_preset
from .suites import Job, Suite, job_state

__all__ = ["RunResult", "finished_runs", "table_rows", "markdown_table", "layer_curves", "mean_std"]


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
        return [r for r in self.epoch_records if isinstance(r.get("test_accuracy"), (int, float))]

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


def finished_runs(jobs: Sequence[Job]) -> dict[str, list[RunResult]]:
    """Preset -> its finished jobs' results (jobs without ``finished.json`` are left out)."""
    results: dict[str, list[RunResult]] = {}
    for job in jobs:
        if job_state(job) == "finished":
            results.setdefault(job.preset, []).append(RunResult(job, open_run(job.folder)))
    return results


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


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
            model, config = done[0].run.model, done[0].run.metadata.get("config", {})
            row["accuracy_mean"], row["accuracy_std"] = mean_std(row["accuracies"])
            row.update(epochs=len(done[0].epoch_records), parameters=count_parameters(model),
                       macs=macs_per_image(model), paper_flops=paper_flops_per_image(model),
                       train_hours=statistics.fmean(r.train_seconds for r in done) / 3600,
                       images_per_second=statistics.fmean(r.images_per_second for r in done),
                       precision=config.get("precision"), dataset=shareable_dataset(done[0].run.metadata))
        rows.append(row)
    return rows


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
           "train time (h/seed)", "train img/s", "precision", "paper: acc. / params / FLOPS"]


def markdown_table(rows: Sequence[dict]) -> str:
    """Rows of :func:`table_rows` as a Markdown table, the paper's numbers in the last column."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    for row in rows:
        paper = row["paper"]
        paper_acc = "-" if paper.get("accuracy") is None else f"{100 * paper['accuracy']:.1f}"
        cells = [row["preset"], _accuracy_cell(row), _fmt(row["parameters"], ","),
                 _fmt(None if row["macs"] is None else row["macs"] / 1e9, ".3f"),
                 _fmt(None if row["paper_flops"] is None else row["paper_flops"] / 1e9, ".3f"),
                 _fmt(row["epochs"], "d"), _fmt(row["train_hours"], ".2f"), _fmt(row["images_per_second"], ".0f"),
                 row["precision"] or "-",
                 f"{paper_acc} / {paper.get('params') or '-'} / {PAPER_FLOPS.get(row['paper_preset'], '-')}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def layer_curves(results: Sequence[RunResult], key: str) -> dict[int, tuple[list[int], list[float]]]:
    """Per layer, ``(epochs, values)`` of the logged ``attn/layer{l}/{key}`` averaged over the runs.

    ``key`` is ``"distance"`` (mean attention distance, tokens) or ``"grid_distance"`` (mean
    distance of the heads to the nearest K x K grid of shifts, tokens). Only position-only models
    log these per epoch; others give ``{}``.
    """
    curves: dict[int, dict[int, list[float]]] = {}
    for result in results:
        for record in result.epoch_records:
            for name, value in record.items():
                parts = name.split("/")
                if len(parts) == 3 and parts[0] == "attn" and parts[2] == key and math.isfinite(value):
                    curves.setdefault(int(parts[1].removeprefix("layer")), {}).setdefault(
                        record["epoch"], []).append(value)
    return {layer: (sorted(by_epoch), [statistics.fmean(by_epoch[e]) for e in sorted(by_epoch)])
            for layer, by_epoch in sorted(curves.items())}
