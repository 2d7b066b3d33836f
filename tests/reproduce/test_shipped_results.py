"""The committed Table 1 studies (results/mini, 6 epochs; results/mini-long, 60 epochs, shipped in
parts; results/paper-long, the paper's width for 60 epochs, trained on a GPU, weights shipped in
bfloat16): every finished model evaluates to the accuracy its report states (``check_shipped_run``,
tests/reproduce/conftest.py: a run with a prediction record, as every run here, on a sample of the
test images against the record), and the report's table matches the run folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from withhold import withhold_weights

from attncnn.reproduce import get_suite, job_state, plan
from attncnn.runs import PREDICTIONS_FILE

ROOT = Path(__file__).resolve().parents[2] / "results"
SUITES = [pytest.param(name, marks=pytest.mark.skipif(not (ROOT / name / "report.json").is_file(),
                                                     reason=f"no committed results/{name} report"))
          for name in ("mini", "mini-long", "paper-long")]
#: evaluated on every CPU (in fp32 where bf16 is slow): each of Table 1's models once, seed 0 of every
#: `mini` row, and `mini-long`'s cheapest, each on the 300-image sample its record is checked on
#: (seconds each on a CPU held to AVX2: docs/development.md, "Continuous integration"). The other
#: seeds and suites run the same code paths and need fast bf16.
EVERYWHERE_SUITE = "mini"
EVERYWHERE = {("mini-long", "resnet18-mini", 0)}


def _everywhere(suite: str, preset: str, seed: int) -> bool:
    return (suite == EVERYWHERE_SUITE and seed == 0) or (suite, preset, seed) in EVERYWHERE


def _runs() -> list:
    runs = []
    for name in ("mini", "mini-long", "paper-long"):
        if not (ROOT / name / "report.json").is_file():
            continue
        for row in json.loads((ROOT / name / "report.json").read_text())["rows"]:
            for seed, accuracy in zip(row["seeds"], row["accuracies"]):
                marks = [] if _everywhere(name, row["preset"], seed) else [pytest.mark.needs_fast_bf16]
                runs.append(pytest.param(name, row["preset"], seed, accuracy, marks=marks,
                                         id=f"{name}/{row['preset']}/seed{seed}"))
    return runs


pytestmark = pytest.mark.slow


def _report(suite: str) -> dict:
    return json.loads((ROOT / suite / "report.json").read_text())


@pytest.mark.parametrize("suite", SUITES)
def test_report_rows_are_the_finished_run_folders(suite):
    results = ROOT / suite
    report = _report(suite)
    for row in report["rows"]:
        folders = [results / row["preset"] / f"seed{s}" for s in row["seeds"]]
        assert all((f / "finished.json").is_file() for f in folders)
        accuracies = [json.loads((f / "metrics.jsonl").read_text().splitlines()[-1])["test_accuracy"] for f in folders]
        assert accuracies == row["accuracies"]
    unfinished = [j.label for j in plan(get_suite(suite), results) if job_state(j) != "finished"]
    assert sorted(unfinished) == sorted(report["missing"])


@pytest.mark.parametrize("suite, preset, seed, accuracy", _runs())
def test_a_shipped_checkpoint_reproduces_the_reported_accuracy(suite, preset, seed, accuracy, check_shipped_run):
    # The report's accuracy is the last epoch's, measured during training (bf16 on the training
    # machine), that of `last`, the checkpoint `attncnn evaluate <folder>` reads.
    check_shipped_run(ROOT / suite / preset / f"seed{seed}", accuracy)


def test_a_run_shipped_without_its_weights_is_checked_by_its_records(check_shipped_run, tmp_path):
    """The check a withheld run gets (none is shipped so far: the paper-width content model may be
    the first), on a copy of a shipped run withheld here: its record gives its accuracy, and a
    wrong accuracy is caught."""
    if not (ROOT / EVERYWHERE_SUITE / "report.json").is_file():
        pytest.skip(f"no committed results/{EVERYWHERE_SUITE} report")
    row = next(r for r in _report(EVERYWHERE_SUITE)["rows"] if r["preset"] == "resnet18-mini")
    folder = tmp_path / "resnet18-mini" / "seed0"
    shutil.copytree(ROOT / EVERYWHERE_SUITE / "resnet18-mini" / "seed0", folder)
    withhold_weights(folder, retrain="attncnn reproduce mini --only resnet18-mini --seeds 0",
                     move_to=tmp_path / "kept")
    check_shipped_run(folder, row["accuracies"][0])
    with pytest.raises(AssertionError):
        check_shipped_run(folder, row["accuracies"][0] + 0.01)


def test_every_table_1_run_keeps_a_prediction_record():
    """Without one a run is evaluated on all 10,000 test images: minutes for a paper-width model
    (record it: docs/development.md, "Training on a lent GPU in short jobs")."""
    missing = [param.id for param in _runs() if not (ROOT.joinpath(*param.id.split("/")) / PREDICTIONS_FILE).is_file()]
    if missing:
        folder = f"results/{missing[0]}"
        pytest.fail(f"no {PREDICTIONS_FILE} in {folder}: record it with attncnn evaluate {folder} --data "
                    f"<its data set> --predictions {folder}/{PREDICTIONS_FILE}")


def test_every_cpu_evaluates_each_table_1_model_once():
    chosen = {tuple(param.values[:3]) for param in _runs() if not _marked(param)}
    if not (ROOT / EVERYWHERE_SUITE / "report.json").is_file():
        pytest.skip(f"no committed results/{EVERYWHERE_SUITE} report")
    models = {(EVERYWHERE_SUITE, row["preset"], 0) for row in _report(EVERYWHERE_SUITE)["rows"]}
    assert {preset for _, preset, _ in models} == set(get_suite(EVERYWHERE_SUITE).rows)
    assert chosen == models | {run for run in EVERYWHERE if (ROOT / run[0] / "report.json").is_file()}


def _marked(param) -> bool:
    return any(mark.name == "needs_fast_bf16" for mark in param.marks)


@pytest.mark.parametrize("suite", ["mini", "mini-long", "paper-long"])
def test_results_stay_small(suite):
    if not (ROOT / suite).is_dir():
        pytest.skip(f"no committed results/{suite}")
    size = sum(p.stat().st_size for p in (ROOT / suite).rglob("*") if p.is_file())
    # mini-long holds 11 runs of 60 epochs (50.2 MB once 10 had finished, each with `best` and `last`
    # weights), and the first epochs of the pruned fine-tune (3.3 MB); unfinished runs keep their optimiser
    # state to resume elsewhere. The limit catches a
    # shipped periodic checkpoint or TensorBoard folder (1.4-6.5 MB each), not a run more.
    # paper-long: five width-400 models, final weights only, in bfloat16 (24-59 MB each)
    limit = {"mini": 40e6, "mini-long": 55e6, "paper-long": 170e6}[suite]
    assert size < limit, (f"results/{suite} holds {size / 1e6:.1f} MB; "
                          f"trim it (python tools/ship.py results/{suite} --finished-only)")


def test_the_clone_stays_lean():
    size = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    # 300 MB until locality-mini's two unfinished runs (about 12 MB: `last` with its optimiser state,
    # and `best`) and the mini report's locality figures came; a shipped periodic checkpoint or
    # TensorBoard folder of a whole study (tens of MB) still fails it
    assert size < 320e6, f"results/ holds {size / 1e6:.1f} MB, over the 320 MB a clone should carry"


def test_another_runs_weights_fail_the_sample_check(check_shipped_run, tmp_path):
    """The sample check tells a run's own weights from others': seed 1's checkpoint put in seed 0's
    folder keeps seed 0's record and recorded accuracy (those parts pass), and disagrees with the
    record on more of the sample than rounding flips (``SAMPLE_FLIPS``)."""
    suite = ROOT / EVERYWHERE_SUITE / "learned-mini"
    if not (suite / "seed1" / "checkpoints" / "last.safetensors").is_file():
        pytest.skip(f"no committed results/{EVERYWHERE_SUITE}/learned-mini/seed1")
    folder = tmp_path / "learned-mini" / "seed0"
    shutil.copytree(suite / "seed0", folder)
    shutil.copy2(suite / "seed1" / "checkpoints" / "last.safetensors", folder / "checkpoints" / "last.safetensors")
    accuracy = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["test_accuracy"]
    with pytest.raises(AssertionError, match="disagreements"):
        check_shipped_run(folder, accuracy)
