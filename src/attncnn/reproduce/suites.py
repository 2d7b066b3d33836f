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
        name: ``"mini"`` or ``"paper"``.
        description: one line for the help text and the report.
        presets: the presets, in the order they are trained (one Table 1 row each).
        seeds: default seeds of every preset.
        more_seeds: presets trained with more seeds than ``seeds`` by default (the issue asks for
            at least three seeds of the model whose spread matters most).
        paper_names: preset -> the paper's Table 1 preset it stands for (for the paper's numbers).
        evolution_preset: the preset whose first seed keeps its periodic checkpoints when trimmed
            (they draw the centres over epochs, paper Fig. 3).
    """

    name: str
    description: str
    presets: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    paper_names: dict[str, str] = field(default_factory=dict)
    evolution_preset: str | None = None

    def seeds_of(self, preset: str, seeds: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The seeds ``preset`` is trained with: ``seeds`` when given, else the suite's defaults."""
        if seeds is not None:
            return seeds
        return self.more_seeds.get(preset, self.seeds)


_PAPER_ROWS = ("quadratic", "learned", "resnet18", "quadratic-generalized", "learned-content")

SUITES: dict[str, Suite] = {s.name: s for s in [
    Suite("mini", "Table 1 at CPU scale: width 64, 6 epochs, the paper's geometry and recipe shape "
          "(on 2 CPU cores, measured: 2.4 h for one seed of the four cheaper models, 4.9 h with the "
          "quadratic and learned models' three seeds; learned-content alone 2.7 h)",
          tuple(f"{name}-mini" for name in _PAPER_ROWS), (0,),
          # three seeds for the two models whose comparisons need a spread: quadratic's grid claim,
          # and learned, which the content claim and learned-vs-quadratic compare against
          {"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2)},
          {f"{name}-mini": name for name in _PAPER_ROWS}, "quadratic-mini"),
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
    sample-efficiency grid's ``train_subset``, ``epochs``, ``eval_every``), and ``cell`` names
    them for people (``"10 %"``); Table 1 jobs have neither.
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
         only: tuple[str, ...] | None = None) -> list[Job]:
    """The suite's jobs: every preset's first seed in suite order, then the further seeds.

    Training every model once before any second seed means an interrupted suite has the whole
    table (one seed) before it has error bars.

    Args:
        out: the suite's folder; job folders are ``<out>/<preset>/seed<seed>``.
        seeds: seeds for every preset (None: the suite's defaults).
        only: restrict to these presets (None: all of the suite's).

    Raises:
        ValueError: a name in ``only`` that is not one of the suite's presets.
    """
    presets = select_presets(suite.presets, only, f"suite {suite.name!r}")
    per_preset = {p: suite.seeds_of(p, seeds) for p in presets}
    rounds = max(len(s) for s in per_preset.values())
    return [Job(p, per_preset[p][i], Path(out) / p / f"seed{per_preset[p][i]}")
            for i in range(rounds) for p in presets if i < len(per_preset[p])]


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
        if stored.get(name) != value:
            raise ValueError(f"{job.folder} holds a run with {name}={stored.get(name)!r}, but {job.label} needs "
                             f"{name}={value!r} (another --train-images or --passes?); move it away or choose "
                             "another --out")
    return "finished" if folder.finished else "interrupted"

