"""The Table 1 suites: the paper's rows, the paper's claims they measure, and each suite declared as
one :class:`~.shapes.Suite` value (``mini``, ``mini-long``, ``mini-300``, ``locality-mini``, ``paper-long``,
``paper``); the comment above each declaration says what it asks and why it is shaped so.

The claims are reported with their numbers and no verdict: ``docs/study-mini.md`` judges them.
"""

from __future__ import annotations

from .claims import Accuracies, Claim, Curve, PerLayer
from .shapes import Suite

__all__ = ["PAPER_ROWS", "TABLE1_CLAIMS", "MINI", "MINI_LONG", "MINI_300", "LOCALITY_MINI", "PAPER_LONG", "PAPER"]

#: the paper's Table 1 presets, in the order the suites train them
PAPER_ROWS = ("quadratic", "learned", "resnet18", "quadratic-generalized", "learned-content")

TABLE1_CLAIMS = (
    Claim("grid of shifts", "early-layer quadratic heads settle on a grid of shifts around the query",
          "{row} layer 1 ({seeds}): mean head distance to the nearest 3x3 grid of shifts, epoch {first_epoch} "
          "-> {last_epoch} (tokens)",
          Curve("quadratic", "grid_distance", layer=1)),
    Claim("deeper attends further", "deeper layers attend further",
          "{row} ({seeds}): mean attention distance per layer 1..L after training (tokens)",
          PerLayer("quadratic", "distance")),
    Claim("learned heads are local", "learned position-only heads are local in early layers",
          "{row} ({seeds}): mean attention distance per layer 1..L after training (tokens)",
          PerLayer("learned", "distance")),
    Claim("content does not help", "adding content attention does not raise accuracy (paper: 87.1 % vs 91.8 %)",
          "test accuracy %: learned + content vs learned position-only",
          Accuracies(("learned-content", "learned"))),
    Claim("degenerate heads", "full-covariance heads degenerate and can be pruned",
          "{row} ({seeds}): degenerate heads per layer (condition number > 1000 or largest eigenvalue < 1e-5, "
          "the reference code's rule), of 9",
          PerLayer("quadratic-generalized", "degenerate_heads", digits=None)),
)

