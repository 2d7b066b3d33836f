"""The 300-epoch suite ``mini-300`` without training: its declared runs and recipe, and its report on
hand-written metrics.jsonl files: the settled-on-a-grid answer at each judged epoch, set beside
``mini-long``'s report, and the figure of the centres at epoch 60 beside epoch 300 and beside
``mini-long``'s own epoch 60."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from attncnn.models import get_preset
from attncnn.reproduce import STUDIES, Job, get_suite, plan
from attncnn.reproduce.reporting import figures
from attncnn.reproduce.reporting.results import RunResult
from attncnn.reproduce.reporting.epochs import compare_settling, run_settling, settling_lines
from attncnn.reproduce.reporting.table1 import epoch_sections
from attncnn.reproduce.running.runner import TrainOptions, job_config, train_command
from attncnn.reproduce.studies.table1 import TABLE1_CLAIMS
from attncnn.training.schedule import LRSchedule, warmup_cosine_multiplier


def test_the_suite_declares_six_runs_at_the_papers_length(tmp_path):
    suite = get_suite("mini-300")
    assert STUDIES["mini-300"] is suite and "GPU" in suite.description
    assert tuple(suite.rows) == ("quadratic-mini", "learned-mini")
    assert [(j.preset, j.seed) for j in plan(suite, tmp_path)] == [
        ("quadratic-mini", 0), ("learned-mini", 0), ("quadratic-mini", 1), ("learned-mini", 1),
        ("quadratic-mini", 2), ("learned-mini", 2)]
    assert all(recipe == {"epochs": 300, "checkpoint_every": 50} for recipe in suite.rows.values())
    assert suite.settle_epochs == (6, 20, 60, 150, 300) and suite.settled_below == 0.5
    assert (suite.baseline, suite.evolution_preset, suite.evolution_from) == ("mini-long", "quadratic-mini", "metrics")
    assert suite.claims == get_suite("mini-long").claims == TABLE1_CLAIMS
    for job in plan(suite, tmp_path):
        config = job_config(job, TrainOptions())
        assert get_preset(job.preset).train["epochs"] == 6                     # the suite's 300, not the preset's
        assert (config.epochs, config.lr, config.momentum, config.weight_decay, config.batch_size, config.schedule,
                config.warmup_ratio, config.lr_stepping, config.checkpoint_every) == (
            300, 0.1, 0.9, 1e-4, 100, "cosine", 0.05, "step", 50)
        # CIFAR-10 at batch 100: 500 steps an epoch; the warm-up is a ratio, so 15 epochs of 300
        schedule = LRSchedule(base_lr=config.lr, epochs=config.epochs, steps_per_epoch=500, kind=config.schedule,
                              warmup_ratio=config.warmup_ratio, stepping=config.lr_stepping)
        assert schedule.total_steps == 300 * 500 and schedule.warmup_steps == 15 * 500
        assert schedule.lr_at(14, 499) == pytest.approx(0.1 * 7499 / 7500) and schedule.lr_at(15, 0) == 0.1
        assert warmup_cosine_multiplier(300 * 500, schedule.total_steps, schedule.warmup_steps) == 0.0
        # the end of epoch 60, mid-schedule: 0.5 (1 + cos(pi (30,000 - 1 - 7,500) / (150,000 - 7,500))) of the peak
        assert schedule.lr_at(59, 499) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 22_499 / 142_500)))
    assert "--epochs 300 --checkpoint-every 50" in train_command(plan(suite, tmp_path)[0], TrainOptions())


def _heads(layer: int, offset: float) -> dict:
    """Two isotropic heads of ``layer``, ``offset`` tokens off the shifts (0, 1) and (-1, 0)."""
    out = {}
    for head, (row, col) in enumerate(((0.0, 1.0), (-1.0, 0.0)), start=1):
        out.update({f"attn/layer{layer}/head{head}/center_row": row + offset,
                    f"attn/layer{layer}/head{head}/center_col": col, f"attn/layer{layer}/head{head}/alpha": 2.0})
    return out


def _records(epochs: int, settles_at: int | None) -> list[dict]:
    """A 2-layer run: layer 1's grid distance 0.8 tokens, 0.45 from epoch ``settles_at`` on (None:
    never); layer 2's 1.2 throughout; a cosine-like lr that ends at 0."""
    records = []
    for e in range(1, epochs + 1):
        first = 0.45 if settles_at is not None and e >= settles_at else 0.8
        records.append({"epoch": e, "test_accuracy": 0.5 + e / 1000, "lr": 0.1 * (1 - e / epochs),
                        "attn/layer1/grid_distance": first, "attn/layer2/grid_distance": 1.2,
                        **_heads(1, first - 0.4), **_heads(2, 0.7)})
    return records


