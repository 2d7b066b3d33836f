"""``mini-long``: the ``mini`` presets and recipe at 60 epochs for every model (equal epochs, as the
paper compares them), to see whether the grid of shifts forms.

Three seeds of the three cheap baselines' comparisons; learned-content last (the most expensive; its
60 epochs may not fit). The centres over epochs come from ``metrics.jsonl``, so no periodic
checkpoint is shipped; one every 10 epochs stays while training. The report judges, per layer and
seed, whether the heads have settled on a grid at epochs 6, 20, 40 and 60, and sets Table 1 beside
the 6-epoch ``mini`` suite's.
"""

from __future__ import annotations

from .shapes import Suite
from .table1 import PAPER_ROWS, TABLE1_CLAIMS

__all__ = ["MINI_LONG"]

MINI_LONG = Suite(
    "mini-long",
    "Table 1 at CPU scale for 60 epochs: the mini presets and recipe (width 64, SGD 0.1/0.9/1e-4, "
    "5 % warm-up + cosine, batch 100), 60 epochs for every model; whether the grid of shifts forms",
    presets=tuple(f"{name}-mini" for name in PAPER_ROWS),
    more_seeds={"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2), "resnet18-mini": (0, 1, 2)},
    paper_names={f"{name}-mini": name for name in PAPER_ROWS},
    evolution_preset="quadratic-mini",
    evolution_from="metrics",
    overrides=(("epochs", 60), ("checkpoint_every", 10)),
    last=("learned-content-mini",),
    settle_epochs=(6, 20, 40, 60),
    baseline="mini",
    claims=TABLE1_CLAIMS,
)
