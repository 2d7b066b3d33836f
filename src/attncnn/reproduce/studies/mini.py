"""``mini``: Table 1 at CPU scale (width 64, 6 epochs), the paper's geometry and recipe shape."""

from __future__ import annotations

from .shapes import Suite
from .table1 import PAPER_ROWS, TABLE1_CLAIMS

__all__ = ["MINI"]

MINI = Suite(
    "mini",
    "Table 1 at CPU scale: width 64, 6 epochs, the paper's geometry and recipe shape "
    "(measured in bf16 on 2 cores of an AMD EPYC with AVX512-BF16: 2.4 h for one seed of the four "
    "cheaper models, 4.9 h with the quadratic and learned models' three seeds; learned-content alone "
    "2.7 h; other CPUs differ, a CPU without bf16 units trains in fp32: --dry-run estimates this machine)",
    presets=tuple(f"{name}-mini" for name in PAPER_ROWS),
    # three seeds for the two models whose comparisons need a spread: quadratic's grid claim,
    # and learned, which the content claim and learned-vs-quadratic compare against
    more_seeds={"quadratic-mini": (0, 1, 2), "learned-mini": (0, 1, 2)},
    paper_names={f"{name}-mini": name for name in PAPER_ROWS},
    evolution_preset="quadratic-mini",
    claims=TABLE1_CLAIMS,
)
