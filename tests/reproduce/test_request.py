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
    assert {rule.context for rule in RULES} == {"action", "shape", "measurement", "trims", "shared_rate",
                                                "withholds"}


def test_actions_and_measurements_exclude_each_other_named_by_what_the_last_does():
    assert one_of([], "action") is None and one_of(["ship"], "action") == "ship"
    for given in (["ship", "dry-run"], ["dry-run", "ship"]):
        with pytest.raises(InputError) as err:
            one_of(given, "action")
        assert str(err.value) == "--ship trains nothing and writes the folder for committing; leave out --dry-run"
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
    (StudyRequest("mini", action="ship", compile=False),
     "--no-compile is how runs train, and --ship trains nothing and writes the folder for committing; drop it"),
    (StudyRequest("mini", action="dry-run", trim=True),
     "--trim trims finished runs, and --dry-run prints the commands and writes nothing; drop it"),
    (StudyRequest("efficiency-scarce", measurement="calibrate", seeds="0"), "choose their own seed (0)"),
    (StudyRequest("efficiency-scarce", measurement="lr-sweep", rates="1e-3", lr=1e-3),
     "--lr-sweep trains at each of its rates; leave out --lr"),
    (StudyRequest("efficiency", lr=1e-3), "the efficiency grid has none"),
    (StudyRequest("mini", action="report-only", without_weights="quadratic-mini"),
     "--without-weights ships finished runs without their weights: give it with --trim or --ship"),
    (StudyRequest("mini", action="dry-run", epochs=0), "--epochs must be >= 1, got 0"),
    (StudyRequest("mini", trim=True, weights_to="elsewhere"),
     "--weights-to is where --without-weights moves the weights it withholds, and this call withholds none; "
     "give --without-weights PRESET,... with it, or leave out --weights-to"),
    (StudyRequest("mini", action="ship", weights_to="elsewhere"), "this call withholds none"),
    (StudyRequest("efficiency-scarce", measurement="calibrate", action="ship", without_weights="convit-mini"),
     "--without-weights withholds the weights of the efficiency-scarce grid's own runs, and --calibrate's runs are "
     "not among them (--ship ships them whole); leave out --without-weights, or give it in a call without "
     "--calibrate"),
    (StudyRequest("efficiency-scarce", measurement="lr-sweep", rates="1e-3", action="ship",
                  without_weights="convit-mini", weights_to="elsewhere"), "--lr-sweep's runs are not among them"),
])
def test_an_option_the_call_would_ignore_is_refused_with_the_reason(request_, message):
    with pytest.raises(InputError) as err:
        check_request(request_)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("request_", [
    StudyRequest("efficiency", passes=2, fractions="0.5,1"),
    StudyRequest("mini", action="dry-run", precision="fp32", compile=False, epochs=1),
    StudyRequest("mini", action="report-only", trim=True, without_weights="quadratic-mini"),
    StudyRequest("mini", action="ship", without_weights="quadratic-mini"),
    StudyRequest("efficiency-scarce", measurement="calibrate", lr=1e-3, action="ship"),
    StudyRequest("efficiency-scarce", measurement="lr-sweep", rates="1e-3,2e-3", action="report-only"),
    StudyRequest("efficiency-scarce", lr=1e-3, seeds="0,1", trim=True),
    StudyRequest("mini", action="ship", without_weights="quadratic-mini", weights_to="elsewhere"),
    StudyRequest("efficiency", action="ship", without_weights="gpsa-mini", weights_to="elsewhere"),
])
def test_the_same_options_are_taken_where_they_apply(request_):
    assert check_request(request_) is STUDIES[request_.study]


def test_the_command_refuses_an_ignored_weights_to_with_status_2_before_anything_runs(tmp_path, capsys):
    from attncnn.cli import main

    out = tmp_path / "mini"
    assert main(["reproduce", "mini", "--ship", "--out", str(out), "--weights-to", str(tmp_path / "w")]) == 2
    assert "this call withholds none" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "w").exists()
