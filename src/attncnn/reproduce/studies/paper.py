"""``paper``: Table 1 at the paper's scale (width 400, 300 epochs), for a GPU."""

from __future__ import annotations

from .shapes import Suite
from .table1 import PAPER_ROWS, TABLE1_CLAIMS

__all__ = ["PAPER"]

PAPER = Suite(
    "paper",
    "Table 1 at the paper's scale: width 400, 300 epochs; for a GPU",
    presets=PAPER_ROWS,
    paper_names={name: name for name in PAPER_ROWS},
    evolution_preset="quadratic",
    claims=TABLE1_CLAIMS,
)
