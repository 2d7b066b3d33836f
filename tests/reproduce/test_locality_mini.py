"""``locality-mini``: mini-long's recipe with CutMix, judged beside mini-long at the same epochs."""

from __future__ import annotations

import json

from attncnn.reproduce.reporting.epochs import compare_settling, run_settling, settling_lines
from attncnn.reproduce.running.runner import plan
from attncnn.reproduce.studies import MINI_LONG, get_suite

from test_mini_300 import _mini_long_report, _records


def test_the_study_is_mini_longs_recipe_with_cutmix_and_nothing_else(tmp_path):
    suite = get_suite("locality-mini")
    assert tuple(suite.rows) == ("quadratic-mini", "learned-mini") and suite.seeds == (0,)
    for row, recipe in suite.rows.items():
        assert {k: v for k, v in recipe.items() if not k.startswith("cutmix")} == MINI_LONG.rows[row]
        assert (recipe["cutmix"], recipe["cutmix_alpha"]) == (0.5, 1.0)
    assert (suite.baseline, suite.differs, suite.compare_at, suite.settle_epochs) == (
        "mini-long", "CutMix", (6, 20, 60), (6, 20, 60))
    jobs = plan(suite, tmp_path)
    assert [(j.preset, j.seed, dict(j.overrides)["cutmix"]) for j in jobs] == [
        ("quadratic-mini", 0, 0.5), ("learned-mini", 0, 0.5)]


def test_each_run_is_set_beside_mini_long_at_every_judged_epoch_it_reached(tmp_path):
    _mini_long_report(tmp_path)           # mini-long: no layer settled at 6, 20, 40 or 60
    baseline = json.loads((tmp_path / "mini-long" / "report.json").read_text())
    # an unfinished CutMix run at epoch 25 whose first layer settled from epoch 20 on
    runs = run_settling([("quadratic-mini", 0, _records(25, 20), 60)], (6, 20, 60), 0.5)
    found = compare_settling(runs, baseline, 0.5, at=(6, 20, 60))
    assert [(c["epoch"], c["here_at"], c["there"], c["changed"]) for c in found] == [
        (6, [], [], False), (20, [1], [], True), (60, None, [], None)]
    text = "\n".join(settling_lines(runs, (6, 20, 60), 0.5, found, "mini-long", "CutMix"))
    assert "CutMix changed the settled layers in 1 of the 2 comparisons (run and epoch) made so far" in text
    assert "at epoch 20: layer 1 here, none there: CutMix changed it." in text
    assert "at epoch 60 (the end of its schedule): not reached here, none there: nothing to compare yet." in text
    assert "length" not in text
