"""What the four Table 1 suites share: the paper's rows and the paper's claims they measure.

The claims are reported with their numbers and no verdict: ``docs/study-mini.md`` judges them.
"""

from __future__ import annotations

from .claims import Accuracies, Claim, Curve, PerLayer

__all__ = ["PAPER_ROWS", "TABLE1_CLAIMS"]

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
