"""The suites of Table 1 runs that ``attncnn reproduce`` trains, and the state of each run.

A suite is a list of presets (one per Table 1 row) and the seeds to train each with. A job is one
``(preset, seed)`` pair trained into ``<out>/<preset>/seed<seed>``, an ordinary run folder, so that
every ``attncnn`` command (evaluate, inspect, plot, viewer, train --resume) works on it.

Like the reference code's ``runs/*/run.sh`` scripts (PAPER.md section 4), but resumable: a job whose
folder holds ``finished.json`` is skipped, one with a folder but no ``finished.json`` is resumed from
its last checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..training import RunFolder, TrainConfig

__all__ = ["Suite", "Job", "SUITES", "get_suite", "plan", "job_state", "parse_seeds", "select_presets"]


@dataclass(frozen=True)
class Suite:
    """A named set of Table 1 runs.

    Attributes:
        name: ``"mini"``, ``"mini-long"``, ``"paper-long"`` or ``"paper"``.
        description: one line for the help text and the report.
        presets: the presets, in the order they are trained (one Table 1 row each).
        seeds: default seeds of every preset.
        more_seeds: presets trained with more seeds than ``seeds`` by default (the issue asks for
            at least three seeds of the model whose spread matters most).
        paper_names: preset -> the paper's Table 1 preset it stands for (for the paper's numbers).
        evolution_preset: the preset whose first seed's centres are drawn over epochs (paper Fig. 3).
        evolution_from: where those centres come from: ``"checkpoints"`` (its periodic checkpoints,
            which ``--trim`` keeps, weights only) or ``"metrics"`` (the centres and spreads that
            ``metrics.jsonl`` records every epoch; ``--trim`` keeps no periodic checkpoint).
        overrides: training options the suite sets over every preset's recipe, as ``(name, value)``
            pairs, e.g. ``(("epochs", 60),)``; they become each job's ``overrides``, so a folder holding a
            run with other values is refused. ``--epochs`` on the command line still wins (smoke runs).
        last: presets trained after every other job (all their seeds), e.g. the most expensive one.
        settle_epochs: epochs at which the report judges, per layer and seed, whether the heads have
            settled on a grid (grid distance below :data:`~attncnn.reproduce.epochs.SETTLED_BELOW`
            tokens). Non-empty makes the report a study over epochs (see :mod:`.epoch_report`):
            that table, the efficiency and machines of each run, the accuracy of the seeds as bands,
            the grid distance of every seed.
        baseline: another suite whose ``report.json`` beside this suite's folder gives the accuracy to
            show beside this one's (``mini-long``: ``"mini"``, the 6-epoch runs).
    """

    name: str
    description: str
    presets: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    paper_names: dict[str, str] = field(default_factory=dict)
    evolution_preset: str | None = None
    evolution_from: str = "checkpoints"
    overrides: tuple[tuple[str, object], ...] = ()
    last: tuple[str, ...] = ()
    settle_epochs: tuple[int, ...] = ()
    baseline: str | None = None

    @property
    def epochs(self) -> int | None:
        """The epochs the suite sets for every model (None: each preset's own)."""
        return dict(self.overrides).get("epochs")

    def seeds_of(self, preset: str, seeds: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The seeds ``preset`` is trained with: ``seeds`` when given, else the suite's defaults."""
        if seeds is not None:
            return seeds
        return self.more_seeds.get(preset, self.seeds)


_PAPER_ROWS = ("quadratic", "learned", "resnet18", "quadratic-generalized", "learned-content")

SUITES: dict[str, Suite] = {s.name: s for s in [
    Suite("mini", "Table 1 at CPU scale: width 64, 6 epochs, the paper's geometry and recipe shape "
          "(measured in bf16 on 2 cores of an AMD EPYC with AVX512-BF16: 2.4 h for one seed of the four "
          "cheaper models, 4.9 h with the quadratic and learned models' three seeds; learned-content alone "
          "2.7 h; other CPUs differ, a CPU without bf16 units trains in fp32: --dry-run estimates this machine)",
          tuple(f"{name}-mini" for name in _PAPER_ROWS), (0,),
          # three seeds for the two models whose comparisons need a spread: quadratic's grid claim,
          # and learned, which the content claim and learned-vs-quadratic compare against
          {"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2)},
          {f"{name}-mini": name for name in _PAPER_ROWS}, "quadratic-mini"),
    # Issue 25: the same presets and recipe at 60 epochs for every model (equal epochs, as the paper
    # compares them); three seeds of the three cheap baselines' comparisons, learned-content last
    # (the most expensive; its 60 epochs may not fit). The centres over epochs come from
    # metrics.jsonl, so no periodic checkpoint is shipped; one every 10 epochs stays while training.
    Suite("mini-long", "Table 1 at CPU scale for 60 epochs: the mini presets and recipe (width 64, SGD 0.1/0.9/1e-4, "
          "5 % warm-up + cosine, batch 100), 60 epochs for every model; whether the grid of shifts forms",
          tuple(f"{name}-mini" for name in _PAPER_ROWS), (0,),
          {"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2), "resnet18-mini": (0, 1, 2)},
          {f"{name}-mini": name for name in _PAPER_ROWS}, "quadratic-mini", evolution_from="metrics",
          overrides=(("epochs", 60), ("checkpoint_every", 10)), last=("learned-content-mini",),
          settle_epochs=(6, 20, 40, 60), baseline="mini"),
    # The paper's own networks (width 400) with mini-long's length and analysis, so that widths 64 and
    # 400 compare at equal epochs; trained on a GPU, a run per short job (benchmarks/gpu/job.py).
    Suite("paper-long", "Table 1 at the paper's width (400) for 60 epochs: the paper's presets and recipe (SGD "
          "0.1/0.9/1e-4, 5 % warm-up + cosine, batch 100), mini-long's length; for a GPU (measured: quadratic's "
          "60 epochs in 7.4 min on an NVIDIA H200 in bf16, compiled)",
          _PAPER_ROWS, (0,), {}, {name: name for name in _PAPER_ROWS}, "quadratic", evolution_from="metrics",
          overrides=(("epochs", 60),), last=("learned-content",), settle_epochs=(6, 20, 40, 60)),
    Suite("paper", "Table 1 at the paper's scale: width 400, 300 epochs (for a GPU: days in all)",
          _PAPER_ROWS, (0,), {}, {name: name for name in _PAPER_ROWS}, "quadratic"),
]}


def get_suite(name: str) -> Suite:
    """Look a suite up by name.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}") from None


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """``"0,1,2"`` -> ``(0, 1, 2)``; None stays None (the suite's defaults).

    Raises:
        ValueError: an entry that is not a non-negative integer, or a repeated seed.
    """
    if text is None:
        return None
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers like 0,1,2, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must list distinct integers >= 0, like 0,1,2; got {text!r}")
    return seeds


def select_presets(presets: tuple[str, ...], only: tuple[str, ...] | None, what: str) -> tuple[str, ...]:
    """``presets`` restricted to ``only`` (None: all), in their own order.

    Raises:
        ValueError: a name in ``only`` that is not in ``presets`` (the message lists ``what``'s presets).
    """
    if only is None:
        return presets
    unknown = [p for p in only if p not in presets]
    if unknown:
        raise ValueError(f"--only names {', '.join(unknown)}, not in {what}; its presets are {', '.join(presets)}")
    return tuple(p for p in presets if p in only)


@dataclass(frozen=True)
class Job:
    """One run of a suite: ``preset`` trained with ``seed`` into ``folder``.

    ``overrides`` are training options the job itself sets, as ``(name, value)`` pairs (the
    sample-efficiency grid's ``train_subset``, ``epochs``, ``eval_every``; a suite's own
    ``overrides``), and ``cell`` names a grid cell for people (``"10 %"``); Table 1 jobs have no cell.
    """

    preset: str
    seed: int
    folder: Path
    overrides: tuple[tuple[str, object], ...] = ()
    cell: str = ""

    @property
    def label(self) -> str:
        return f"{self.preset}{' ' + self.cell if self.cell else ''} seed {self.seed}"


def plan(suite: Suite, out: str | Path, *, seeds: tuple[int, ...] | None = None,
         only: tuple[str, ...] | None = None, epochs: int | None = None) -> list[Job]:
    """The suite's jobs: every preset's first seed in suite order, then the further seeds, then
    the suite's ``last`` presets (all their seeds).

    Training every model once before any second seed means an interrupted suite has the whole
    table (one seed) before it has error bars.

    Args:
        out: the suite's folder; job folders are ``<out>/<preset>/seed<seed>``.
        seeds: seeds for every preset (None: the suite's defaults).
        only: restrict to these presets (None: all of the suite's).
        epochs: replaces the suite's own ``epochs`` override (``--epochs`` of a smoke run); a suite
            without one leaves epochs to the training options.

    Raises:
        ValueError: a name in ``only`` that is not one of the suite's presets.
    """
    presets = select_presets(suite.presets, only, f"suite {suite.name!r}")
    per_preset = {p: suite.seeds_of(p, seeds) for p in presets}
    rounds = max(len(s) for s in per_preset.values())
    overrides = dict(suite.overrides)
    if epochs is not None and "epochs" in overrides:
        overrides["epochs"] = epochs
    jobs = [Job(p, per_preset[p][i], Path(out) / p / f"seed{per_preset[p][i]}", tuple(overrides.items()))
            for i in range(rounds) for p in presets if i < len(per_preset[p])]
    return sorted(jobs, key=lambda job: job.preset in suite.last)          # stable: the order otherwise kept


def job_state(job: Job) -> str:
    """``"finished"``, ``"interrupted"`` (a run folder without ``finished.json``) or ``"new"``.

    Raises:
        ValueError: the folder holds a run of another preset or seed, or with other values of the
            job's ``overrides`` (the message names both).
    """
    folder = RunFolder(job.folder, mode="read") if (job.folder / "config.json").is_file() else None
    if folder is None:
        if job.folder.exists() and any(p.name != ".lock" for p in job.folder.iterdir()):
            raise ValueError(f"{job.folder} exists but holds no config.json, so it is not a run of {job.label}; "
                             "move it away or choose another --out")
        return "new"
    stored = folder.read_config()
    preset, seed = stored.get("preset", TrainConfig.preset), stored.get("seed", TrainConfig.seed)
    if (preset, seed) != (job.preset, job.seed):
        raise ValueError(f"{job.folder} holds a run of {preset} seed {seed}, not {job.label}; "
                         "move it away or choose another --out")
    for name, value in job.overrides:
        found = stored.get(name)
        if name == "model" and isinstance(found, dict):     # the options it sets; a run adds the path it measured
            found = {key: found.get(key) for key in value}
        if found != value:
            raise ValueError(f"{job.folder} holds a run with {name}={stored.get(name)!r}, but {job.label} needs "
                             f"{name}={value!r} (another --epochs, --train-images or --passes?); move it away or "
                             "choose another --out")
    return "finished" if folder.finished else "interrupted"