def _result(root, preset: str, seed: int, records: list[dict]) -> RunResult:
    folder = root / preset / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"preset": preset, "seed": seed, "epochs": records[-1]["epoch"]}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return RunResult(SimpleNamespace(preset=preset, seed=seed, folder=folder),
                     SimpleNamespace(metrics=records, path=folder))


def _mini_long_report(root) -> None:
    """``mini-long``'s report.json as it reads: no layer settled at 6, 20, 40 or 60."""
    settled = [{"preset": "quadratic-mini", "seed": seed, "epoch": e, "grid_distance": [0.84 + e / 1000, 1.2],
                "settled": [False, False], "settled_layers": 0} for seed in (0, 1) for e in (6, 20, 40, 60)]
    (root / "mini-long").mkdir(exist_ok=True)
    (root / "mini-long" / "report.json").write_text(json.dumps({
        "rows": [{"preset": "quadratic-mini", "accuracy_mean": 0.8728, "accuracy_std": 0.0015, "seeds": [0, 1, 2],
                  "epochs": 60}], "epoch_study": {"settled": settled}}))


ROWS = [{"preset": "quadratic-mini", "accuracy_mean": 0.8, "accuracy_std": 0.01, "seeds": [0, 1], "epochs": 300,
         "paper": {"accuracy": 0.938}},
        {"preset": "learned-mini", "accuracy_mean": None, "accuracy_std": None, "seeds": [], "epochs": None,
         "paper": {"accuracy": 0.918}}]


def test_the_report_says_which_run_settled_and_whether_the_length_changed_it(tmp_path):
    suite = get_suite("mini-300")
    out = tmp_path / "mini-300"
    results = {"quadratic-mini": [_result(out, "quadratic-mini", 0, _records(300, 150)),
                                  _result(out, "quadratic-mini", 1, _records(300, None))]}
    _mini_long_report(tmp_path)
    md, entry = epoch_sections(suite, out, ROWS, results)
    text = "\n".join(md)
    assert "## Settled on a grid? (epochs 6, 20, 60, 150, 300)" in text
    assert "| quadratic-mini | 0 | 150 | 0.45 ✓ | 1.20 | 1 of 2 |" in text
    assert ("**By epoch 300, by the criterion (grid distance below 0.5 tokens): yes**: a layer settled in 1 of the 2 "
            "runs that reached epoch 300: `quadratic-mini` seed 0 (layer 1).") in text
    assert ("- `quadratic-mini` seed 0 (300 epochs): settled at epochs 150 (layer 1) and 300 (layer 1); no layer at "
            "6, 20 and 60 (lowest grid distance: 0.45 tokens, layer 1, epoch 150).") in text
    assert ("- `quadratic-mini` seed 1 (300 epochs): no layer settled at epochs 6, 20, 60, 150 or 300 (lowest grid "
            "distance: 0.80 tokens, layer 1, epoch 6).") in text
    assert "the length changed the settled layers in 1 of the 2 runs that reached epoch 60." in text
    assert ("- `quadratic-mini` seed 0: at epoch 60 (the end of its schedule): none here, none there; at this run's "
            "end, epoch 300: layer 1: the length changed it.") in text
    assert ("- `quadratic-mini` seed 1: at epoch 60 (the end of its schedule): none here, none there; at this run's "
            "end, epoch 300: none: the length changed nothing.") in text
    assert "| quadratic-mini | 80.00 ± 1.00 (2 seeds, 300 epochs) | 87.28 ± 0.15 (3 seeds, 60 epochs) | 93.8 |" in text
    assert [c["changed"] for c in entry["settling_beside_baseline"]] == [True, False]
    assert [[j["layers"] for j in r["judged"]] for r in entry["settling"]] == [[[], [], [], [1], [1]], [[]] * 5]


