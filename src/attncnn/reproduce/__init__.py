"""``attncnn reproduce``: train a suite of Table 1 runs, then report them beside the paper; or the
sample-efficiency grid of issue 14 (models x training-set sizes at equal seen images).

``suites`` (which presets and seeds, where each run lives, which runs are finished) ->
``runner`` (train or resume each job; ``--dry-run`` estimates) -> ``summary`` (Table 1 rows over
seeds, per-layer curves) -> ``figures`` and ``report`` (report.md / report.json) -> ``ship``
(trim finished folders for committing). The grid reuses the same jobs, runner and ship:
``grid`` (cells and their plan) -> ``grid_report`` and ``grid_figures``; issue 26's scarce-data grid
adds ``scarce`` (its calibration and learning-rate sweep) and ``scarce_report`` (ConViT's claims
with verdicts). It sits above ``analysis`` and ``training`` and below the command line.
"""

from .grid import GRID, GRIDS, SCARCE_GRID, Grid, plan_grid
from .suites import SUITES, Job, Suite, get_suite, job_state, plan

__all__ = ["SUITES", "Suite", "Job", "get_suite", "plan", "job_state", "GRID", "GRIDS", "SCARCE_GRID", "Grid",
           "plan_grid"]
