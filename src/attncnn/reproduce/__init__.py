"""``attncnn reproduce``: the studies of the paper (Table 1 suites) and of ConViT's claims
(sample-efficiency grids), each declared once as data (:mod:`.studies`), run (:mod:`.running`) and
reported (:mod:`.reporting`) by the same code. :mod:`.request` is one ``attncnn reproduce`` call as
plain values, with the table of which options each kind of call takes; :func:`run_study`
(:mod:`.orchestration`) runs it.

The package sits above ``analysis`` and ``training`` and below the command line (:mod:`attncnn.cli`),
which turns its flags into a :class:`StudyRequest`.
"""

from .orchestration import run_study
from .request import StudyRequest
from .running.runner import Job, job_state, plan, plan_grid, plan_study
from .studies import GRIDS, STUDIES, SUITES, Claim, Criterion, Grid, Suite, get_suite

__all__ = ["STUDIES", "SUITES", "GRIDS", "Suite", "Grid", "Claim", "Criterion", "Job", "get_suite",
           "plan", "plan_grid", "plan_study", "job_state", "StudyRequest", "run_study"]