def test_a_layer_settled_at_60_that_mini_long_did_not_settle_is_a_change_at_60(tmp_path):
    _mini_long_report(tmp_path)
    baseline = json.loads((tmp_path / "mini-long" / "report.json").read_text())
    runs = run_settling([("quadratic-mini", 0, _records(300, 40), None)], (6, 20, 60, 150, 300), 0.5)
    (c,) = compare_settling(runs, baseline, 0.5)
    assert (c["epoch"], c["here_at"], c["there"], c["end"], c["here_end"], c["changed"]) == (
        60, [1], [], 300, [1], True)
    # mini-long's own distances judged by a looser criterion: settled there too, so nothing changed at 60
    (c,) = compare_settling(runs, baseline, 0.95)
    assert c["there"] == [1] and c["here_at"] == [1] and not c["changed"]


def test_an_unfinished_run_is_judged_at_the_epochs_it_has_reached(tmp_path):
    """Between the GPU jobs every run is unfinished: the answer reads their epochs so far."""
    suite = get_suite("mini-300")
    out = tmp_path / "mini-300"
    _mini_long_report(tmp_path)
    finished = _result(out, "quadratic-mini", 1, _records(300, None))
    started = _result(out, "quadratic-mini", 0, _records(300, 40)[:74]).job
    job = Job("quadratic-mini", 0, started.folder, (("epochs", 300), ("checkpoint_every", 50)))
    md, entry = epoch_sections(suite, out, ROWS, {"quadratic-mini": [finished]}, [job])
    text = "\n".join(md)
    assert ("- `quadratic-mini` seed 0 (unfinished: epoch 74 of 300 so far): settled at epoch 60 (layer 1); no layer "
            "at 6 and 20; epochs 150 and 300 not reached yet; at its latest epoch, epoch 74: layer 1 settled (lowest "
            "grid distance: 0.45 tokens, layer 1, epoch 60).") in text
    assert ("- `quadratic-mini` seed 0: at epoch 60 (the end of its schedule): layer 1 here, none there; at its latest "
            "epoch so far, epoch 74: layer 1: the length changed it.") in text
    assert "| quadratic-mini | 0 |" not in text                  # the table holds finished runs alone
    assert [(r["seed"], r["finished"]) for r in entry["settling"]] == [(0, False), (1, True)]     # seed order
    assert "a layer settled in 0 of the 1 runs that reached epoch 300; 1 more has not reached it yet." in text


def test_a_smoke_run_shorter_than_every_judged_epoch_says_not_reached(tmp_path):
    suite = get_suite("mini-300")
    out = tmp_path / "mini-300"
    results = {"quadratic-mini": [_result(out, "quadratic-mini", 0, _records(2, None))]}
    md, entry = epoch_sections(suite, out, ROWS, results)              # no mini-long report beside
    text = "\n".join(md)
    assert "(no finished run logs grid distances at these epochs)" in text
    assert ("**Not answered yet**: no run has reached epoch 300, the last judged one (the furthest is at epoch 2)."
            in text)
    assert ("- `quadratic-mini` seed 0 (2 epochs): epochs 6, 20, 60, 150 and 300 not reached; at its end, epoch 2: "
            "no layer settled (lowest grid distance: 0.80 tokens, layer 1, epoch 2).") in text
    assert "No `mini-long` report beside this folder (../mini-long/report.json), so the comparison with it" in text
    assert "settling_beside_baseline" not in entry
    # beside mini-long's report: a run that has not reached its epoch 60 compares nothing yet
    _mini_long_report(tmp_path)
    md, entry = epoch_sections(suite, out, ROWS, results)
    text = "\n".join(md)
    assert "settled layers listed, \"none\" when no layer settled): no run here has reached epoch 60 yet." in text
    assert ("- `quadratic-mini` seed 0: at epoch 60 (the end of its schedule): not reached here, none there; at this "
            "run's end, epoch 2: none: nothing to compare yet.") in text
    assert entry["settling_beside_baseline"][0]["changed"] is None


