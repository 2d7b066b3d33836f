"""The command line end to end on a tiny image-folder dataset written by the test."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attncnn.cli import build_parser, main
from attncnn.runs import load_checkpoint

CLASSES = ("cat", "dog", "frog")


@pytest.fixture(scope="module")
def tiny_dataset(make_tiny_data) -> Path:
    """3 classes, 20 train + 6 test PNGs each (tests/conftest.py)."""
    return make_tiny_data(20, 6)


def _train(tmp_path, data, *extra, out="run"):
    return main(["train", "--preset", "demo", "--data", str(data), "--epochs", "2", "--batch-size", "10",
                 "--out", str(tmp_path / out), "--no-progress", "--checkpoint-every", "1", *extra])


@pytest.fixture(scope="module")
def demo_run(tiny_dataset, tmp_path_factory) -> tuple[Path, str]:
    """One ``_train`` run on the tiny data set, trained once for the tests that read it or resume a
    copy of it (:func:`_copy`), and what it printed. Training is deterministic on one machine, so a
    fresh ``_train`` of the same arguments would give the same folder bit for bit."""
    root = tmp_path_factory.mktemp("demo-run")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert _train(root, tiny_dataset) == 0
    return root / "run", printed.getvalue()


def _copy(demo_run, tmp_path, name="run") -> Path:
    """A copy of the shared run, for a test that changes the folder (a resume, a roll-back)."""
    return Path(shutil.copytree(demo_run[0], tmp_path / name))


def test_train_writes_a_complete_run_folder(demo_run):
    run, out = demo_run
    assert "test accuracy:" in out
    config = json.loads((run / "config.json").read_text())
    assert config["preset"] == "demo" and config["epochs"] == 2 and config["batch_size"] == 10
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2]
    for key in ("lr", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "seconds", "images_per_second"):
        assert all(key in r for r in lines), key
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in lines)
    ckpts = {p.name for p in (run / "checkpoints").iterdir()}
    assert {"best.safetensors", "last.safetensors", "epoch_0001.safetensors", "epoch_0002.safetensors"} <= ckpts
    assert any((run / "tb").iterdir())          # TensorBoard events
    assert (run / "finished.json").exists()
    last = load_checkpoint(run / "checkpoints" / "last.safetensors")
    assert last.metadata["epoch"] == 2 and last.metadata["classes"] == list(CLASSES)


def test_evaluate_reproduces_the_logged_accuracy(demo_run, capsys):
    run = demo_run[0]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert main(["evaluate", str(run / "checkpoints" / "last.safetensors"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["examples"] == 18
    assert result["test_accuracy"] == pytest.approx(lines[-1]["test_accuracy"])
    assert result["test_loss"] == pytest.approx(lines[-1]["test_loss"], rel=1e-5)


def test_evaluate_records_each_images_prediction_and_evaluates_a_fixed_balanced_sample(tmp_path, tiny_dataset,
                                                                                     demo_run, capsys):
    from attncnn.data import DeviceLoader, load_dataset
    from attncnn.layers.autocast_rules import autocast
    from attncnn.runs import disagreements, load_model, read_predictions
    run = demo_run[0]
    assert main(["evaluate", str(run), "--predictions", str(tmp_path / "all.json"), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out.splitlines()[-1])
    record = read_predictions(tmp_path / "all.json")
    # the plain computation: the model's arg-max on every test image, in the split's order (one
    # batch of them at the precision evaluate chose, as evaluate computes it)
    test = load_dataset(str(tiny_dataset)).test
    model, _ = load_model(run)
    with torch.no_grad(), autocast(record.precision, torch.device("cpu")):
        plain = torch.cat([model.eval()(x).argmax(-1) for x, _ in DeviceLoader(test, batch_size=500, train=False)])
    assert record.predictions == plain.tolist() and record.indices is None
    assert record.test_accuracy == whole["test_accuracy"] == (plain == test.labels).double().mean().item()
    assert (record.checkpoint, record.epoch, record.precision) == ("last.safetensors", 2, whole["precision"])
    written = (tmp_path / "all.json").read_text()
    assert str(tiny_dataset) not in written and str(run) not in written     # names the data set, not its path
    from attncnn.perf import cpu_name
    assert record.device == f"cpu: {cpu_name()}"
    # a record written before the device was kept reads as one of an unknown device
    old = json.loads((tmp_path / "all.json").read_text())
    del old["device"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert read_predictions(tmp_path / "old.json") == dataclasses.replace(record, device=None)

    for _ in range(2):                           # the same images each time: 2 of each of the 3 classes
        assert main(["evaluate", str(run), "--sample", "6", "--predictions", str(tmp_path / "s.json")]) == 0
        assert "6 sampled images" in capsys.readouterr().out
        sample = read_predictions(tmp_path / "s.json")
        assert sorted(test.labels[sample.indices].tolist()) == [0, 0, 1, 1, 2, 2]
        assert sample.indices == sorted(set(sample.indices))
        assert disagreements(sample.predictions, record.for_images(sample.indices)) == 0
    with pytest.raises(ValueError, match="whole split"):
        sample.for_images([i for i in range(18) if i not in sample.indices][:1])
    with pytest.raises(ValueError, match="not the same images"):
        disagreements([0, 1], [0])
    assert main(["evaluate", str(run), "--sample", "19"]) == 2
    assert "--sample must be between 1 and 18" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"checkpoint": "last.safetensors"}')
    with pytest.raises(ValueError, match="record it again"):
        read_predictions(tmp_path / "bad.json")


def test_existing_run_folder_is_refused_unless_overwrite(tmp_path, tiny_dataset, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    assert _train(tmp_path, tiny_dataset) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err
    assert _train(tmp_path, tiny_dataset, "--overwrite") == 0


def test_resume_continues_to_the_same_weights(tmp_path, demo_run):
    """A run cut after epoch 1 and resumed ends with the same weights as an uninterrupted run."""
    full, cut = demo_run[0], _copy(demo_run, tmp_path, "cut")
    # Roll the folder back to its state after epoch 1.
    (cut / "finished.json").unlink()
    (cut / "checkpoints" / "epoch_0001.safetensors").replace(cut / "checkpoints" / "last.safetensors")
    (cut / "checkpoints" / "epoch_0002.safetensors").unlink()
    # metrics.jsonl keeps its epoch-2 line, as after a crash between logging and checkpointing:
    # the resume must drop it rather than log epoch 2 twice.
    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0
    uninterrupted = load_checkpoint(full / "checkpoints" / "last.safetensors").model_state
    resumed = load_checkpoint(cut / "checkpoints" / "last.safetensors").model_state
    assert uninterrupted.keys() == resumed.keys()
    for name in uninterrupted:
        assert torch.equal(uninterrupted[name], resumed[name]), name
    epochs = [json.loads(line)["epoch"] for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]


def test_train_needs_a_preset(tmp_path, capsys, monkeypatch):
    # it used to train the 12 M-parameter quadratic model when --preset was left out
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", str(tmp_path / "nowhere")]) == 2
    assert "--preset is required: e.g. --preset demo" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


SUBCOMMANDS = ("train", "evaluate", "presets", "plot", "inspect", "report", "prune", "viewer", "theorem", "bench",
               "reproduce", "download")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_states_every_default(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    formatter = sub._get_formatter()
    missing = []
    for action in sub._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        has_default = action.default not in (None, False, argparse.SUPPRESS)
        if command == "train" and action.default is argparse.SUPPRESS:       # TrainConfig's flags
            has_default = True
        if has_default and "default" not in text.lower() and "required" not in text:
            missing.append(action.option_strings[0])
    assert not missing


def test_presets_json_prints_exact_counts(capsys):
    assert main(["presets", "--json"]) == 0
    presets = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    rows = {name: r["parameters"] for name, r in presets.items()}
    assert rows["quadratic"] == 12_086_844 and rows["learned-content"] == 29_484_282
    assert rows["resnet18"] == 11_173_962
    assert presets["demo"]["recipe"]["epochs"] == 5 and presets["quadratic"]["model"] == {"attention": "quadratic"}


def test_presets_table_keeps_its_columns_for_the_longest_name(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # every count ends where the header's "parameters" ends, long names (quadratic-generalized-mini) included
    end = lines[0].index("parameters") + len("parameters")
    assert len(lines) > 10 and all(line[:end].rstrip()[-1].isdigit() and line[end] == " " for line in lines[1:])


@pytest.mark.parametrize("argv,match", [
    (["train", "--preset", "gaussian"], "choose one of resnet18"),
    (["train", "--preset", "demo", "--epochs", "0"], "epochs must be a positive integer"),
    (["train", "--preset", "demo", "--epochs", "-3"], "epochs must be a positive integer, got -3"),
    (["train", "--preset", "demo", "--epochs", "1" + "0" * 400], "epochs must be at most 1,000,000,000,000 (10**12), "
                                                                  "got a number of 401 digits (--epochs)"),
    (["train", "--preset", "demo", "--batch-size", "0"], "batch_size must be a positive integer"),
    (["train", "--preset", "demo", "--checkpoint-every-steps", "-1"], "checkpoint_every_steps must be >= 0"),
    (["train", "--preset", "demo", "--weight-decay", "nan"], "weight_decay must be a finite number >= 0, got nan"),
    (["train", "--preset", "demo", "--lr", "-0.1"], "lr must be a finite number >= 0, got -0.1 (--lr)"),
    (["train", "--preset", "demo", "--momentum", "1"], "momentum must be in [0, 1), got 1.0 (--momentum)"),
    (["train", "--preset", "demo", "--gamma", "inf"], "gamma must be a finite number > 0, got inf (--gamma)"),
    (["train", "--preset", "demo", "--milestones", "-5"], "milestones must be epochs >= 1, got [-5]"),
    (["train", "--preset", "demo", "--init-from", "/nonexistent/base.safetensors"],
     "--init-from: no checkpoint at /nonexistent/base.safetensors"),
    (["train", "--preset", "demo", "--set", "heads=3"], "unknown model option 'heads'"),
    (["train", "--preset", "demo", "--set", "num_heads=four"], "'num_heads' must be"),
    (["train", "--preset", "quadratic-generalized-mini", "--impl", "separable"],
     "quadratic-generalized attention has no impl 'separable'; choose one of auto, dense, folded"),
    (["train", "--preset", "gpsa-mini", "--impl", "dense"], "gpsa attention has no impl 'dense'"),
    (["train", "--preset", "gpsa-mini", "--set", "impl=dense"], "--set impl=dense names how a machine runs the "
                                                                 "model, not the recipe; pass --impl dense instead"),
    (["evaluate", "/nonexistent/run"], "no checkpoint"),
])
def test_bad_arguments_give_one_clear_line(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_missing_official_data_names_places_and_download_flag(tmp_path, capsys):
    code = main(["train", "--preset", "demo", "--data", "cifar10", "--data-dir", str(tmp_path / "empty"),
                 "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--download" in err and str(tmp_path / "empty") in err
    assert not (tmp_path / "run" / "finished.json").exists()


def test_batch_larger_than_dataset_is_refused(tmp_path, tiny_dataset, capsys):
    assert main(["train", "--preset", "demo", "--data", str(tiny_dataset), "--batch-size", "1000",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "lower --batch-size" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_on_a_subset_of_real_cifar10(tmp_path, cifar10_path, data_cache_dir, capsys):
    """The main job's command end to end on real images: 2 epochs on 1,000 training images, then the
    full 10,000-image test set once (``--eval-every 2``: the last epoch is always evaluated); accuracy
    well above chance (10 %)."""
    code = main(["train", "--preset", "demo", "--data", str(cifar10_path), "--data-dir", str(data_cache_dir),
                 "--train-subset", "1000", "--epochs", "2", "--eval-every", "2", "--out", str(tmp_path / "run"),
                 "--no-progress"])
    assert code == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines if "test_accuracy" in line] == [2]
    assert lines[-1]["test_accuracy"] > 0.2
    assert "test accuracy:" in capsys.readouterr().out


# -- interruptions, in real processes ------------------------------------------------------------
# Each run is a subprocess ``python -m attncnn train`` pinned to one thread (so that the runs are
# bit-comparable); 2 epochs of 30 batches of 2 images, 'last' refreshed every 4 steps.

def _cli(*args: str, out: Path, data: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "attncnn", "train", "--preset", "demo", "--data", str(data), "--data-dir",
            str(cache), "--epochs", "2", "--batch-size", "2", "--set", "dim=16", "--set", "mlp_dim=16",
            "--device", "cpu", "--deterministic", "--checkpoint-every-steps", "4", "--checkpoint-every", "0",
            "--no-progress", "--out", str(out), *args]


def _env(cache: Path) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ATTNCNN_DATA_DIR": str(cache)}


def _last_position(run: Path) -> tuple[int, int] | None:
    """(epoch, step_in_epoch) of the run's 'last' checkpoint, read from its header only."""
    from safetensors import safe_open
    try:
        with safe_open(str(run / "checkpoints" / "last.safetensors"), "pt") as f:
            meta = json.loads(f.metadata()["attncnn"])
    except Exception:   # not written yet, or being replaced right now
        return None
    return meta["epoch"], meta["step_in_epoch"]


