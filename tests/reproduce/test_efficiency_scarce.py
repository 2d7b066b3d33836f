"""The ``efficiency-scarce`` grid without training: its plan (rows, a variant's model
options, the shared AdamW rate, folders, seeds, order), the old grid's plan untouched, the
learning-rate sweep's and the calibration's plans, and ConViT's claims judged from hand-written
``metrics.jsonl`` files."""

from __future__ import annotations

import json

import pytest

from attncnn.reproduce import job_state
from attncnn.reproduce.reporting.claims import cell_numbers, evaluate_claims, verdict
from attncnn.reproduce.reporting.report import gap_lines
from attncnn.reproduce.running.measurements import sweep_results, write_sweep_report
from attncnn.reproduce.running.runner import plan_grid
from attncnn.reproduce.request import parse_rates
from attncnn.reproduce.running.measurements import plan_calibration, plan_lr_sweep, swept_rates
from attncnn.reproduce.running.runner import TrainOptions, job_config, train_command
from attncnn.reproduce.studies import EFFICIENCY, EFFICIENCY_SCARCE, GRIDS

ROWS = ("resnet18-mini", "deit-mini", "convit-mini", "convit-mini-random", "quadratic-mini", "quadratic-conv-mini",
        "deit-mini-mimetic")
CONTENT = ("deit-mini", "convit-mini", "convit-mini-random", "deit-mini-mimetic")


def test_the_scarce_grid_trains_its_rows_smallest_cell_first_with_a_second_seed_there(tmp_path):
    assert set(GRIDS) == {"efficiency", "efficiency-scarce"}
    jobs = plan_grid(EFFICIENCY_SCARCE, tmp_path)
    assert [(j.row, j.seed, j.cell) for j in jobs] == (
        [(r, 0, "10 %") for r in ROWS] + [(r, 0, "100 %") for r in ROWS] + [(r, 1, "10 %") for r in ROWS])
    assert [j.preset for j in jobs[:7]] == ["resnet18-mini", "deit-mini", "convit-mini", "convit-mini",
                                            "quadratic-mini", "quadratic-conv-mini", "deit-mini"]
    assert jobs[3].folder == tmp_path / "convit-mini-random" / "10pct" / "seed0"
    assert jobs[3].label == "convit-mini-random 10 % seed 0"
    # the 25 % cell is optional: --fractions adds it, between the others
    cells = [j.cell for j in plan_grid(EFFICIENCY_SCARCE, tmp_path, seeds=(0,), fractions=(1.0, 0.1, 0.25))]
    assert cells == ["10 %"] * 7 + ["25 %"] * 7 + ["100 %"] * 7
    with pytest.raises(ValueError, match="not in the efficiency-scarce grid"):
        plan_grid(EFFICIENCY_SCARCE, tmp_path, only=("gpsa-mini",))


def test_rows_set_their_model_options_and_the_shared_rate_and_config_json_records_them(tmp_path):
    jobs = {j.row: j for j in plan_grid(EFFICIENCY_SCARCE, tmp_path, seeds=(0,), fractions=(0.1,))}
    for row, job in jobs.items():
        overrides = dict(job.overrides)
        assert overrides.get("lr") == (1e-3 if row in CONTENT else None), row
        assert overrides.get("model") == {"convit-mini-random": {"init": "random"},
                                          "deit-mini-mimetic": {"init": "mimetic"}}.get(row), row
        assert (overrides["train_subset"], overrides["epochs"]) == (5_000, 10 * EFFICIENCY_SCARCE.passes)
    random = job_config(jobs["convit-mini-random"], TrainOptions())
    assert (random.preset, random.model, random.optimizer, random.lr) == ("convit-mini", {"init": "random"},
                                                                           "adamw", 1e-3)
    assert (job_config(jobs["quadratic-mini"], TrainOptions()).optimizer, job_config(
        jobs["resnet18-mini"], TrainOptions()).lr) == ("sgd", 0.1)
    command = train_command(jobs["convit-mini-random"], TrainOptions())
    assert "--preset convit-mini " in command and "--set init=random" in command and "--lr 0.001" in command
    # --lr moves the shared rate of the content rows only
    moved = {j.row: dict(j.overrides).get("lr") for j in plan_grid(EFFICIENCY_SCARCE, tmp_path, seeds=(0,), lr=5e-4)}
    assert moved == {r: (5e-4 if r in CONTENT else None) for r in ROWS}
    # a folder trained without the variant's model options is another run: refused
    job = jobs["convit-mini-random"]
    job.folder.mkdir(parents=True)
    stored = {"preset": "convit-mini", "seed": 0, **dict(job.overrides), "model": {}}
    (job.folder / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="holds a run with model={}.*needs model={'init': 'random'}"):
        job_state(job)
    (job.folder / "config.json").write_text(json.dumps({**stored, "model": {"init": "random"}}))
    assert job_state(job) == "interrupted"