def _drawn(monkeypatch, result, suite, tmp_path) -> dict:
    """What ``_logged_evolution`` asks of the figure for ``result``: its layers, columns, other runs,
    notes and title (the drawing itself: the test below)."""
    asked = {}

    def figure(layers, drawn, **options):
        asked.update(layers=sorted(layers), drawn=drawn, **options)
        return "figure"

    monkeypatch.setattr(figures, "centers_over_epochs_figure", figure)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, formats: [path])
    saved = figures._Figures(tmp_path / "figures", ("png",))
    figures._logged_evolution(result, suite, saved)
    assert {key: path.name for key, path in saved.items()} == {
        "fig3 quadratic-mini": "fig3-quadratic-mini-layers-epochs"}
    return asked


def test_the_centres_at_epoch_60_are_set_beside_300_and_beside_mini_longs_60(tmp_path, monkeypatch):
    suite = get_suite("mini-300")
    result = _result(tmp_path / "mini-300", "quadratic-mini", 0, _records(300, 150))
    _result(tmp_path / "mini-long", "quadratic-mini", 0, _records(60, None))           # its folder, beside
    asked = _drawn(monkeypatch, result, suite, tmp_path)
    # every layer (rows); columns: epochs 1, 6, 20, 60, then mini-long's last epoch, 150 and 300
    assert asked["layers"] == [1, 2] and asked["drawn"] == [1, 6, 20, 60, ("mini-long", 60), 150, 300]
    assert asked["notes"] == {1: "lr 0.1", 6: "lr 0.098", 20: "lr 0.093", 60: "lr 0.08", 150: "lr 0.05",
                              300: "lr 0, end of its schedule", ("mini-long", 60): "lr 0, end of its schedule"}
    theirs = asked["others"]["mini-long"]
    assert sorted(theirs) == [1, 2] and [e for e, _, _ in theirs[1]] == list(range(1, 61))
    assert theirs[1][-1][1].tolist() == [[0.4, 1.0], [-0.6, 0.0]]                   # mini-long's epoch-60 centres
    assert asked["title"].split("\n")[1] == ("'mini-long epoch 60': the mini-long run of this model and seed at the "
                                             "end of its schedule")
    # without mini-long's folder beside: this run's columns alone
    other = _result(tmp_path / "alone" / "mini-300", "quadratic-mini", 0, _records(300, 150))
    asked = _drawn(monkeypatch, other, suite, tmp_path)
    assert asked["drawn"] == [1, 6, 20, 60, 150, 300] and asked["others"] == {} and "mini-long" not in asked["title"]


def test_the_figure_titles_each_column_with_its_run_and_note():
    from attncnn.analysis.epoch_figures import centers_over_epochs_figure
    from attncnn.errors import InputError

    def snaps(epochs, shift):
        return {1: [(e, np.array([[shift, 1.0]]), 4 * np.eye(2)[None]) for e in epochs]}

    fig = centers_over_epochs_figure(snaps([1, 60, 300], 0.0), [60, ("mini-long", 60), 300],
                                     others={"mini-long": snaps([1, 60], 0.3)},
                                     notes={60: "lr 0.09", ("mini-long", 60): "lr 0, end of its schedule"})
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "layer 1, epoch 60\nlr 0.09", "layer 1, mini-long epoch 60\nlr 0, end of its schedule", "layer 1, epoch 300"]
    with pytest.raises(InputError, match=r"columns \[\('mini-300', 60\)\] name runs not given"):
        centers_over_epochs_figure(snaps([60], 0.0), [60, ("mini-300", 60)])


