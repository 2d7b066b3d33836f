"""Claims declared as data and judged by the generic evaluator: declared criteria on hand-written
numbers give the expected verdicts, ``not measured yet`` included, with no study's code involved."""

from __future__ import annotations

import pytest

from attncnn.reproduce.reporting.claims import (FAILS, HOLDS, MISSING, CellNumbers, RunNumbers, evaluate_claims, judge,
                                                read_claim, verdict)
from attncnn.reproduce.studies import STUDIES, Claim, Criterion, Grid
from attncnn.reproduce.studies.claims import (LARGEST, SMALLEST, Accuracies, Gain, Layers, PerLayer, PerRow, Scarcity,
                                              Versus)

CELLS = ["10 %", "100 %"]


def _seed(first: float, last: float, train: float, **logged) -> list[dict]:
    """One seed's epoch records: two epochs, both evaluated; ``logged`` at the last."""
    return [{"epoch": 1, "test_accuracy": first, "train_accuracy": first},
            {"epoch": 2, "test_accuracy": last, "train_accuracy": train, **logged}]


def _numbers(cells: dict) -> CellNumbers:
    """``{(row, cell): [seed records, ...]}`` as a grid's numbers."""
    rows = list(dict.fromkeys(row for row, _ in cells))
    return CellNumbers(cells, CELLS, rows)


def _one(claim: Claim, numbers) -> dict:
    found = evaluate_claims([claim], numbers)
    assert len(found) == 1
    return found[0]


OVERFITS = Claim("scarce", "the {small} cell is scarce", "train - test gap on {small}, not {large}",
                 PerRow("gap", ("a", "b")), criteria=(Criterion("gap", ">=", 0.15),))


def test_a_threshold_criterion_holds_fails_or_is_not_measured():
    both = _numbers({("a", "10 %"): [_seed(0.2, 0.5, 0.9)], ("b", "10 %"): [_seed(0.2, 0.6, 0.8)]})
    entry = _one(OVERFITS, both)
    assert entry == {"claim": "the 10 % cell is scarce", "metric": "train - test gap on 10 %, not 100 %",
                     "values": "a 40.00, b 20.00", "verdict": HOLDS}
    # b overfits by 10 points only: one failing number fails the claim
    assert _one(OVERFITS, _numbers({("a", "10 %"): [_seed(0.2, 0.5, 0.9)], ("b", "10 %"): [_seed(0.2, 0.6, 0.7)]})
                )["verdict"] == FAILS
    # b not finished: not measured yet, its value shown as "-"
    missing = _one(OVERFITS, _numbers({("a", "10 %"): [_seed(0.2, 0.5, 0.9)]}))
    assert (missing["verdict"], missing["values"]) == (MISSING, "a 40.00, b -")
    # ...unless a measured number already fails it
    assert _one(OVERFITS, _numbers({("a", "10 %"): [_seed(0.2, 0.5, 0.55)]}))["verdict"] == FAILS
    # the mean over seeds is judged: (0.40 + 0.10) / 2 = 0.25 >= 0.15
    two = _numbers({("a", "10 %"): [_seed(0.2, 0.5, 0.9), _seed(0.2, 0.5, 0.6)], ("b", "10 %"): [_seed(0, .5, .7)]})
    assert _one(OVERFITS, two)["values"] == "a 25.00, b 20.00"


def test_criteria_judge_the_numbers_of_their_cell_and_row_only():
    claim = Claim("versus", "a beats b", "last accuracy", Versus("a", "b"),
                  criteria=(Criterion("difference", ">", 0.0, cell=SMALLEST), Criterion("shrink", ">", 0.0)))
    # +5 points on 10 %, -1 on 100 %: only the smallest cell's difference is judged, and it shrinks
    numbers = _numbers({("a", "10 %"): [_seed(0.1, 0.55, 0.9)], ("b", "10 %"): [_seed(0.1, 0.50, 0.9)],
                        ("a", "100 %"): [_seed(0.1, 0.79, 0.9)], ("b", "100 %"): [_seed(0.1, 0.80, 0.9)]})
    entry = _one(claim, numbers)
    assert entry["verdict"] == HOLDS
    assert entry["values"] == "10 %: a 55.00 vs b 50.00 (+5.00); 100 %: a 79.00 vs b 80.00 (-1.00); shrinks by +6.00"
    largest = Claim("versus", "a beats b", "", Versus("a", "b"), criteria=(Criterion("difference", ">", 0.0,
                                                                                     cell=LARGEST),))
    assert _one(largest, numbers)["verdict"] == FAILS
    gates = Claim("gates", "early positional, late content", "", Layers("gate", ("g", "h")),
                  criteria=(Criterion("first layer", ">=", 0.5, row="g"), Criterion("last layer", "<", 0.5, row="g")))
    logged = {"attn/layer1/gate": 0.8, "attn/layer2/gate": 0.3}
    other = {"attn/layer1/gate": 0.1, "attn/layer2/gate": 0.9}             # h's gates are shown, not judged
    numbers = _numbers({(row, cell): [_seed(0.1, 0.5, 0.9, **(logged if row == "g" else other))]
                        for row in "gh" for cell in CELLS})
    entry = _one(gates, numbers)
    assert entry["verdict"] == HOLDS
    assert entry["values"].startswith("g 10 %: L1 0.80, L2 0.30; g 100 %: L1 0.80, L2 0.30; h 10 %: L1 0.10")
    del numbers.records[("g", "100 %")]
    assert _one(gates, numbers)["verdict"] == MISSING and "g 100 %: -" in _one(gates, numbers)["values"]


