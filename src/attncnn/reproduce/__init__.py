"""``attncnn reproduce``: the studies of the paper (Table 1 suites) and of ConViT's claims
(sample-efficiency grids), each declared once, run and reported by the same code.

* :mod:`.studies`: every study as data, a :class:`~.studies.Suite` or :class:`~.studies.Grid` value:
  its rows, each a plain mapping of recipe overrides, and its claims with their criteria as data;
  :data:`~.studies.STUDIES` registers them (a new study: its declaration beside its kin, its entry there).
* :mod:`.running`: the jobs of any study and the resumable runner, ``--dry-run``'s estimates, a
  grid's calibration and learning-rate sweep.
* :mod:`.reporting`: the finished runs' numbers, the declared claims evaluated, one report writer
  and one figure writer.
* :mod:`.request`: one ``attncnn reproduce`` call as plain values and the table of which options each
  kind of call takes; :mod:`.orchestration`: :func:`run_study`, the call run.

The package sits above ``analysis`` and ``training`` and below the command line (:mod:`attncnn.cli`),
which turns its flags into a :class:`StudyRequest`.
"""

from .orchestration import run_study
from .request import StudyRequest
from .running.runner import Job, job_state, plan, plan_grid, plan_study
from .studies import GRIDS, STUDIES, SUITES, Claim, Criterion, Grid, Suite, get_suite

__all__ = ["STUDIES", "SUITES", "GRIDS", "Suite", "Grid", "Claim", "Criterion", "Job", "get_suite",
           "plan", "plan_grid", "plan_study", "job_state", "StudyRequest", "run_study"]
