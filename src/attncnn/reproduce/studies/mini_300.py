"""``mini-300``: the quadratic and learned position-only ``mini`` models at the paper's own length,
300 epochs, to see whether the grid of shifts forms with the paper's schedule where ``mini-long``'s
60 epochs did not form it (no layer of any run below 0.5 tokens).

Three seeds of each, the ``mini`` presets' recipe (SGD 0.1/0.9/1e-4, a linear warm-up over 5 % of the
steps, then cosine to zero at the last step, batch 100) with 300 epochs: the warm-up is a ratio, so
it lasts 15 epochs here, 3 in ``mini-long``. For a GPU, in short jobs (the repository's ``tools/gpu_job.py``;
``docs/development.md``): one run takes hours there, days on a CPU.

The centres over epochs come from ``metrics.jsonl``; a periodic checkpoint every 50 epochs stays
while training (six in a run, not thirty) and none is shipped. The report judges, per layer and seed,
whether the heads have settled on a grid at epochs 6, 20, 60, 150 and 300, sets that beside
``mini-long``'s judgement at its epoch 60 (the end of its cosine, mid-schedule here) and at each
suite's end, and Table 1 beside ``mini-long``'s.
"""

from __future__ import annotations

from .shapes import Suite
from .table1 import TABLE1_CLAIMS

__all__ = ["MINI_300"]

MINI_300 = Suite(
    "mini-300",
    "Whether the grid of shifts forms at the paper's length: quadratic-mini and learned-mini (width 64) for "
    "300 epochs with the paper's recipe (SGD 0.1/0.9/1e-4, 5 % warm-up = 15 epochs, cosine to zero at epoch "
    "300, batch 100), three seeds each; for a GPU",
    presets=("quadratic-mini", "learned-mini"),
    seeds=(0, 1, 2),
    paper_names={"quadratic-mini": "quadratic", "learned-mini": "learned"},
    evolution_preset="quadratic-mini",
    evolution_from="metrics",
    overrides=(("epochs", 300), ("checkpoint_every", 50)),
    settle_epochs=(6, 20, 60, 150, 300),
    baseline="mini-long",
    claims=TABLE1_CLAIMS,
)
