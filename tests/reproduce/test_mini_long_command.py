"""``attncnn reproduce mini-long`` on a tiny data set: the one-epoch smoke version of the suite, and
unfinished runs resumed on "another machine" (shipped ones: tests/tools/test_ship_tool.py)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from ship import main as ship

from attncnn.cli import main
from attncnn.reproduce import get_suite, plan
from attncnn.reproduce.running.runner import TrainOptions, train_jobs
from attncnn.training import TrainingInterrupted

pytestmark = pytest.mark.slow


def test_one_epoch_smoke_run_of_the_suite(make_tiny_data, tmp_path):
    data = make_tiny_data(40, 10, size=16)   # 3 classes: 120 train, 30 test images of 16x16
    out = tmp_path / "mini-long"
    # --no-compile: on a fresh machine the compile choice would compile each preset (tens of seconds on 2 cores)
    # to time runs of seconds; the choice has its own tests (tests/perf/test_compiling.py)
    assert main(["reproduce", "mini-long", "--data", str(data), "--out", str(out), "--epochs", "1", "--seeds", "0,1",
                 "--only", "quadratic-mini,resnet18-mini", "--no-progress", "--no-viewer",
                 "--no-compile"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [r["epoch"] for r in report["epoch_study"]["settled"]] == []        # epochs 6, 20, 40, 60: none yet
    costs = {(c["preset"], c["seed"]): c for c in report["epoch_study"]["costs"]}
    assert set(costs) == {("quadratic-mini", 0), ("quadratic-mini", 1), ("resnet18-mini", 0), ("resnet18-mini", 1)}
    assert all(c["epochs"] == 1 and c["machines"][0]["machine"]["cpu"] for c in costs.values())
    text = (out / "report.md").read_text()
    assert "## Settled on a grid? (epochs 6, 20, 40, 60)" in text and "## What each run cost" in text
    assert "## Table 1 beside the `mini` suite" in text
    names = {p.name for p in (out / "figures").iterdir()}
    assert names == {"fig2-accuracy.png", "fig3-quadratic-mini-layers-epochs.png",
                     "fig4-quadratic-mini-seed-0-centers.png", "fig4-quadratic-mini-seed-1-centers.png",
                     "grid-distance-seeds-quadratic-mini.png", "distances-quadratic-mini.png",
                     "locality-quadratic-mini.png"}
    # both seeds' locality, in the report's section and Table 1 (mean ± std over the two)
    assert [m["seed"] for m in report["locality"]["quadratic-mini"]] == [0, 1]
    assert "| quadratic-mini | 1 | none needed |" in text and report["rows"][0]["locality"]["std"] is not None
    record = json.loads((out / "quadratic-mini" / "seed0" / "metrics.jsonl").read_text().splitlines()[0])
    assert "attn/layer4/head9/center_col" in record and "machine" not in record      # machine.json says it
    # trimmed like the mini suite, but no periodic checkpoint: Fig. 3 comes from metrics.jsonl
    assert ship([str(out), "--finished-only", "--no-report"]) == 0
    kept = {p.relative_to(out / "quadratic-mini" / "seed0").as_posix()
            for p in (out / "quadratic-mini" / "seed0").rglob("*") if p.is_file()}
    assert kept == {"config.json", "metrics.jsonl", "finished.json", "machine.json", "checkpoints/last.safetensors"}
    # a later call for one model and one seed still reports every run of the suite's folder
    assert main(["reproduce", "mini-long", "--data", str(data), "--out", str(out), "--epochs", "1", "--seeds", "1",
                 "--only", "quadratic-mini", "--no-progress", "--no-viewer", "--report-only"]) == 0
    again = json.loads((out / "report.json").read_text())
    assert {(c["preset"], c["seed"]) for c in again["epoch_study"]["costs"]} == set(costs)


def _stop_after_first_epoch(model) -> dict:
    os.kill(os.getpid(), signal.SIGINT)                # as Ctrl-C: the epoch's checkpoint is saved, then it stops
    return {}


def _records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_the_report_says_how_far_an_unfinished_run_got(make_tiny_data, tmp_path):
    data = make_tiny_data(40, 10, size=16)
    suite = get_suite("mini-long")
    options = TrainOptions(data=str(data), epochs=2)
    finished, unfinished = plan(suite, tmp_path, only=("resnet18-mini",), seeds=(0, 1), epochs=2)
    train_jobs([finished], options, progress=False)
    with pytest.raises(TrainingInterrupted):
        train_jobs([unfinished], options, progress=False, epoch_metrics=_stop_after_first_epoch)
    assert main(["reproduce", "mini-long", "--data", str(data), "--epochs", "2", "--only", "resnet18-mini", "--seeds",
                 "0,1", "--out", str(tmp_path), "--no-progress", "--no-viewer", "--report-only"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert "resnet18-mini seed 1" in report["missing"] and list(report["unfinished"]) == ["resnet18-mini seed 1"]
    progress = report["unfinished"]["resnet18-mini seed 1"]
    record = _records(unfinished.folder)[0]
    assert progress["epochs_done"] == 1 and progress["epochs"] == 2
    assert progress["test_accuracy"] == record["test_accuracy"]
    machine = json.loads((unfinished.folder / "machine.json").read_text())["segments"][0]["machine"]
    assert machine["cpu"]                                              # machine.json's, as the report shows it
    assert progress["segments"] == [{"epochs": [1, 1], "machine": machine, "precision": record["precision"],
                                     "compiled": record["compiled"],
                                     "seconds_per_epoch": record["seconds"] + record["eval_seconds"]}]
    text = (tmp_path / "report.md").read_text()
    assert (f"resnet18-mini seed 1 (epoch 1 of 2, test acc. "
            f"{100 * record['test_accuracy']:.2f} %; ") in text and " (epoch 1): " in text
    # a model with no finished run says where its furthest run stands instead of "not run yet"
    assert "| quadratic-mini | not run yet |" in text
    quadratic = plan(suite, tmp_path, only=("quadratic-mini",), seeds=(0,), epochs=2)[0]
    with pytest.raises(TrainingInterrupted):
        train_jobs([quadratic], options, progress=False, epoch_metrics=_stop_after_first_epoch)
    assert main(["reproduce", "mini-long", "--data", str(data), "--epochs", "2", "--only", "resnet18-mini", "--seeds",
                 "0,1", "--out", str(tmp_path), "--no-progress", "--no-viewer", "--report-only"]) == 0
    assert "| quadratic-mini | unfinished (epoch 1 of 2) |" in (tmp_path / "report.md").read_text()


def test_a_run_started_on_a_gpu_resumes_on_this_cpu_with_a_path_chosen_here(make_tiny_data, tmp_path, caplog):
    # the GPU half is simulated: a quadratic run stopped after its first epoch is rewritten as an
    # older attncnn left it after a lent H100 (config.json "device": "cuda", the dense path in its model)
    data = make_tiny_data(40, 10, size=16)
    job = plan(get_suite("mini-long"), tmp_path, only=("quadratic-mini",), seeds=(0,), epochs=2)[0]
    with pytest.raises(TrainingInterrupted):
        train_jobs([job], TrainOptions(data=str(data), epochs=2), progress=False, epoch_metrics=_stop_after_first_epoch)
    config = json.loads((job.folder / "config.json").read_text())
    (job.folder / "config.json").write_text(json.dumps({**config, "device": "cuda", "model": {"impl": "dense"}}))
    records = _records(job.folder)
    records[0]["machine"] = {"cpu": "Host CPU", "threads": 1, "torch": "2.11.0", "device": "cuda", "gpu": "Some GPU"}
    (job.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    before = (job.folder / "config.json").read_text()
    assert main(["reproduce", "mini-long", "--data", str(data), "--epochs", "2", "--only", "quadratic-mini",
                 "--seeds", "0", "--out", str(tmp_path), "--no-progress", "--no-viewer"]) == 0
    assert (job.folder / "config.json").read_text() == before               # read one way, never rewritten
    resumed = json.loads((job.folder / "machine.json").read_text())["segments"][-1]
    assert resumed["device"] == "cpu" and resumed["epochs"] == [2, 2] and resumed["ended"] == "finished"
    assert set(resumed["attention_paths"]["train"]) <= {"dense", "separable", "folded"}     # chosen here
    assert [r["epoch"] for r in _records(job.folder)] == [1, 2] and (job.folder / "finished.json").is_file()


def test_an_unfinished_bf16_run_resumes_at_the_precision_asked_or_this_machines(make_tiny_data, tmp_path,
                                                                                 monkeypatch, capsys):
    from attncnn.perf import precision as run_precision

    data = make_tiny_data(40, 10, size=16)
    job = plan(get_suite("mini-long"), tmp_path, only=("resnet18-mini",), seeds=(0,), epochs=2)[0]
    with pytest.raises(TrainingInterrupted):
        train_jobs([job], TrainOptions(data=str(data), epochs=2, precision="bf16"), progress=False,
                   epoch_metrics=_stop_after_first_epoch)
    args = ["reproduce", "mini-long", "--data", str(data), "--epochs", "2", "--only", "resnet18-mini", "--seeds", "0",
            "--out", str(tmp_path), "--no-progress", "--no-viewer"]
    dry = [*args, "--dry-run", "--batch-size", "10"]          # one timed step each, at what will run
    for fast, given, expected in ((False, [], "fp32"), (True, [], "bf16"), (True, ["--precision", "fp32"], "fp32")):
        monkeypatch.setattr(run_precision, "fast_bf16", lambda device, fast=fast: fast)
        capsys.readouterr()
        assert main([*dry, *given]) == 0
        out = capsys.readouterr().out
        assert f" h ({expected};" in out, (fast, given)
        assert f"resumed with: attncnn train --resume {job.folder}{' --precision fp32' if given else ''}\n" in out
    assert main([*args, "--precision", "fp32"]) == 0           # obeyed on a CPU with bf16 units
    assert [(r["epoch"], r["precision"]) for r in _records(job.folder)] == [(1, "bf16"), (2, "fp32")]
    segments = json.loads((job.folder / "machine.json").read_text())["segments"]
    assert [(s["epochs"], s["precision"]) for s in segments] == [([1, 1], "bf16"), ([2, 2], "fp32")]
    text = (tmp_path / "report.md").read_text()
    assert ", bf16 (epoch 1); " in text and ", fp32 (epoch 2)" in text


def test_an_unfinished_eager_run_resumes_compiled_when_asked(make_tiny_data, tmp_path, monkeypatch, capsys):
    import torch

    data = make_tiny_data(40, 10, size=16)
    job = plan(get_suite("mini-long"), tmp_path, only=("resnet18-mini",), seeds=(0,), epochs=2)[0]
    with pytest.raises(TrainingInterrupted):
        train_jobs([job], TrainOptions(data=str(data), epochs=2, precision="fp32", compile=False), progress=False,
                   epoch_metrics=_stop_after_first_epoch)
    compiled = []          # the loop's torch.compile, recorded (inductor's compilation is tested elsewhere)
    monkeypatch.setattr(torch, "compile", lambda net, **options: compiled.append(options) or net)
    args = ["reproduce", "mini-long", "--data", str(data), "--epochs", "2", "--only", "resnet18-mini", "--seeds", "0",
            "--out", str(tmp_path), "--no-progress", "--no-viewer", "--compile"]
    assert main([*args, "--dry-run", "--batch-size", "10"]) == 0
    assert f"resumed with: attncnn train --resume {job.folder} --compile\n" in capsys.readouterr().out
    assert main(args) == 0
    assert compiled == [{"dynamic": False, "mode": "default"}]
    assert [(r["epoch"], r["compiled"]) for r in _records(job.folder)] == [(1, False), (2, True)]
    assert "compile" not in json.loads((job.folder / "config.json").read_text())          # the recipe only
    assert [s["compiled"] for s in json.loads((job.folder / "machine.json").read_text())["segments"]] == [False, True]