def test_a_gain_is_over_the_best_base_finished_and_missing_cells_show_a_dash():
    numbers = _numbers({("x", "10 %"): [_seed(0.30, 0.60, 0.9)], ("p", "10 %"): [_seed(0.20, 0.50, 0.9)],
                        ("q", "10 %"): [_seed(0.35, 0.55, 0.9)], ("x", "100 %"): [_seed(0.4, 0.8, 0.9)]})
    claim = Claim("gain", "x gains", "points", Gain((("x", ("p", "q")),), at=("first", "last")))
    entry = _one(claim, numbers)
    assert "verdict" not in entry                       # no criteria: numbers without a verdict
    assert entry["values"] == "10 %: first -5.00 / last +5.00, 100 %: first - / last -"
    judged = Claim("gain", "x gains", "points", Gain((("x", ("p", "q")),)), criteria=(Criterion("last", ">", 0),))
    assert _one(judged, numbers)["verdict"] == MISSING              # the 100 % cell has no base yet
    numbers.records[("p", "100 %")] = [_seed(0.4, 0.85, 0.9)]
    assert _one(judged, numbers)["verdict"] == FAILS
    assert _one(judged, numbers)["values"] == "10 % +5.00, 100 % -5.00"


def test_scarcity_reads_every_row_with_a_finished_cell():
    numbers = _numbers({("a", "10 %"): [_seed(0.1, 0.50, 0.70)], ("a", "100 %"): [_seed(0.1, 0.80, 0.85)],
                        ("b", "100 %"): [_seed(0.1, 0.70, 0.75)]})
    numbers.rows.append("c")                            # planned, nothing finished: left out
    entry = _one(Claim("scarce", "s", "m", Scarcity()), numbers)
    assert entry["values"] == "a: 100 % vs 10 % +30.00, train - test +20.00; b: 100 % vs 10 % -, train - test -"


def test_verdicts_and_criteria():
    assert verdict([]) == MISSING and verdict([True, None]) == MISSING
    assert verdict([True, True]) == HOLDS and verdict([None, False]) == FAILS
    assert judge(Criterion("gap", ">=", 0.15), 0.15) is True and judge(Criterion("gap", "<", 0.5), 0.5) is False
    assert judge(Criterion("gap", ">", 0.0), None) is None
    with pytest.raises(ValueError, match="compares with one of"):
        Criterion("gap", "=>", 0.15)


def test_table1_claims_are_left_out_until_measured_and_name_the_suites_preset():
    rows = [{"preset": "learned-mini", "paper_preset": "learned", "accuracy_mean": 0.6543},
            {"preset": "learned-content-mini", "paper_preset": "learned-content", "accuracy_mean": None}]
    layers = {"learned-mini": [{"distance": 1.23456}, {"distance": 2.5}]}
    claims = [Claim("acc", "content does not help", "accuracy %", Accuracies(("learned-content", "learned"))),
              Claim("local", "local early", "{row}: distance per layer", PerLayer("learned", "distance"))]
    found = evaluate_claims(claims, RunNumbers(rows, layers, {}))
    assert found == [{"claim": "local early", "metric": "learned-mini: distance per layer", "values": [1.235, 2.5]}]
    rows[1]["accuracy_mean"] = 0.61
    assert evaluate_claims(claims, RunNumbers(rows, layers, {}))[0]["values"] == [61.0, 65.43]
    assert read_claim(claims[1], RunNumbers(rows, {}, {})) is None


def test_every_study_declares_its_claims_as_data():
    for study in STUDIES.values():
        assert study.claims, study.name
        for claim in study.claims:
            assert claim.statement and claim.metric
            grid_measure = isinstance(claim.measure, (PerRow, Scarcity, Versus, Gain, Layers))
            assert grid_measure == isinstance(study, Grid), (study.name, claim.name)
            for criterion in claim.criteria:
                assert criterion.row is None or criterion.row in study.rows
    judged = {study.name for study in STUDIES.values() if any(claim.criteria for claim in study.claims)}
    assert judged == {"efficiency-scarce"}
