"""``attncnn reproduce``: the studies of the paper (Table 1 suites) and of ConViT's claims
(sample-efficiency grids), each declared once, run and reported by the same code.

* :mod:`.studies`: every study as data, each a declared :class:`~.studies.Suite` (Table 1 suites,
  :mod:`.studies.table1`) or :class:`~.studies.Grid` (sample-efficiency grids, :mod:`.studies.efficiency`)
  value: its runs, its recipe over the presets', and its claims with their
  criteria as data (:mod:`.studies.claims`); :data:`~.studies.STUDIES` registers them.
* :mod:`.running`: the jobs of any study (where each run lives, which are finished), the resumable
  runner (``--dry-run`` estimates), a grid's calibration and learning-rate sweep.
* :mod:`.reporting`: the finished runs' numbers, the generic evaluation of the declared claims,
  one report writer (report.md / report.json, shaped as a Table 1 suite's or a grid's) and one
  figure writer.
* :mod:`.request`: what one ``attncnn reproduce`` call does, as plain values, and the one table of
  which options each kind of call takes; :mod:`.orchestration`: :func:`run_study`, the call run;
  :mod:`.prune`: pruning and fine-tuning (``attncnn prune``).

Adding a study: its declaration beside its kin (:mod:`.studies.table1` or :mod:`.studies.efficiency`)
and its entry in :data:`~.studies.STUDIES`. The package sits above ``analysis`` and ``training`` and below the
command line (:mod:`attncnn.cli`), which turns its flags into a :class:`StudyRequest`.
"""

from .orchestration import run_study
from .request import StudyRequest
from .running.runner import Job, job_state, plan, plan_grid, plan_study
from .studies import GRIDS, STUDIES, SUITES, Claim, Criterion, Grid, Suite, get_study, get_suite

__all__ = ["STUDIES", "SUITES", "GRIDS", "Suite", "Grid", "Claim", "Criterion", "Job", "get_study", "get_suite",
           "plan", "plan_grid", "plan_study", "job_state", "StudyRequest", "run_study"]