def test_a_dry_run_prints_the_six_runs_and_their_time_without_training(make_tiny_data, tmp_path, capsys, monkeypatch):
    from attncnn.cli import main
    from attncnn.reproduce.running import estimate

    # one timed step per model, made up (2 s a step, 0.5 s a test batch): the plan is what is tested
    monkeypatch.setattr(estimate, "time_steps", lambda *a, **k: {"step_seconds": 2.0, "infer_seconds": 0.5})
    data = make_tiny_data(40, 10, size=16)            # 3 classes: 120 train, 30 test images of 16x16
    out = tmp_path / "mini-300"
    assert main(["reproduce", "mini-300", "--dry-run", "--out", str(out), "--no-compile", "--batch-size", "10",
                 "--data", str(data)]) == 0
    text = capsys.readouterr().out
    commands = [line for line in text.splitlines() if line.startswith("attncnn train ")]
    assert [c.split(" --data ")[0] for c in commands] == [f"attncnn train --preset {p} --seed {s}" for s in (0, 1, 2)
                                                          for p in ("quadratic-mini", "learned-mini")]
    assert all(c.endswith("--epochs 300 --batch-size 10 --checkpoint-every 50 --no-compile") for c in commands)
    # 12 steps of 2 s and a test pass of 3 batches of 0.5 s an epoch: 25.5 s, 300 epochs, six runs
    assert f"# total ~{6 * 300 * 25.5 / 3600:.1f} h on this device" in text
    assert not out.exists()


@pytest.mark.slow
def test_a_one_epoch_smoke_run_reports_every_section_and_the_epochs_not_reached(make_tiny_data, tmp_path):
    from attncnn.cli import main

    data = make_tiny_data(40, 10, size=16)
    _mini_long_report(tmp_path)
    _result(tmp_path / "mini-long", "quadratic-mini", 0, _records(60, None))        # mini-long's run, beside
    out = tmp_path / "mini-300"
    # --no-compile: the compile choice would compile the preset to time a run of seconds (tested elsewhere)
    assert main(["reproduce", "mini-300", "--data", str(data), "--out", str(out), "--epochs", "1", "--seeds", "0",
                 "--only", "quadratic-mini", "--no-progress", "--no-viewer", "--no-compile"]) == 0
    text = (out / "report.md").read_text()
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## Table 1", "## Every run", "## Attention per layer after training", "## Locality per layer after training",
        "## The paper's claims, measured",
        "## Settled on a grid? (epochs 6, 20, 60, 150, 300)", "## Where the centres went (last epoch of each run)",
        "## What each run cost, and where it ran", "## Table 1 beside the `mini-long` suite and the paper",
        "## Figures", "## Use the trained models"]
    assert "- `quadratic-mini` seed 0 (1 epoch): epochs 6, 20, 60, 150 and 300 not reached; at its end, epoch 1: " \
        in text
    assert "no run here has reached epoch 60 yet." in text and "Runs not finished yet: learned-mini seed 0" in text
    report = json.loads((out / "report.json").read_text())
    assert report["figures"]["fig3 quadratic-mini"] == "figures/fig3-quadratic-mini-layers-epochs.png"
    assert [r["last_epoch"] for r in report["epoch_study"]["settling"]] == [1]


def test_a_distance_just_above_the_criterion_is_not_printed_as_the_criterion():
    # 0.504 tokens is not settled (below 0.5 is); two decimals would print it as 0.50
    records = [{"epoch": e, "attn/layer1/grid_distance": d} for e, d in ((1, 0.9), (2, 0.504))]
    runs = run_settling([("learned", 0, records, None)], (1, 2), 0.5)
    line = settling_lines(runs, (1, 2), 0.5, None, None)[2]
    assert line == ("- `learned` seed 0 (2 epochs): no layer settled at epochs 1 or 2 (lowest grid distance: "
                    "0.504 tokens, layer 1, epoch 2).")