def test_the_efficiency_grid_plan_is_unchanged(tmp_path):
    jobs = plan_grid(EFFICIENCY, tmp_path)
    assert len(jobs) == 24 and all(j.row == j.preset for j in jobs)
    assert jobs[0].folder == tmp_path / "resnet18-mini" / "10pct" / "seed0"
    assert jobs[0].label == "resnet18-mini 10 % seed 0"
    assert [dict(j.overrides) for j in jobs[:1]] == [{"checkpoint_every": 0, "epochs": 20, "eval_every": 5,
                                                      "train_subset": 5_000}]
    assert all([name for name, _ in j.overrides] == ["checkpoint_every", "epochs", "eval_every", "train_subset"]
               for j in jobs)
    assert [(j.preset, j.seed, j.cell) for j in jobs[18:]] == [(p, 1, "10 %") for p in EFFICIENCY.rows]


def test_the_lr_sweep_and_the_calibration_plans(tmp_path):
    assert parse_rates("2.5e-4, 5e-4,1e-3") == (2.5e-4, 5e-4, 1e-3)
    for bad in ("fast", "1e-3,1e-3", "0"):
        with pytest.raises(ValueError, match="--lr-sweep"):
            parse_rates(bad)
    sweep = plan_lr_sweep(EFFICIENCY_SCARCE, tmp_path, (2.5e-4, 1e-3))
    assert [(j.row, j.seed, dict(j.overrides)["lr"], dict(j.overrides)["train_subset"]) for j in sweep] == [
        ("deit-mini", 0, 2.5e-4, 5_000), ("convit-mini", 0, 2.5e-4, 5_000),
        ("deit-mini", 0, 1e-3, 5_000), ("convit-mini", 0, 1e-3, 5_000)]
    assert sweep[0].folder == tmp_path / "lr-sweep" / "deit-mini" / "lr0.00025" / "10pct" / "seed0"
    assert len({j.label for j in sweep}) == 4
    calibration = plan_calibration(EFFICIENCY_SCARCE, tmp_path, passes=6)
    assert [(j.row, j.seed, j.cell, dict(j.overrides)["epochs"]) for j in calibration] == [
        ("resnet18-mini", 0, "10 %", 60), ("deit-mini", 0, "10 %", 60)]
    assert calibration[1].folder == tmp_path / "calibrate" / "passes6" / "deit-mini" / "10pct" / "seed0"
    with pytest.raises(ValueError, match="no learning-rate sweep rows"):
        plan_lr_sweep(EFFICIENCY, tmp_path, (1e-3,))


def _epochs(first: float, final: float, train: float, gates: tuple[float, ...] = ()) -> list[dict]:
    """Two epochs, both evaluated; ``gates`` per layer (1-based) at the last."""
    last = {"epoch": 2, "train_accuracy": train, "test_accuracy": final}
    last.update({f"attn/layer{i}/gate": g for i, g in enumerate(gates, 1)})
    return [{"epoch": 1, "train_accuracy": first, "test_accuracy": first, "lr": 0.1}, last]