def _wait_until_mid_epoch(proc: subprocess.Popen, run: Path, epoch: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended (status {proc.returncode}) before a mid-epoch checkpoint: "
                        f"{proc.communicate()[1]}")
        position = _last_position(run)
        if position is not None and position[0] == epoch and position[1] > 0:
            return
        time.sleep(0.002)
    proc.kill()
    pytest.fail("no mid-epoch checkpoint appeared in time")


def _assert_same_run(a: Path, b: Path) -> None:
    from safetensors.torch import load_file
    ta, tb = (load_file(str(r / "checkpoints" / "last.safetensors")) for r in (a, b))
    assert ta.keys() == tb.keys()
    for name in ta:                                    # weights, optimiser state and RNG states
        assert torch.equal(ta[name], tb[name]), name
    timing = {"seconds", "images_per_second", "eval_seconds"}
    ma, mb = ([{k: v for k, v in json.loads(line).items() if k not in timing}
               for line in (r / "metrics.jsonl").read_text().splitlines()] for r in (a, b))
    assert ma == mb and [r["epoch"] for r in ma] == [1, 2]


@pytest.fixture(scope="module")
def reference_process_run(tiny_dataset, tmp_path_factory):
    """Start the uninterrupted reference run in the background; yields a function that waits for it."""
    root = tmp_path_factory.mktemp("reference")
    cache = root / "cache"
    proc = subprocess.Popen(_cli(out=root / "run", data=tiny_dataset, cache=cache), env=_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finished() -> Path:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        return root / "run"

    yield finished
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_is_bit_identical(tmp_path, tiny_dataset, reference_process_run):
    run, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(_cli(out=run, data=tiny_dataset, cache=cache), env=_env(cache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_mid_epoch(proc, run, epoch=1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    epoch, step = _last_position(run)
    assert epoch == 1 and 0 < step < 30, (epoch, step)     # killed in the middle of epoch 2
    assert not (run / "finished.json").exists()

    resumed = subprocess.run([sys.executable, "-m", "attncnn", "train", "--resume", str(run), "--no-progress"],
                             env=_env(cache), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"epoch 2 after step {step}" in resumed.stderr     # logs go to stderr
    _assert_same_run(reference_process_run(), run)
    segments = json.loads((run / "machine.json").read_text())["segments"]     # the killed one closed by the resume
    assert [(s["epochs"], s["start"], s["ended"]) for s in segments] == [
        ([1, 1], {"epoch": 0, "step": 0}, "crashed"), ([2, 2], {"epoch": 1, "step": step}, "finished")]


@pytest.mark.slow
def test_sigint_saves_prints_the_resume_command_and_exits_130(tmp_path, tiny_dataset, reference_process_run):
    run, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(_cli(out=run, data=tiny_dataset, cache=cache), env=_env(cache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_mid_epoch(proc, run, epoch=1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert f"Resume with: attncnn train --resume {run}" in err and "interrupted by SIGINT" in err
    assert "Traceback" not in err
    assert _last_position(run)[0] == 1

    resumed = subprocess.run([sys.executable, "-m", "attncnn", "train", "--resume", str(run), "--no-progress"],
                             env=_env(cache), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    _assert_same_run(reference_process_run(), run)


def test_resume_refuses_options_it_would_ignore(tmp_path, demo_run, capsys):
    run = _copy(demo_run, tmp_path)
    assert main(["train", "--resume", str(run), "--epochs", "5", "--lr", "0.5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--epochs" in err and "--lr" in err and "stored recipe (config.json)" in err


def test_resume_takes_the_device_of_this_machine(tmp_path, demo_run, capsys):
    # an older run started on a GPU stored "device": "cuda" in its config.json: a resume runs where
    # this command says (auto: this machine's), and config.json stays as it was
    run = _copy(demo_run, tmp_path)
    config = {**json.loads((run / "config.json").read_text()), "device": "cuda"}
    (run / "config.json").write_text(json.dumps(config))
    for name in ("finished.json", "checkpoints/last.safetensors", "checkpoints/epoch_0002.safetensors"):
        (run / name).unlink()                        # as if stopped after epoch 1 (epoch_0001 stays)
    if not torch.cuda.is_available():
        assert main(["train", "--resume", str(run), "--device", "cuda", "--no-progress"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text()) == config
    segments = json.loads((run / "machine.json").read_text())["segments"]
    assert [(s["epochs"], s["device"], s["ended"]) for s in segments] == [
        ([1, 2], "cpu" if not torch.cuda.is_available() else "cuda", "finished"),
        ([2, 2], "cpu" if not torch.cuda.is_available() else "cuda", "finished")]
    assert (run / "finished.json").is_file()


def test_a_run_shipped_with_its_data_sets_name_resumes_where_data_points(tmp_path, make_tiny_data, capsys):
    # a copy under a name found nowhere above the run (a shared run's file name is looked for there)
    tiny_dataset = tmp_path / "elsewhere" / "shipped-tiny"
    shutil.copytree(make_tiny_data(20, 6), tiny_dataset)
    assert _train(tmp_path, tiny_dataset) == 0
    run = tmp_path / "run"
    for name in ("finished.json", "checkpoints/last.safetensors", "checkpoints/epoch_0002.safetensors"):
        (run / name).unlink()                        # as if stopped after epoch 1 (epoch_0001 stays)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "data": tiny_dataset.name}))   # as shipped: a name
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert f"trained on {tiny_dataset.name}, which is not here" in capsys.readouterr().err   # names the fix: --data
    for other in ("other.zip", tiny_dataset.name.upper()):          # another file, or the name in another case
        assert main(["train", "--resume", str(run), "--data", str(tmp_path / other), "--no-progress"]) == 2
        assert "can only say where that data set is on this machine" in capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["data"] == tiny_dataset.name    # refusals wrote nothing
    assert main(["train", "--resume", str(run), "--data", str(tiny_dataset), "--no-progress"]) == 0
    assert (run / "finished.json").is_file()
    assert json.loads((run / "config.json").read_text())["data"] == str(tiny_dataset.resolve())
    assert [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2]


def _as_cpu_with_bf16_units(monkeypatch, fast: bool) -> None:
    from attncnn.perf import precision as run_precision

    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: fast)


@pytest.mark.slow      # bf16 test passes on a CPU without bf16 units: about 40 s
def test_evaluate_runs_a_bf16_run_in_fp32_where_bf16_is_slow_unless_told(tmp_path, tiny_dataset, capsys,
                                                                          monkeypatch):
    assert _train(tmp_path, tiny_dataset, "--precision", "bf16") == 0
    run = tmp_path / "run"
    slow = "the run's machine.json says bf16; fp32 here, where bf16 is slow (--precision bf16 keeps it)"
    cases = ((False, [], "fp32", slow), (False, ["--precision", "bf16"], "bf16", "--precision"),
             (True, [], "bf16", "the run's machine.json"), (True, ["--precision", "fp32"], "fp32", "--precision"),
             (True, ["--precision", "auto"], "bf16", "--precision auto: the device's choice"))
    for fast, given, expected, source in cases:
        _as_cpu_with_bf16_units(monkeypatch, fast)
        capsys.readouterr()
        assert main(["evaluate", str(run), "--json", *given]) == 0
        result = json.loads(capsys.readouterr().out)
        assert (result["precision"], result["precision_from"]) == (expected, source), (fast, given)
    # a checkpoint copied out of its run folder: how the run trained is not known, and the result says so
    copy = tmp_path / "elsewhere" / "model.safetensors"
    copy.parent.mkdir()
    shutil.copyfile(run / "checkpoints" / "last.safetensors", copy)
    outside = "no run folder: fp32 (give --precision bf16 for a run that trained in bf16)"
    assert main(["evaluate", str(copy), "--predictions", str(tmp_path / "p.json")]) == 0
    assert f"\nprecision: fp32 ({outside})\n" in capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text())["precision_from"] == outside
    assert main(["evaluate", str(copy), "--json", "--precision", "bf16"]) == 0
    assert json.loads(capsys.readouterr().out)["precision_from"] == "--precision"


def test_resume_takes_the_precision_of_this_machine(tmp_path, tiny_dataset, capsys, monkeypatch):
    # a bf16 run stopped after epoch 1 continues in fp32 when told, and records which epochs ran how
    assert _train(tmp_path, tiny_dataset, "--precision", "bf16") == 0
    run = tmp_path / "run"
    for name in ("finished.json", "checkpoints/last.safetensors", "checkpoints/epoch_0002.safetensors"):
        (run / name).unlink()
    _as_cpu_with_bf16_units(monkeypatch, True)
    assert main(["train", "--resume", str(run), "--precision", "fp32", "--no-progress"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["precision"]) for r in records] == [(1, "bf16"), (2, "fp32")]
    assert "precision" not in json.loads((run / "config.json").read_text())
    assert [s["precision"] for s in json.loads((run / "machine.json").read_text())["segments"]] == ["bf16", "fp32"]
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "3", "--no-progress"]) == 2
    assert "only the run-time options can" in capsys.readouterr().err


@pytest.mark.parametrize("device", [None, "cpu"])
def test_resume_compiles_when_asked_and_says_so_in_each_epoch_record(device, tmp_path, tiny_dataset, monkeypatch):
    import torch

    assert _train(tmp_path, tiny_dataset, "--precision", "fp32", "--no-compile") == 0
    run = tmp_path / "run"
    for name in ("finished.json", "checkpoints/last.safetensors", "checkpoints/epoch_0002.safetensors"):
        (run / name).unlink()
    compiled = []          # the loop's torch.compile, recorded (inductor's compilation is tested elsewhere)
    monkeypatch.setattr(torch, "compile", lambda net, **options: compiled.append(options) or net)
    assert main(["train", "--resume", str(run), "--compile", "--no-progress"]
                + (["--device", device] if device else [])) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["compiled"]) for r in records] == [(1, False), (2, True)] and len(compiled) == 1
    config = json.loads((run / "config.json").read_text())
    assert "compile" not in config and "device" not in config                          # the recipe only
    assert [s["compiled"] for s in json.loads((run / "machine.json").read_text())["segments"]] == [False, True]


def test_init_from_starts_from_the_checkpoint_weights(tmp_path, tiny_dataset, demo_run):
    """0 epochs are not allowed, so fine-tune with lr 0: the weights must come through unchanged."""
    base = demo_run[0] / "checkpoints" / "last.safetensors"
    assert _train(tmp_path, tiny_dataset, "--init-from", str(base), "--lr", "0", "--weight-decay", "0",
                  "--epochs", "1", out="tuned") == 0
    before = load_checkpoint(base).model_state
    after = load_checkpoint(tmp_path / "tuned" / "checkpoints" / "last.safetensors").model_state
    assert all(torch.equal(before[k], after[k]) for k in before)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["init_from"] == str(base)
    # a run folder means its last checkpoint, as for every other command, and config.json names the file
    assert _train(tmp_path, tiny_dataset, "--init-from", str(demo_run[0]), "--lr", "0", "--weight-decay", "0",
                  "--epochs", "1", out="tuned-from-folder") == 0
    assert json.loads((tmp_path / "tuned-from-folder" / "config.json").read_text())["init_from"] == str(base)


def test_resume_before_the_first_checkpoint_starts_again_from_init_from(tmp_path, tiny_dataset, demo_run):
    """A fine-tuning run stopped before it wrote a checkpoint restarts from --init-from, not from
    fresh random weights."""
    base = demo_run[0] / "checkpoints" / "last.safetensors"
    assert _train(tmp_path, tiny_dataset, "--init-from", str(base), "--lr", "0", "--weight-decay", "0",
                  "--epochs", "1", out="tuned") == 0
    tuned = tmp_path / "tuned"
    for name in ("checkpoints", "metrics.jsonl", "summary.json"):      # as if stopped at step 0
        path = tuned / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    assert main(["train", "--resume", str(tuned), "--no-progress"]) == 0
    before = load_checkpoint(base).model_state
    after = load_checkpoint(tuned / "checkpoints" / "last.safetensors").model_state
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_init_from_a_different_model_is_refused_before_the_run_folder(tmp_path, tiny_dataset, demo_run, capsys):
    base = demo_run[0] / "checkpoints" / "last.safetensors"
    assert _train(tmp_path, tiny_dataset, "--init-from", str(base), "--set", "num_heads=2", out="other") == 2
    err = capsys.readouterr().err
    assert "--init-from" in err and "same --preset" in err
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_a_second_train_on_a_live_run_is_refused_and_a_killed_runs_lock_is_not_stale(tmp_path, tiny_dataset,
                                                                                      capsys):
    from attncnn.runs import RunFolder

    run, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(_cli("--epochs", "50", out=run, data=tiny_dataset, cache=cache), env=_env(cache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_mid_epoch(proc, run, epoch=0)
        for argv in (["--resume", str(run)], ["--out", str(run), "--overwrite", "--preset", "demo"]):
            assert main(["train", *argv, "--no-progress"]) == 2
            err = capsys.readouterr().err
            assert f"run folder {run} is in use: attncnn pid {proc.pid} on host" in err and err.count("\n") == 1
        assert proc.poll() is None and (run / "config.json").is_file()      # the live run is untouched
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    with RunFolder(run, mode="resume") as folder:                           # the kernel dropped the lock
        assert (folder.path / ".lock").read_text().startswith(f"attncnn pid {os.getpid()} ")


def test_a_log_file_gets_plain_lines_not_progress_bar_frames(tmp_path, tiny_dataset):
    log = tmp_path / "train.log"
    with open(log, "w") as stderr:                       # a file, as under nohup or a scheduler
        done = subprocess.run([sys.executable, "-m", "attncnn", "train", "--preset", "demo", "--data",
                               str(tiny_dataset), "--epochs", "2", "--batch-size", "10",
                               "--out", str(tmp_path / "run")],
                              stderr=stderr, stdout=subprocess.DEVNULL, env=_env(tmp_path / "cache"), timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "batch/s" not in text
    assert [line.split()[1] for line in text.splitlines() if line.startswith("epoch ")] == ["1/2", "2/2"]


@pytest.mark.parametrize("measure", [[], ["--impl", "measure", "--no-compile"]], ids=["ruled", "measured"])
def test_a_learned_position_embedding_is_built_for_the_training_images_unless_its_size_is_given(
        tmp_path, make_tiny_data, capsys, caplog, measure):
    # deit-mini's absolute position embedding is the preset's for 32x32 images; a new run on 16x16
    # images builds it for them and records the size. A size given that the images do not have is
    # refused before the run folder exists, by the plan's check where it measures (not as a
    # "compile failed" warning) or else by the trainer's
    data = make_tiny_data(4, 2, size=16)
    common = ["train", "--preset", "deit-mini", "--data", str(data), "--batch-size", "6", "--epochs", "1",
              "--device", "cpu", "--no-progress", *measure]
    with caplog.at_level("INFO", logger="attncnn.training.components"):
        assert main([*common, "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["image_size"] == 16
    assert "preset deit-mini: its learned position embedding is built for the 16x16 training images" in caplog.text
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.safetensors").model_state[
        "pos_embed"].shape == (1, 8, 8, 72)
    capsys.readouterr()
    # a trained network is refused images of another size by evaluate, as by the Python API (any
    # network: relative encodings take them, but what they learned is for the training size)
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(make_tiny_data(4, 2))]) == 2
    assert (f"{tmp_path / 'run' / 'checkpoints' / 'last.safetensors'} was trained on 16x16 images (height x width), "
            "but the test images of ") in capsys.readouterr().err
    assert main([*common, "--set", "image_size=32", "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert ("preset deit-mini with model options {'image_size': 32} cannot take 3x16x16 images: this model's learned "
            "position embedding is for 32x32 images, got 16x16; build the model for them (model option "
            "image_size=16; --set image_size=16") in err
    assert "compile failed" not in err
    assert not (tmp_path / "refused").exists()
