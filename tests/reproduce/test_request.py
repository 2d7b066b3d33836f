"""Which ``attncnn reproduce`` calls take which options: one table (``RULES``), checked once, before
anything trains (no training here)."""

from __future__ import annotations

import dataclasses

import pytest

from attncnn.errors import InputError
from attncnn.reproduce import GRIDS, STUDIES, StudyRequest
from attncnn.reproduce.request import RULES, check_request, one_of

GRID_NAMES = ", ".join(GRIDS)


def test_every_rule_names_options_of_a_request():
    names = {f.name for f in dataclasses.fields(StudyRequest)}
    assert {name for rule in RULES for name in rule.options} <= names
    assert {rule.context for rule in RULES} == {"action", "shape", "measurement", "shared_rate"}


def test_actions_and_measurements_exclude_each_other_named_by_what_the_last_does():
    assert one_of([], "action") is None and one_of(["dry-run"], "action") == "dry-run"
    for given in (["report-only", "dry-run"], ["dry-run", "report-only"]):
        with pytest.raises(InputError) as err:
            one_of(given, "action")
        assert str(err.value) == "--report-only trains nothing; leave out --dry-run"
    with pytest.raises(InputError, match="^--calibrate and --lr-sweep are two measurements; run them one at a time$"):
        one_of(["lr-sweep", "calibrate"], "measurement")


@pytest.mark.parametrize("request_, message", [
    (StudyRequest("mini", passes=2, fractions="0.5,1"),
     f"--passes, --fractions belong to the grids ({GRID_NAMES}), not to suite mini"),
    (StudyRequest("mini", measurement="calibrate"),
     f"--calibrate belongs to the grids ({GRID_NAMES}), not to suite mini"),
    (StudyRequest("efficiency", epochs=1), "the efficiency grid sets each cell's epochs and subset itself; "),
    (StudyRequest("mini", action="report-only", precision="fp32"),
     "--precision is the precision runs train at, and --report-only trains nothing "),
    (StudyRequest("mini", action="report-only", compile=False),
     "--no-compile is how runs train, and --report-only trains nothing; drop it"),
    (StudyRequest("efficiency-scarce", measurement="calibrate", seeds="0"), "choose their own seed (0)"),
    (StudyRequest("efficiency-scarce", measurement="lr-sweep", rates="1e-3", lr=1e-3),
     "--lr-sweep trains at each of its rates; leave out --lr"),
    (StudyRequest("efficiency", lr=1e-3), "the efficiency grid has none"),
    (StudyRequest("mini", action="dry-run", epochs=0), "--epochs must be >= 1, got 0"),
])
def test_an_option_the_call_would_ignore_is_refused_with_the_reason(request_, message):
    with pytest.raises(InputError) as err:
        check_request(request_)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("request_", [
    StudyRequest("efficiency", passes=2, fractions="0.5,1"),
    StudyRequest("mini", action="dry-run", precision="fp32", compile=False, epochs=1),
    StudyRequest("efficiency-scarce", measurement="calibrate", lr=1e-3, action="report-only"),
    StudyRequest("efficiency-scarce", measurement="lr-sweep", rates="1e-3,2e-3", action="report-only"),
    StudyRequest("efficiency-scarce", lr=1e-3, seeds="0,1"),
])
def test_the_same_options_are_taken_where_they_apply(request_):
    assert check_request(request_) is STUDIES[request_.study]