# ``mini``: Table 1 at CPU scale (width 64, 6 epochs), the paper's geometry and recipe shape.
MINI = Suite(
    "mini",
    # its measured hours per CPU are on its study page (docs/study-mini.md), not in the help
    "Table 1 at CPU scale: width 64, 6 epochs, the paper's geometry and recipe shape",
    rows={f"{name}-mini": {} for name in PAPER_ROWS},
    # three seeds for the two models whose comparisons need a spread: quadratic's grid claim,
    # and learned, which the content claim and learned-vs-quadratic compare against
    more_seeds={"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2)},
    paper_names={f"{name}-mini": name for name in PAPER_ROWS},
    evolution_preset="quadratic-mini",
    claims=TABLE1_CLAIMS,
)

# ``mini-long``: the ``mini`` presets and recipe at 60 epochs for every model (equal epochs, as the
# paper compares them), to see whether the grid of shifts forms.
#
# Three seeds of the three cheap baselines' comparisons; learned-content last (the most expensive; its
# 60 epochs may not fit). The centres over epochs come from ``metrics.jsonl``, so no periodic
# checkpoint is shipped; one every 10 epochs stays while training. The report judges, per layer and
# seed, whether the heads have settled on a grid at epochs 6, 20, 40 and 60, and sets Table 1 beside
# the 6-epoch ``mini`` suite's.
MINI_LONG = Suite(
    "mini-long",
    "Table 1 at CPU scale for 60 epochs: the mini presets and recipe (width 64, SGD 0.1/0.9/1e-4, "
    "5 % warm-up + cosine, batch 100), 60 epochs for every model; whether the grid of shifts forms",
    rows={f"{name}-mini": {"epochs": 60, "checkpoint_every": 10} for name in PAPER_ROWS},
    more_seeds={"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2), "resnet18-mini": (0, 1, 2)},
    paper_names={f"{name}-mini": name for name in PAPER_ROWS},
    evolution_preset="quadratic-mini",
    evolution_from="metrics",
    last=("learned-content-mini",),
    settle_epochs=(6, 20, 40, 60),
    baseline="mini",
    claims=TABLE1_CLAIMS,
)

# ``mini-300``: the quadratic and learned position-only ``mini`` models at the paper's own length,
# 300 epochs, to see whether the grid of shifts forms with the paper's schedule where ``mini-long``'s
# 60 epochs did not form it (no layer of any run below 0.5 tokens). The warm-up is a ratio of the
# steps, so it lasts 15 epochs here, 3 in ``mini-long``. For a GPU, in short jobs
# (``tools/gpu_job.py``; ``docs/development.md``): one run takes hours there, days on a CPU. A
# periodic checkpoint every 50 epochs stays while training (six in a run, not thirty), none is
# shipped. The report also sets each run beside ``mini-long``'s at its epoch 60 (the end of its
# cosine, mid-schedule here) and at each suite's end.
MINI_300 = Suite(
    "mini-300",
    "Whether the grid of shifts forms at the paper's length: quadratic-mini and learned-mini (width 64) for "
    "300 epochs with the paper's recipe (SGD 0.1/0.9/1e-4, 5 % warm-up = 15 epochs, cosine to zero at epoch "
    "300, batch 100), three seeds each; for a GPU",
    rows={preset: {"epochs": 300, "checkpoint_every": 50} for preset in ("quadratic-mini", "learned-mini")},
    seeds=(0, 1, 2),
    paper_names={"quadratic-mini": "quadratic", "learned-mini": "learned"},
    evolution_preset="quadratic-mini",
    evolution_from="metrics",
    settle_epochs=(6, 20, 60, 150, 300),
    baseline="mini-long",
    claims=TABLE1_CLAIMS,
)

# ``locality-mini``: does the training protocol make attention local? ``mini-long``'s quadratic and
# learned models and recipe with CutMix on. Santiago Toledo & Martinez ("Inducing Spatial Locality in
# Vision Transformers through the Training Protocol", arXiv 2605.16390) report that, with the
# architecture and optimiser fixed, CutMix alone decides whether early-layer attention becomes local.
# CutMix is the CutMix paper's CIFAR setting (Yun et al. 2019). ``mini-long``'s runs are the baseline
# at the same epochs (the first 20 epochs of a 60-epoch schedule have the same learning rates, so
# epoch 20 compares fairly before a run ends), judged by the criterion fixed before these runs.
LOCALITY_MINI = Suite(
    "locality-mini",
    "Whether CutMix makes attention local: mini-long's quadratic-mini and learned-mini (width 64, 60 epochs, "
    "SGD 0.1/0.9/1e-4, 5 % warm-up + cosine, batch 100) with CutMix on (p 0.5, Beta(1, 1))",
    rows={preset: {"epochs": 60, "checkpoint_every": 10, "cutmix": 0.5, "cutmix_alpha": 1.0}
          for preset in ("quadratic-mini", "learned-mini")},
    paper_names={"quadratic-mini": "quadratic", "learned-mini": "learned"},
    evolution_preset="quadratic-mini",
    evolution_from="metrics",
    settle_epochs=(6, 20, 60),
    baseline="mini-long",
    differs="CutMix",
    compare_at=(6, 20, 60),
    claims=TABLE1_CLAIMS,
)

# ``paper-long``: the paper's own networks (width 400) with ``mini-long``'s length and analysis, so
# that widths 64 and 400 compare at equal epochs; trained on a GPU, a run per short job
# (``tools/gpu_job.py`` in the repository).
PAPER_LONG = Suite(
    "paper-long",
    "Table 1 at the paper's width (400) for 60 epochs: the paper's presets and recipe (SGD "
    "0.1/0.9/1e-4, 5 % warm-up + cosine, batch 100), mini-long's length; for a GPU",
    # The ResNet preset's own schedule is the reference's MultiStepLR at epochs 80/150/250 of 300: cut
    # at 60 epochs it never decays. mini-long trains its ResNet with the attention models' cosine.
    rows={name: {"epochs": 60, **({"schedule": "cosine"} if name == "resnet18" else {})} for name in PAPER_ROWS},
    paper_names={name: name for name in PAPER_ROWS},
    evolution_preset="quadratic",
    evolution_from="metrics",
    last=("learned-content",),
    settle_epochs=(6, 20, 40, 60),
    claims=TABLE1_CLAIMS,
)

# ``paper``: Table 1 at the paper's scale (width 400, 300 epochs), for a GPU.
PAPER = Suite(
    "paper",
    "Table 1 at the paper's scale: width 400, 300 epochs; for a GPU",
    rows={name: {} for name in PAPER_ROWS},
    paper_names={name: name for name in PAPER_ROWS},
    evolution_preset="quadratic",
    claims=TABLE1_CLAIMS,
)