def _write(job, records: list[dict]) -> None:
    job.folder.mkdir(parents=True)
    (job.folder / "config.json").write_text(json.dumps({"preset": job.preset, "seed": job.seed, **dict(job.overrides)}))
    (job.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (job.folder / "finished.json").write_text("{}")


#: (row, cell) -> (first test accuracy, final test accuracy, final train accuracy, gates)
CELLS = {("resnet18-mini", "10 %"): (0.30, 0.60, 0.90, ()), ("resnet18-mini", "100 %"): (0.50, 0.85, 0.88, ()),
         ("deit-mini", "10 %"): (0.20, 0.50, 0.70, ()), ("deit-mini", "100 %"): (0.40, 0.78, 0.80, ()),
         ("convit-mini", "10 %"): (0.40, 0.55, 0.75, (0.8, 0.7, 0.3)),
         ("convit-mini", "100 %"): (0.60, 0.80, 0.82, (0.9, 0.5, 0.2)),
         ("convit-mini-random", "10 %"): (0.30, 0.52, 0.70, (0.6, 0.6, 0.6)),
         ("convit-mini-random", "100 %"): (0.50, 0.79, 0.80, (0.7, 0.6, 0.5)),
         ("quadratic-conv-mini", "10 %"): (0.35, 0.45, 0.60, ()),
         ("quadratic-conv-mini", "100 %"): (0.38, 0.70, 0.70, ()),
         ("quadratic-mini", "10 %"): (0.33, 0.50, 0.65, ())}


def _claims(jobs):
    found = {c["claim"][:3]: c for c in evaluate_claims(EFFICIENCY_SCARCE.claims, cell_numbers(jobs))}
    return {key if key.startswith("(") else "pre": claim for key, claim in found.items()}


def test_claims_are_judged_from_the_records_and_missing_cells_are_not_measured_yet(tmp_path):
    jobs = plan_grid(EFFICIENCY_SCARCE, tmp_path, train_images=1_000)
    empty = _claims(jobs)
    assert [c["verdict"] for c in empty.values()] == ["not measured yet"] * 5
    assert all(line.endswith("| not finished yet | | |") for line in gap_lines(EFFICIENCY_SCARCE, jobs)[6:])
    for job in jobs:
        if (job.row, job.cell) in CELLS:
            _write(job, _epochs(*CELLS[(job.row, job.cell)]))
    claims = _claims(jobs)
    # scarce: resnet 90 - 60 = 30 points, deit 70 - 50 = 20 points, both >= 15
    assert claims["pre"]["verdict"] == "holds"
    assert claims["pre"]["values"] == "resnet18-mini 30.00, deit-mini 20.00"
    # (a) 55 - 50 = +5 on 10 %, 80 - 78 = +2 on 100 %: GPSA wins where data is scarce, by less with more
    assert claims["(a)"]["verdict"] == "holds"
    assert "10 %: convit-mini 55.00 vs deit-mini 50.00 (+5.00); 100 %: convit-mini 80.00 vs deit-mini 78.00 (+2.00)" \
        "; shrinks by +3.00" == claims["(a)"]["values"]
    # (b) first evaluation: convit +10 and +10, quadratic +2 on 10 %; quadratic-mini 100 % missing
    assert claims["(b)"]["verdict"] == "not measured yet"
    assert "quadratic-conv-mini - quadratic-mini 10 %: first +2.00 / last -5.00" in claims["(b)"]["values"]
    assert "quadratic-conv-mini - quadratic-mini 100 %: first - / last -" in claims["(b)"]["values"]
    # (c) convit-mini's first layer 0.8 / 0.9 >= 0.5, its last 0.3 / 0.2 < 0.5 in both cells
    assert claims["(c)"]["verdict"] == "holds"
    assert "convit-mini 10 %: L1 0.80, L2 0.70, L3 0.30" in claims["(c)"]["values"]
    # (d) mimetic init has no finished cell yet; conv init's and local init's gains are there already
    assert claims["(d)"]["verdict"] == "not measured yet"
    assert "convit-mini - convit-mini-random 10 %: first +10.00 / last +3.00" in claims["(d)"]["values"]
    for job in jobs:
        if job.row == "deit-mini-mimetic" and job.seed == 0:       # 10 %: +5 first; 100 %: +2 first
            _write(job, _epochs(*((0.25, 0.52, 0.70) if job.cell == "10 %" else (0.42, 0.77, 0.80))))
    claims = _claims(jobs)
    assert claims["(d)"]["verdict"] == "holds"
    assert "deit-mini-mimetic - deit-mini 10 %: first +5.00 / last +2.00" in claims["(d)"]["values"]
    assert "deit-mini-mimetic - deit-mini 100 %: first +2.00 / last -1.00" in claims["(d)"]["values"]
    # the last cell: quadratic-mini starts better than its conv-initialised twin on 100 %: (b) fails
    _write(next(j for j in jobs if (j.row, j.cell) == ("quadratic-mini", "100 %")), _epochs(0.40, 0.72, 0.75))
    assert _claims(jobs)["(b)"]["verdict"] == "fails"
    lines = gap_lines(EFFICIENCY_SCARCE, jobs)
    assert "| resnet18-mini 10 % seed 0 | 90.00 | 60.00 | +30.00 |" in lines
    # both seeds of every 10 % row, but deit-mini-mimetic seed 1 (not written)
    assert sum("not finished yet" not in line for line in lines[6:]) == 13


def test_a_failing_condition_fails_a_claim_before_every_cell_is_in(tmp_path):
    jobs = plan_grid(EFFICIENCY_SCARCE, tmp_path, train_images=1_000, seeds=(0,))
    ten = {j.row: j for j in jobs if j.cell == "10 %"}
    _write(ten["deit-mini"], _epochs(0.2, 0.50, 0.60))              # 10 points of gap: not scarce
    _write(ten["convit-mini"], _epochs(0.2, 0.45, 0.60, (0.4, 0.3)))  # loses to deit; first layer gate < 0.5
    claims = _claims(jobs)
    assert claims["pre"]["verdict"] == "fails"          # deit's gap is known and too small, the ResNet's missing
    assert claims["(a)"]["verdict"] == "fails"
    assert claims["(c)"]["verdict"] == "fails"
    assert claims["(b)"]["verdict"] == "not measured yet"
    assert verdict([]) == "not measured yet" and verdict([True, None]) == "not measured yet"
    assert verdict([True, True]) == "holds" and verdict([None, False]) == "fails"


def test_the_sweep_picks_the_rate_best_for_both_models_on_held_out_images_not_the_test_set(tmp_path):
    rates = (2.5e-4, 5e-4, 1e-3)
    jobs = plan_lr_sweep(EFFICIENCY_SCARCE, tmp_path, rates)
    # (test accuracy, held-out accuracy); convit-mini at 1e-3 not finished
    finals = {("deit-mini", 2.5e-4): (0.60, 0.50), ("convit-mini", 2.5e-4): (0.60, 0.50),
              ("deit-mini", 5e-4): (0.56, 0.58), ("convit-mini", 5e-4): (0.50, 0.52), ("deit-mini", 1e-3): (0.70, 0.70)}
    held_out = {}
    for job in jobs:
        key = (job.row, dict(job.overrides)["lr"])
        if key in finals:
            _write(job, _epochs(0.3, finals[key][0], 0.9))
            held_out[job.folder] = {"accuracy": finals[key][1]}
    found = sweep_results(EFFICIENCY_SCARCE, jobs, rates, held_out)
    assert [entry["held_out_mean"] for entry in found["rates"]] == [pytest.approx(0.50), pytest.approx(0.55), None]
    assert [entry["test_mean"] for entry in found["rates"]] == [pytest.approx(0.60), pytest.approx(0.53), None]
    assert found["best"] == 5e-4            # the test set would have chosen 2.5e-4
    assert found["rates"][2]["held_out"] == {"deit-mini": 0.70, "convit-mini": None}
    # the report does not tell to set the grid's rate while a rate is unfinished
    lines = write_sweep_report(EFFICIENCY_SCARCE, tmp_path, jobs, rates, command="cmd", held_out=held_out)
    assert "0.0005 so far" in lines[-1] and "1 of 3 not finished yet" in lines[-1] and "set the grid" not in lines[-1]
    # finished runs not yet validated do not count
    assert sweep_results(EFFICIENCY_SCARCE, jobs, rates)["best"] is None

def test_swept_rates_add_the_rates_on_disk_once_and_keep_the_given_values(tmp_path):
    third = 1 / 3                                        # its folder is lr0.333333, which reads back as another float
    jobs = plan_lr_sweep(EFFICIENCY_SCARCE, tmp_path, (third,))
    for name in ("lr0.001", "lr0.333333", "lrx"):        # started runs (config.json), and a folder that is no rate
        folder = tmp_path / "lr-sweep" / "convit-mini" / name / "10pct" / "seed0"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (tmp_path / "lr-sweep" / "deit-mini" / "lr0.0005" / "10pct").mkdir(parents=True)   # no run in it: not swept
    assert swept_rates(jobs, (third,)) == (1e-3, third)
    assert swept_rates(jobs[:0], (third,)) == (third,)
