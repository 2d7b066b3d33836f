"""``locality-mini``: does the training protocol make attention local? ``mini-long``'s quadratic and
learned models and recipe (width 64, 60 epochs), with CutMix on.

Santiago Toledo & Martinez ("Inducing Spatial Locality in Vision Transformers through the Training
Protocol", arXiv 2605.16390) report that, with the architecture and optimiser fixed, CutMix alone
decides whether early-layer attention becomes local. Here CutMix is the CutMix paper's CIFAR setting
(Yun et al. 2019: each batch mixed with probability 0.5, ``lam ~ Beta(1, 1)``); nothing else
changes from ``mini-long``, whose runs are the baseline at the same epochs (the first 20 epochs of
a 60-epoch schedule have the same learning rates, so epoch 20 compares fairly before a run ends).
The report judges, per layer and seed, whether the heads have settled on a grid (grid distance
below 0.5 tokens, the criterion fixed before these runs) at epochs 6, 20 and 60.
"""

from __future__ import annotations

from .shapes import Suite
from .table1 import TABLE1_CLAIMS

__all__ = ["LOCALITY_MINI"]

LOCALITY_MINI = Suite(
    "locality-mini",
    "Whether CutMix makes attention local: mini-long's quadratic-mini and learned-mini (width 64, 60 epochs, "
    "SGD 0.1/0.9/1e-4, 5 % warm-up + cosine, batch 100) with CutMix on (p 0.5, Beta(1, 1))",
    presets=("quadratic-mini", "learned-mini"),
    seeds=(0,),
    paper_names={"quadratic-mini": "quadratic", "learned-mini": "learned"},
    evolution_preset="quadratic-mini",
    evolution_from="metrics",
    overrides=(("epochs", 60), ("checkpoint_every", 10), ("cutmix", 0.5), ("cutmix_alpha", 1.0)),
    settle_epochs=(6, 20, 60),
    baseline="mini-long",
    differs="CutMix",
    compare_at=(6, 20, 60),
    claims=TABLE1_CLAIMS,
)
