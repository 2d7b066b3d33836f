"""A suite's runs followed over epochs (``mini-long``, ``mini-300``, ``locality-mini``, ``paper-long``), from
``metrics.jsonl`` alone (no checkpoint needed).

Position-only models log every layer's grid distance (``attn/layerL/grid_distance``, tokens) and,
for quadratic heads, every head's centre and spread (``attn/layerL/headH/center_row``,
``center_col``, ``alpha`` or ``inverse_covariance_rr/_rc/_cc``) after each epoch
(:func:`~attncnn.analysis.metrics.epoch_metrics`). The criterion, fixed before the long runs were
trained: **a layer has settled on a grid when its grid distance is below** :data:`SETTLED_BELOW`
**= 0.5 tokens**, judged per layer and seed at the suite's epochs (:func:`settled_table`); an
unfinished run is judged at the epochs it has reached so far. :func:`settling_lines` says it in
words, beside the same model and seed of a baseline suite (``Suite.baseline``, its ``report.json``'s
rows judged again by this suite's criterion) where there is one.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import numpy as np

from ..studies.shapes import SETTLED_BELOW
from .results import RunResult, layer_values

__all__ = ["SETTLED_BELOW", "settled_rows", "settled_table", "seed_layer_curves", "accuracy_bands", "quadratic_heads",
           "evolution_epochs", "Run", "run_settling", "compare_settling", "settling_lines"]


def settled_rows(records: Sequence[dict], epochs: Sequence[int], threshold: float = SETTLED_BELOW) -> list[dict]:
    """Per chosen epoch that the run has and that logs grid distances: ``{"epoch", "grid_distance":
    [per layer, tokens], "settled": [per layer: grid distance < threshold], "settled_layers": count}``.

    Args:
        records: the run's ``metrics.jsonl`` records.
        epochs: the epochs to judge (e.g. 6, 20, 40, 60); those the run does not have are left out.
        threshold: tokens (default :data:`SETTLED_BELOW`).
    """
    by_epoch = {r["epoch"]: r for r in records if isinstance(r.get("epoch"), int)}
    rows = []
    for epoch in epochs:
        distances = list(layer_values(by_epoch.get(epoch, {}), "grid_distance").values())
        if distances:
            settled = [math.isfinite(d) and d < threshold for d in distances]
            rows.append({"epoch": epoch, "grid_distance": distances, "settled": settled,
                         "settled_layers": sum(settled)})
    return rows


def settled_table(results: dict[str, list[RunResult]], epochs: Sequence[int],
                  threshold: float = SETTLED_BELOW) -> list[dict]:
    """:func:`settled_rows` of every finished run that logs grid distances, each row with its
    ``preset`` and ``seed`` added (suite order, then seed order, then epoch)."""
    return [{"preset": preset, "seed": result.job.seed, **row} for preset, runs in results.items()
            for result in runs for row in settled_rows(result.epoch_records, epochs, threshold)]


def seed_layer_curves(results: Sequence[RunResult], key: str) -> dict[int, dict[int, tuple[list[int], list[float]]]]:
    """``{layer: {seed: (epochs, values)}}`` of ``attn/layer{l}/{key}`` (e.g. ``"grid_distance"``)."""
    curves: dict[int, dict[int, tuple[list[int], list[float]]]] = {}
    for result in results:
        for record in result.epoch_records:
            for layer, value in layer_values(record, key).items():
                epochs, values = curves.setdefault(layer, {}).setdefault(result.job.seed, ([], []))
                epochs.append(record["epoch"])
                values.append(value)
    return curves


def accuracy_bands(results: Sequence[RunResult]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Test accuracy over the epochs every run evaluated: ``(epochs, mean, min, max)`` over the
    runs (fractions). One run gives its own curve three times."""
    per_run = [{r["epoch"]: r["test_accuracy"] for r in result.records} for result in results]
    epochs = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    values = [[p[e] for p in per_run] for e in epochs]
    return epochs, [statistics.fmean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def quadratic_heads(record: dict, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Centres ``(N_h, 2)`` (row, col shift in tokens) and Sigma^-1 ``(N_h, 2, 2)`` of one quadratic
    layer as ``record`` logged them (isotropic heads: ``2 alpha I``); None when the record holds no
    centres for that layer, or no spreads (full-covariance runs logged before the matrix was)."""
    base = f"attn/layer{layer}/head"
    centers, invs, head = [], [], 1
    while f"{base}{head}/center_row" in record:
        prefix = f"{base}{head}/"
        centers.append([record[prefix + "center_row"], record[prefix + "center_col"]])
        if prefix + "alpha" in record:
            invs.append(2 * record[prefix + "alpha"] * np.eye(2))
        elif prefix + "inverse_covariance_rr" in record:
            rr, rc, cc = (record[prefix + f"inverse_covariance_{k}"] for k in ("rr", "rc", "cc"))
            invs.append(np.array([[rr, rc], [rc, cc]]))
        else:
            return None
        head += 1
    if not centers:
        return None
    return np.asarray(centers, dtype=np.float64), np.asarray(invs, dtype=np.float64)


def evolution_epochs(available: Sequence[int], chosen: Sequence[int]) -> list[int]:
    """The epochs drawn over training: the first one, those of ``chosen`` that exist, the last."""
    have = sorted(set(available))
    if not have:
        return []
    return sorted({have[0], have[-1], *(e for e in chosen if e in have)})


def _words(layers: Sequence[int]) -> str:
    if not layers:
        return "none"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def _series(epochs: Sequence[int], last: str = "and") -> str:
    items = [str(e) for e in epochs]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {last} " + items[-1]


#: one run for :func:`run_settling`: ``(preset, seed, its epoch records, its planned epochs when it is
#: unfinished, None when it has finished)``
Run = tuple[str, int, Sequence[dict], int | None]


def run_settling(runs: Sequence[Run], epochs: Sequence[int], threshold: float) -> list[dict]:
    """Per run that logs grid distances: ``preset``, ``seed``, ``finished``, ``planned`` (an unfinished
    run's epochs, None for a finished one), ``last_epoch`` (its end, or its latest epoch so far),
    ``judged`` (the epochs of ``epochs`` it has, and its last: ``{"epoch", "grid_distance" (per
    layer, tokens), "settled" (per layer), "layers" (the settled ones, 1-based)}`` in epoch order),
    ``not_reached`` (the epochs of ``epochs`` after its last) and ``lowest`` (``{"distance" (tokens),
    "layer", "epoch"}``: the smallest finite grid distance of any judged epoch, None without one)."""
    found = []
    for preset, seed, records, planned in runs:
        records = [r for r in records if isinstance(r.get("epoch"), int)]
        if not records or not any(layer_values(r, "grid_distance") for r in records):
            continue
        last = records[-1]["epoch"]
        judged = settled_rows(records, sorted({*epochs, last}), threshold)
        candidates = [(d, layer, row["epoch"]) for row in judged
                      for layer, d in enumerate(row["grid_distance"], start=1) if math.isfinite(d)]
        lowest = min(candidates, default=None)
        found.append({"preset": preset, "seed": seed, "finished": planned is None, "planned": planned,
                      "last_epoch": last,
                      "judged": [{"epoch": r["epoch"], "grid_distance": r["grid_distance"], "settled": r["settled"],
                                  "layers": [n for n, ok in enumerate(r["settled"], start=1) if ok]} for r in judged],
                      "not_reached": [e for e in epochs if e > last],
                      "lowest": None if lowest is None else {"distance": lowest[0], "layer": lowest[1],
                                                             "epoch": lowest[2]}})
    return found


def compare_settling(runs: Sequence[dict], baseline: dict | None, threshold: float,
                     at: Sequence[int] = ()) -> list[dict]:
    """Each run of :func:`run_settling` beside the same model and seed in ``baseline`` (a suite's
    ``report.json``; its ``epoch_study.settled`` rows judged again with ``threshold``), at the
    baseline run's last judged epoch and at this run's end: ``{"preset", "seed", "epoch": the
    baseline's last judged epoch, "there": its settled layers (1-based), "baseline_is_end": whether
    that epoch is the baseline run's length, "here_at": this run's settled layers at that epoch
    (None: not reached or not logged), "end": this run's last epoch, "here_end": its settled layers
    there (None: not logged), "finished": whether this run has ended there, "changed": whether either
    differs from ``there``; None where this run
    has not reached that epoch (a shorter run compares nothing)}``. Runs the baseline lacks are left out.

    With ``at`` (epochs), one such entry per run and epoch of ``at`` that the baseline judged,
    instead: the two runs at the same epoch (``"end"`` is that epoch, ``"here_end"`` is
    ``"here_at"``), for suites that differ from their baseline by something other than length.

    Raises:
        KeyError: a settled row of ``baseline`` without its preset, seed, epoch or grid distances.
    """
    rows = ((baseline or {}).get("epoch_study") or {}).get("settled") or []
    lengths = {row["preset"]: row.get("epochs") for row in (baseline or {}).get("rows", [])}
    out = []
    for run in runs:
        theirs = [r for r in rows if (r["preset"], r["seed"]) == (run["preset"], run["seed"])]
        if not theirs:
            continue
        here = {row["epoch"]: row["layers"] for row in run["judged"]}
        if at:
            pairs = [(row, row["epoch"]) for e in at for row in theirs if row["epoch"] == e]
        else:
            pairs = [(max(theirs, key=lambda r: r["epoch"]), run["last_epoch"])]
        for row, end_epoch in pairs:
            there = [n for n, d in enumerate(row["grid_distance"], start=1)
                     if isinstance(d, (int, float)) and math.isfinite(d) and d < threshold]
            same, end = here.get(row["epoch"]), here.get(end_epoch)
            out.append({"preset": run["preset"], "seed": run["seed"], "finished": run["finished"],
                        "epoch": row["epoch"], "there": there,
                        "baseline_is_end": lengths.get(run["preset"]) == row["epoch"], "here_at": same,
                        "end": end_epoch, "here_end": end,
                        "changed": None if same is None else any(layers is not None and layers != there
                                                                 for layers in (same, end))})
    return out


def _tokens(distance: float, threshold: float) -> str:
    """A grid distance in tokens, with a third decimal where two would print the criterion itself
    (0.504 shown as 0.50 would read as "settled" beside "below 0.5")."""
    return f"{distance:.2f}" if f"{distance:.2f}" != f"{threshold:.2f}" else f"{distance:.3f}"


def _run_line(run: dict, epochs: Sequence[int], threshold: float) -> str:
    name = f"`{run['preset']}` seed {run['seed']}"
    judged = [row for row in run["judged"] if row["epoch"] in epochs]
    settled = [row for row in judged if row["layers"]]
    parts = []
    if settled:
        parts.append(f"settled at epoch{'s' if len(settled) > 1 else ''} "
                     + _series([f"{row['epoch']} ({_words(row['layers'])})" for row in settled]))
        if len(settled) < len(judged):
            parts.append("no layer at " + _series([row["epoch"] for row in judged if not row["layers"]]))
    elif judged:
        parts.append(f"no layer settled at epoch{'s' if len(judged) > 1 else ''} "
                     f"{_series([row['epoch'] for row in judged], 'or')}")
    if run["not_reached"]:
        parts.append(f"epoch{'s' if len(run['not_reached']) > 1 else ''} {_series(run['not_reached'])} not reached"
                     + ("" if run["finished"] else " yet"))
    end = next((row for row in run["judged"] if row["epoch"] == run["last_epoch"]), None)
    if run["last_epoch"] not in epochs and end is not None:
        parts.append(f"at its {'end' if run['finished'] else 'latest epoch'}, epoch {end['epoch']}: "
                     + ("no layer settled" if not end["layers"] else f"{_words(end['layers'])} settled"))
    low = run["lowest"]
    length = (f"{run['last_epoch']} epoch{'s' if run['last_epoch'] != 1 else ''}" if run["finished"]
              else f"unfinished: epoch {run['last_epoch']} of {run['planned']} so far")
    text = f"- {name} ({length}): " + "; ".join(parts)
    if low is not None:
        text += (f" (lowest grid distance: {_tokens(low['distance'], threshold)} tokens, layer {low['layer']}, "
                 f"epoch {low['epoch']})")
    return text + "."


def _answer(runs: Sequence[dict], epochs: Sequence[int], threshold: float) -> str:
    target = max(epochs)
    reached = [r for r in runs if r["last_epoch"] >= target]
    if not runs:
        return "**Not answered yet**: no run logs grid distances yet."
    if not reached:
        return (f"**Not answered yet**: no run has reached epoch {target}, the last judged one (the furthest is at "
                f"epoch {max(r['last_epoch'] for r in runs)}).")
    at_target = [(r, row) for r in reached
                 if (row := next((j for j in r["judged"] if j["epoch"] == target), None)) is not None]
    ever = [r for r in reached if any(row["layers"] for row in r["judged"] if row["epoch"] in epochs)]
    settled = [(r, row) for r, row in at_target if row["layers"]]
    text = (f"**By epoch {target}, by the criterion (grid distance below {threshold:g} tokens): "
            + ("yes" if settled else "no") + f"**: a layer settled in {len(settled)} of the {len(reached)} runs "
            f"that reached epoch {target}")
    text += ": " + "; ".join(f"`{r['preset']}` seed {r['seed']} ({_words(row['layers'])})" for r, row in settled) \
        if settled else ""
    if len(ever) > len(settled):
        text += f" ({len(ever) - len(settled)} more had a settled layer at an earlier judged epoch)"
    if len(runs) > len(reached):
        more = len(runs) - len(reached)
        text += f"; {more} more {'has' if more == 1 else 'have'} not reached it yet"
    return text + "."


def _compare_line(c: dict, differs: str) -> str:
    def state(layers):
        return "not reached" if layers is None else _words(layers)

    end = " (the end of its schedule)" if c["baseline_is_end"] else ""
    text = f"at epoch {c['epoch']}{end}: {state(c['here_at'])} here, {_words(c['there'])} there"
    if c["end"] != c["epoch"]:
        where = "at this run's end" if c["finished"] else "at its latest epoch so far"
        text += f"; {where}, epoch {c['end']}: {state(c['here_end'])}"
    if c["changed"] is None:
        return f"- `{c['preset']}` seed {c['seed']}: {text}: nothing to compare yet."
    verdict = f"{differs} changed it" if c["changed"] else f"{differs} changed nothing"
    return f"- `{c['preset']}` seed {c['seed']}: {text}: {verdict}."


def settling_lines(runs: Sequence[dict], epochs: Sequence[int], threshold: float, comparison: Sequence[dict] | None,
                   baseline: str | None, differs: str = "the length") -> list[str]:
    """Markdown: the answer, each run's line, and (``comparison`` of :func:`compare_settling`,
    None where the suite has no ``baseline`` or its report is not beside) each run beside ``baseline``'s;
    ``differs`` names what the suite changes from it (:attr:`~attncnn.reproduce.studies.Suite.differs`)."""
    lines = [_answer(runs, epochs, threshold), "", *(_run_line(r, epochs, threshold) for r in runs)]
    if baseline is None:
        return lines
    if comparison is None:
        return lines + ["", f"No `{baseline}` report beside this folder (../{baseline}/report.json), so the "
                            "comparison with it is not made."]
    if not comparison:
        return lines + ["", f"No run here has a counterpart judged in `{baseline}`'s report, so the comparison "
                            "with it is not made."]
    compared = [c for c in comparison if c["changed"] is not None]
    changed = [c for c in compared if c["changed"]]
    epochs_there = _series(sorted({c["epoch"] for c in comparison}), "or")
    pairs = len({(c["preset"], c["seed"]) for c in comparison}) < len(comparison)     # several epochs a run
    counted = "comparisons (run and epoch) made so far" if pairs else f"runs that reached epoch {epochs_there}"
    summary = (f"{differs} changed the settled layers in {len(changed)} of the {len(compared)} {counted}"
               if compared else f"no run here has reached epoch {epochs_there} yet")
    lines += ["", f"Against `{baseline}` (its report's grid distances, judged by the same criterion; settled layers "
                  f"listed, \"none\" when no layer settled): {summary}.", ""]
    return lines + [_compare_line(c, differs) for c in comparison]
