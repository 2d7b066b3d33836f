"""``mini``: Table 1 at CPU scale (width 64, 6 epochs), the paper's geometry and recipe shape."""

from __future__ import annotations

from .shapes import Suite
from .table1 import PAPER_ROWS, TABLE1_CLAIMS

__all__ = ["MINI"]

MINI = Suite(
    "mini",
    # its measured hours per CPU are on its study page (docs/study-mini.md), not in the help
    "Table 1 at CPU scale: width 64, 6 epochs, the paper's geometry and recipe shape",
    presets=tuple(f"{name}-mini" for name in PAPER_ROWS),
    # three seeds for the two models whose comparisons need a spread: quadratic's grid claim,
    # and learned, which the content claim and learned-vs-quadratic compare against
    more_seeds={"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2)},
    paper_names={f"{name}-mini": name for name in PAPER_ROWS},
    evolution_preset="quadratic-mini",
    claims=TABLE1_CLAIMS,
)
