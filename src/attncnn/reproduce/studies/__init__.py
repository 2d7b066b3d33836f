"""Every study ``attncnn reproduce`` runs, each one declared value of a shape of :mod:`.shapes` (the
Table 1 suites in :mod:`.table1`, the sample-efficiency grids in :mod:`.efficiency`), registered in
:data:`STUDIES` (the one table a new study is added to).
"""

from __future__ import annotations

from ...errors import InputError
from .claims import Claim, Criterion
from .efficiency import EFFICIENCY, EFFICIENCY_SCARCE
from .shapes import Grid, Suite
from .table1 import LOCALITY_MINI, MINI, MINI_300, MINI_LONG, PAPER, PAPER_LONG

__all__ = ["STUDIES", "SUITES", "GRIDS", "Study", "get_suite", "Suite", "Grid", "Claim", "Criterion",
           "MINI", "MINI_LONG", "MINI_300", "LOCALITY_MINI", "PAPER_LONG", "PAPER", "EFFICIENCY", "EFFICIENCY_SCARCE"]

Study = Suite | Grid

#: every study by name, in the order the help text lists them
STUDIES: dict[str, Study] = {s.name: s for s in (MINI, MINI_LONG, MINI_300, LOCALITY_MINI, PAPER_LONG, PAPER,
                                                 EFFICIENCY, EFFICIENCY_SCARCE)}
#: the Table 1 suites among them
SUITES: dict[str, Suite] = {name: s for name, s in STUDIES.items() if isinstance(s, Suite)}
#: the sample-efficiency grids among them
GRIDS: dict[str, Grid] = {name: s for name, s in STUDIES.items() if isinstance(s, Grid)}


def get_suite(name: str) -> Suite:
    """Look a Table 1 suite up by name.

    Raises:
        InputError: unknown name (the message lists the valid ones).
    """
    try:
        return SUITES[name]
    except KeyError:
        raise InputError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}") from None
