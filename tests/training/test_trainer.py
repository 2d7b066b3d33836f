"""The training loop under interruptions and failures: signals, mid-epoch resume, NaN losses,
full disks, and checkpoints whose stored configuration does not fit (all in-process, a few seconds)."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import shlex
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from attncnn.models import build_model
from attncnn.perf import measure
from attncnn.perf import make_plan, resume_plan
from attncnn.runs import RunFolderError, load_checkpoint, load_model, resolve_config, save_checkpoint
from attncnn.runs.config import MACHINE_FIELDS
from attncnn.runs.machine_file import MACHINE_FILE
from attncnn.training import (LRSchedule, NonFiniteLossError, RunOptions, TrainingError, TrainingInterrupted, saver,
                              state, train)
from attncnn.training import step as step_module

CLASSES = ("cat", "dog", "frog")
STEPS = 6          # 60 training images / batch 10
TIMING_KEYS = {"seconds", "images_per_second", "eval_seconds"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(data folder, decoded-data cache): 3 classes, 20 train + 6 test PNGs each."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 6)):
        for c, name in enumerate(CLASSES):
            folder = root / "data" / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 120, size=(32, 32, 3), dtype=np.uint8)
                img[..., c] += 120
                Image.fromarray(img).save(folder / f"{i:03d}.png")
    return root / "data", root / "cache"


_RUN_TIME = {f.name for f in dataclasses.fields(RunOptions)}


def _config(tiny, **overrides):
    """The recipe of the tests' runs, with ``overrides``."""
    values = dict(data=str(tiny[0]), epochs=2, batch_size=10, checkpoint_every=1, model={"dim": 16, "mlp_dim": 16})
    values.update(overrides)
    return resolve_config("demo", **values)


def _options(tiny, **overrides) -> RunOptions:
    """The tests' run-time options: the CPU, fp32, deterministic, the tiny data's cache; ``overrides`` on top."""
    return RunOptions(**{"data_dir": str(tiny[1]), "device": "cpu", "deterministic": True, "precision": "fp32",
                         **overrides})


def _train(tiny, out: Path, **overrides) -> dict:
    """A fresh run into ``out`` of ``_config`` and ``_options`` with ``overrides`` (recipe options
    and run-time ones, by name), its plan made as the CLI makes it."""
    config = _config(tiny, **{k: v for k, v in overrides.items() if k not in _RUN_TIME})
    options = _options(tiny, **{k: v for k, v in overrides.items() if k in _RUN_TIME})
    return train(config, out, make_plan(config, options), progress=False)


def _segments(run: Path) -> list[dict]:
    return json.loads((run / MACHINE_FILE).read_text())["segments"]


def _last(run: Path) -> Path:
    return run / "checkpoints" / "last.safetensors"


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_files(a: Path, b: Path) -> None:
    """Every tensor (weights, optimiser state, RNG states) bit-identical."""
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def assert_same_metrics(a: Path, b: Path) -> None:
    ma, mb = _metrics(a), _metrics(b)
    assert [r["epoch"] for r in ma] == [r["epoch"] for r in mb]
    for ra, rb in zip(ma, mb):
        assert {k: v for k, v in ra.items() if k not in TIMING_KEYS} == \
               {k: v for k, v in rb.items() if k not in TIMING_KEYS}


@pytest.fixture(scope="module")
def reference_run(tiny, tmp_path_factory) -> Path:
    """An uninterrupted 2-epoch run (the bit-identity reference)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    _train(tiny, out)
    return out


def _signal_at(monkeypatch, epoch: int, step: int, signum: int) -> None:
    """Send ``signum`` to this process while batch ``step`` of ``epoch`` (0-based) is being trained."""
    real = LRSchedule.set_lr

    def set_lr(self, optimizer, e, s):
        if (e, s) == (epoch, step):
            os.kill(os.getpid(), signum)
        return real(self, optimizer, e, s)

    monkeypatch.setattr(LRSchedule, "set_lr", set_lr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_step_saves_and_resumes_bit_identically(tiny, reference_run, tmp_path, monkeypatch,
                                                                    signum):
    before = signal.getsignal(signum)
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_at(m, epoch=1, step=2, signum=signum)
        with pytest.raises(TrainingInterrupted) as info:
            _train(tiny, out)
    err = info.value
    assert err.exit_status == 128 + signum
    assert f"attncnn train --resume {out}" in str(err) and "epoch 2/2, step 3 of 6" in str(err)
    assert signal.getsignal(signum) is before                 # handlers restored
    ckpt = load_checkpoint(_last(out))
    assert (ckpt.metadata["epoch"], ckpt.metadata["step_in_epoch"]) == (1, 3)   # the current step was finished
    assert not (out / "finished.json").exists()
    assert [r["epoch"] for r in _metrics(out)] == [1]

    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert_same_files(_last(reference_run), _last(out))
    assert_same_metrics(reference_run, out)                  # the split epoch's metrics line too
    assert (out / "finished.json").exists()


def test_the_resume_command_repeats_the_run_time_flags_given(tiny, tmp_path, monkeypatch):
    """config.json holds no run-time option: the printed command repeats those the run was given,
    and a resume's own are the ones its command gives (compile among them)."""
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_at(m, epoch=0, step=2, signum=signal.SIGINT)
        with pytest.raises(TrainingInterrupted) as first:
            _train(tiny, out, compile=False)
    flags = _options(tiny, compile=False).flags()
    assert "--no-compile" in flags and "--deterministic" in flags and "--device" in flags
    assert str(first.value).endswith(f"Resume with: {shlex.join(['attncnn', 'train', '--resume', str(out), *flags])}")
    monkeypatch.setattr(torch, "compile", lambda net, **options: net)     # the loop's choice, not inductor
    with monkeypatch.context() as m:
        _signal_at(m, epoch=1, step=2, signum=signal.SIGINT)
        with pytest.raises(TrainingInterrupted) as second:
            train(None, out, resume_plan(out, RunOptions(compile=True)), mode="resume", progress=False)
    assert str(second.value).endswith(f"Resume with: attncnn train --resume {out} --compile")
    assert not set(MACHINE_FIELDS) & set(json.loads((out / "config.json").read_text()))
    assert [r["compiled"] for r in _metrics(out)] == [True]         # epoch 1 was finished compiled
    assert [(s["compiled"], s["deterministic"], s["ended"]) for s in _segments(out)] == [
        (False, True, "interrupted"), (True, True, "interrupted")]   # deterministic: as the run ran


@pytest.mark.parametrize("precision", ["fp32", None])     # None: written before --precision existed
def test_a_run_written_before_the_recipe_was_kept_apart_resumes_bit_identically(tiny, reference_run, tmp_path,
                                                                                monkeypatch, precision):
    """An older attncnn wrote the machine's options into config.json (and no machine.json): a resume
    reads them one way (deterministic and fp32 as the run ran, without any flag) and rewrites nothing."""
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_at(m, epoch=1, step=2, signum=signal.SIGTERM)
        with pytest.raises(TrainingInterrupted):
            _train(tiny, out)
    config = json.loads((out / "config.json").read_text())
    old = {**config, "device": "cpu", "compile": False, "deterministic": True, "measure_paths": True,
           "data_dir": str(tiny[1]), "download": False, "model": {**config["model"], "impl": "dense"},
           **({} if precision is None else {"precision": precision})}
    (out / "config.json").write_text(json.dumps(old))
    (out / MACHINE_FILE).unlink()
    plan = resume_plan(out)
    assert (plan.deterministic, plan.precision, plan.options.data_dir, plan.impl) == (True, "fp32", str(tiny[1]), None)
    train(None, out, plan, mode="resume", progress=False)
    assert_same_files(_last(reference_run), _last(out))
    assert_same_metrics(reference_run, out)
    assert json.loads((out / "config.json").read_text()) == old          # read, never written back
    assert [s["start"] for s in _segments(out)] == [{"epoch": 1, "step": 3}]


def test_bf16_runs_resume_bit_identically_too(tiny, tmp_path, monkeypatch):
    from attncnn.perf import precision as run_precision

    # a resume keeps bf16 where the CPU runs it fast (else it continues in fp32, test_machine_precision.py);
    # this tiny run costs seconds in bf16 on any CPU, so it runs everywhere as on a CPU with bf16 units
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: True)
    reference, out = tmp_path / "reference", tmp_path / "run"
    _train(tiny, reference, precision="bf16")
    with monkeypatch.context() as m:
        _signal_at(m, epoch=1, step=2, signum=signal.SIGTERM)
        with pytest.raises(TrainingInterrupted):
            _train(tiny, out, precision="bf16")
    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert_same_files(_last(reference), _last(out))
    assert_same_metrics(reference, out)
    assert [segment["precision"] for segment in _segments(out)] == ["bf16", "bf16"]
    assert "precision" not in load_checkpoint(_last(out)).metadata["config"]
    fp32 = load_checkpoint(_last(reference))                   # bf16 really ran: not the fp32 weights
    assert not torch.equal(fp32.model_state["head.weight"], _fp32_weights(tiny, tmp_path)["head.weight"])


def test_adamw_runs_resume_bit_identically_with_their_moments(tiny, tmp_path, monkeypatch):
    reference, out = tmp_path / "reference", tmp_path / "run"
    config = dict(optimizer="adamw", lr=1e-3, weight_decay=0.05)
    _train(tiny, reference, **config)
    with monkeypatch.context() as m:
        _signal_at(m, epoch=1, step=2, signum=signal.SIGTERM)
        with pytest.raises(TrainingInterrupted):
            _train(tiny, out, **config)
    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert_same_files(_last(reference), _last(out))
    assert_same_metrics(reference, out)
    state = load_checkpoint(_last(out)).optimizer_state["state"]
    assert all({"exp_avg", "exp_avg_sq", "step"} <= set(s) for s in state.values())
    assert json.loads((out / "config.json").read_text())["optimizer"] == "adamw"


def _fp32_weights(tiny, tmp_path) -> dict:
    _train(tiny, tmp_path / "fp32")
    return load_checkpoint(_last(tmp_path / "fp32")).model_state


def test_auto_precision_is_resolved_and_recorded_in_machine_json_only(tiny, tmp_path, monkeypatch):
    from attncnn.perf import precision as run_precision

    for fast, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(run_precision, "fast_bf16", lambda device, fast=fast: fast)
        out = tmp_path / expected
        _train(tiny, out, precision="auto", epochs=1)
        assert [segment["precision"] for segment in _segments(out)] == [expected]
        assert [r["precision"] for r in _metrics(out)] == [expected]
        assert not set(MACHINE_FIELDS) & set(json.loads((out / "config.json").read_text()))


def test_the_attention_paths_a_run_took_go_to_machine_json_not_to_the_recipe_or_checkpoint(tiny, reference_run,
                                                                                          tmp_path):
    out = tmp_path / "separable"
    _train(tiny, out, epochs=1, impl="separable")
    assert _segments(out)[0]["attention_paths"] == {"train": ["separable"] * 2, "test": ["separable"] * 2}
    assert json.loads((out / "config.json").read_text())["model"] == {"dim": 16, "mlp_dim": 16}
    meta = load_checkpoint(_last(out)).metadata
    assert "attention_paths" not in meta and not {"impl", "eval_impl"} & set(meta["model_config"])
    assert load_model(out)[0].config.impl == "auto"        # the layers' own rule on the device it lands on
    # impl "auto" on the demo's 8x8 tokens: 64 < 6 (8 + 8), the dense path
    assert _segments(reference_run)[0]["attention_paths"]["train"] == ["dense", "dense"]


def test_a_checkpoint_from_before_impl_existed_loads_as_auto():
    shipped = Path(__file__).resolve().parents[2] / "results" / "mini" / "quadratic-mini" / "seed0"
    meta = load_checkpoint(next((shipped / "checkpoints").glob("*.safetensors"))).metadata
    assert "impl" not in meta["config"]["model"] and "attention_paths" not in meta
    assert load_model(shipped)[0].config.impl == "auto"


def test_signal_after_the_last_step_of_an_epoch_resumes_with_evaluation(tiny, reference_run, tmp_path,
                                                                        monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_at(m, epoch=0, step=STEPS - 1, signum=signal.SIGTERM)
        with pytest.raises(TrainingInterrupted):
            _train(tiny, out)
    meta = load_checkpoint(_last(out)).metadata
    assert (meta["epoch"], meta["step_in_epoch"]) == (0, STEPS)   # all steps done, evaluation pending
    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert_same_files(_last(reference_run), _last(out))
    assert_same_metrics(reference_run, out)


def test_mid_epoch_checkpoints_change_nothing(tiny, reference_run, tmp_path):
    out = tmp_path / "run"
    _train(tiny, out, checkpoint_every_steps=4)
    meta = load_checkpoint(_last(out)).metadata
    assert (meta["epoch"], meta["step_in_epoch"]) == (2, 0)
    assert_same_files(_last(reference_run), _last(out))


def test_resume_from_a_periodic_mid_epoch_checkpoint(tiny, reference_run, tmp_path, monkeypatch):
    out = tmp_path / "run"
    saved: list[tuple[int, int]] = []
    real_write = saver.write_checkpoint

    def save_then_die(path, checkpoint):
        real_write(path, checkpoint)
        meta = checkpoint.metadata
        saved.append((meta["epoch"], meta["step_in_epoch"]))
        if (meta["epoch"], meta["step_in_epoch"]) == (1, 2):
            raise SystemExit("killed")                        # nothing after this save happens

    with monkeypatch.context() as m:
        m.setattr(saver, "write_checkpoint", save_then_die)
        with pytest.raises(SystemExit):
            _train(tiny, out, checkpoint_every_steps=4)
    assert (0, 4) in saved and saved[-1] == (1, 2)             # global steps 4 and 8
    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert_same_files(_last(reference_run), _last(out))
    assert_same_metrics(reference_run, out)


def test_a_crash_before_the_first_checkpoint_resumes_without_its_epochs_record_twice(tiny, reference_run, tmp_path,
                                                                                      monkeypatch):
    out = tmp_path / "run"

    def die(path, checkpoint):
        raise SystemExit("killed")            # epoch 1's record is written, no checkpoint ever is

    with monkeypatch.context() as m:
        m.setattr(saver, "write_checkpoint", die)
        with pytest.raises(SystemExit):
            _train(tiny, out)
    assert [r["epoch"] for r in _metrics(out)] == [1] and not list((out / "checkpoints").glob("*.safetensors"))
    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert_same_metrics(reference_run, out)                   # epochs [1, 2], not [1, 1, 2]
    assert_same_files(_last(reference_run), _last(out))


def test_resume_refuses_a_checkpoint_that_does_not_fit_the_data(tiny, tmp_path):
    out = tmp_path / "run"
    _train(tiny, out, epochs=1)
    ckpt = load_checkpoint(_last(out))
    model = build_model("demo", num_classes=3, dim=16, mlp_dim=16)
    model.load_state_dict(ckpt.model_state)
    save_checkpoint(_last(out), model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    metadata={**ckpt.metadata, "epoch": 0, "step_in_epoch": 50})
    with pytest.raises(TrainingError, match=r"does not fit this run \(1 epochs of 6 steps\)"):
        train(None, out, resume_plan(out), mode="resume", progress=False)


# -- non-finite loss ---------------------------------------------------------------------------

def _poison(monkeypatch, at_call: int) -> None:
    """Make the model's ``at_call``-th training forward return NaN logits."""
    real = state.build_checked

    def build(*args, **kwargs):
        model = real(*args, **kwargs)
        inner, calls = model.forward, [0]

        def forward(x):
            out = inner(x)
            if model.training:
                calls[0] += 1
                if calls[0] == at_call:
                    out = out + float("nan")
            return out

        model.forward = forward
        return model

    monkeypatch.setattr(state, "build_checked", build)


@pytest.mark.parametrize("every_steps", [0, 4])
def test_nan_loss_names_the_exact_step_and_keeps_the_last_good_checkpoint(tiny, tmp_path, monkeypatch,
                                                                          every_steps):
    # The NaN is in epoch 2, batch index 1 (step 2). With every_steps=4 a mid-epoch save is due after
    # that step (global step 8): it must be refused, so the last good checkpoint is the end of epoch 1.
    out = tmp_path / "run"
    config = _config(tiny, checkpoint_every_steps=every_steps)
    _poison(monkeypatch, at_call=STEPS + 2)
    with pytest.raises(NonFiniteLossError) as info:
        train(config, out, make_plan(config, _options(tiny)), progress=False)
    err = info.value
    lr = LRSchedule(base_lr=config.lr, epochs=2, steps_per_epoch=STEPS, warmup_ratio=config.warmup_ratio).lr_at(1, 1)
    assert (err.epoch, err.batch_index) == (1, 1) and math.isnan(err.loss) and err.lr == pytest.approx(lr)
    msg = str(err)
    assert "epoch 2, step 2 of 6" in msg and "batch index 1" in msg and f"learning rate {lr:.6g}" in msg
    assert "--lr" in msg and f"last good checkpoint is {_last(out)} (end of epoch 1)" in msg
    ckpt = load_checkpoint(_last(out))
    assert (ckpt.metadata["epoch"], ckpt.metadata["step_in_epoch"]) == (1, 0)
    assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())
    assert [r["epoch"] for r in _metrics(out)] == [1] and not (out / "finished.json").exists()


def test_nan_in_the_first_steps_says_no_checkpoint_was_written(tiny, tmp_path, monkeypatch):
    _poison(monkeypatch, at_call=1)
    with pytest.raises(NonFiniteLossError, match="step 1 of 6.*no checkpoint had been written yet, so nothing of "
                                                 "a new run is kept"):
        _train(tiny, tmp_path / "run")
    assert not (tmp_path / "run").exists()          # nothing to resume: the same command can run again


def _interrupted_while_setting_up(monkeypatch):
    """Ctrl-C while the run sets up (measuring its attention paths), after config.json is written and
    before its first checkpoint: no signal handler is installed yet, so it is a KeyboardInterrupt."""
    import attncnn.training.loop as loop

    def choose_on(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(loop, "choose_on", choose_on)


def test_ctrl_c_before_the_first_checkpoint_leaves_no_folder_and_the_command_runs_again(tiny, tmp_path,
                                                                                        monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        _interrupted_while_setting_up(patch)
        with pytest.raises(KeyboardInterrupt):
            _train(tiny, out, epochs=1)
    assert not out.exists()
    assert _train(tiny, out, epochs=1)["final"]["epoch"] == 1         # not refused as "already exists"
    # a folder the user made is kept, emptied of what the run wrote; an interrupted resume keeps its folder
    mine = tmp_path / "mine"
    mine.mkdir()
    _interrupted_while_setting_up(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny, mine, epochs=1)
    assert [p.name for p in mine.iterdir()] == [".lock"]
    config = _config(tiny, epochs=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, out, resume_plan(out), mode="resume", progress=False)
    assert _last(out).is_file() and (out / "config.json").is_file()


def test_infinite_loss_is_caught_too(tiny, tmp_path, monkeypatch):
    real = torch.nn.functional.cross_entropy
    calls = [0]

    def cross_entropy(logits, y, *a, **k):
        calls[0] += 1
        return real(logits, y, *a, **k) + (float("inf") if calls[0] == 3 else 0.0)

    monkeypatch.setattr(step_module.F, "cross_entropy", cross_entropy)
    with pytest.raises(NonFiniteLossError, match="became inf at epoch 1, step 3 of 6"):
        _train(tiny, tmp_path / "run")


# -- full or read-only disk ---------------------------------------------------------------------

def test_full_disk_during_a_checkpoint_names_the_folder_and_keeps_the_previous_one(tiny, tmp_path, monkeypatch):
    import safetensors.torch

    out = tmp_path / "run"
    real = safetensors.torch.save_file
    calls = [0]

    def save_file(tensors, filename, metadata=None):
        calls[0] += 1
        if calls[0] <= 3:                                     # epoch 1: best, epoch_0001, last
            return real(tensors, filename, metadata=metadata)
        with open(filename, "wb") as f:                       # half a file, then the disk is full
            f.write(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    with pytest.raises(RunFolderError) as info:
        _train(tiny, out)
    msg = str(info.value)
    assert "No space left on device" in msg and str(out / "checkpoints") in msg
    assert "free some space" in msg and "--out" in msg and "intact" in msg
    assert load_checkpoint(_last(out)).metadata["epoch"] == 1
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.endswith(".tmp")]


def test_full_disk_while_logging_metrics_keeps_the_previous_records(tiny, tmp_path, monkeypatch):
    from attncnn.runs import folder as run_folder

    out = tmp_path / "run"
    real = run_folder.atomic_write_bytes
    calls = [0]

    def write(dest, data):
        if Path(dest).name == "metrics.jsonl":
            calls[0] += 1
            if calls[0] == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(dest, data)

    monkeypatch.setattr(run_folder, "atomic_write_bytes", write)
    with pytest.raises(RunFolderError, match=rf"cannot write {out / 'metrics.jsonl'} .*free some space"):
        _train(tiny, out)
    assert [r["epoch"] for r in _metrics(out)] == [1]
    assert load_checkpoint(_last(out)).metadata["epoch"] == 1


def test_read_only_folder_message(tiny, tmp_path, monkeypatch):
    from attncnn.runs.folder import write_error_message

    msg = write_error_message(tmp_path / "run" / "config.json", OSError(errno.EROFS, "Read-only file system"))
    assert f"{tmp_path / 'run'} is not writable" in msg and "--out" in msg
    msg = write_error_message(tmp_path / "x", PermissionError(errno.EACCES, "Permission denied"))
    assert "Permission denied" in msg and "fix its permissions" in msg


# -- checkpoints whose stored configuration does not fit -------------------------------------

@pytest.fixture(scope="module")
def trained_checkpoint(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "run"
    _train(tiny, out, epochs=1)
    return _last(out)


def _rewrite(src: Path, dest: Path, **meta_changes) -> Path:
    ckpt = load_checkpoint(src)
    meta = {**ckpt.metadata, **meta_changes}
    model = build_model("demo", num_classes=3, dim=16, mlp_dim=16)
    model.load_state_dict(ckpt.model_state)
    save_checkpoint(dest, model=model, metadata=meta)
    return dest


@pytest.mark.parametrize("change,match", [
    (lambda m: {"model_config": {**m["model_config"], "heads": 4}}, "unknown model option 'heads'"),
    (lambda m: {"model_config": {**m["model_config"], "num_heads": "4"}}, "'num_heads' must be"),
    (lambda m: {"model_config": {**m["model_config"], "dim": 32}}, r"weight '.*' has shape .* needs"),
    (lambda m: {"model_config": {**m["model_config"], "num_layers": 3}}, r"missing \['blocks.2"),
    (lambda m: {"model_config": [1, 2]}, "'model_config' must be a dict"),
    (lambda m: {"arch": "transformer9000"}, "unknown architecture 'transformer9000'"),
    (lambda m: {"config": {**m["config"], "epoch": 3}}, "unknown training option 'epoch'"),
    (lambda m: {"config": {**m["config"], "lr": "fast"}}, "'lr' must be"),
])
def test_stored_configuration_is_validated_before_building(trained_checkpoint, tmp_path, change, match):
    meta = load_checkpoint(trained_checkpoint).metadata
    bad = _rewrite(trained_checkpoint, tmp_path / "bad.safetensors", **change(meta))
    with pytest.raises(ValueError, match=match) as info:
        load_model(bad)
    assert str(bad) in str(info.value)


def test_resume_checks_weights_against_config_json(trained_checkpoint, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_checkpoint.parents[1], run)
    config = json.loads((run / "config.json").read_text())
    config["model"]["dim"] = 32
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"weight '.*' has shape"):
        train(None, run, resume_plan(run), mode="resume", progress=False)


@pytest.mark.slow
def test_compile_trains_the_same_model(tiny, reference_run, tmp_path, monkeypatch):
    out = tmp_path / "compiled"
    resets, real_reset = [], torch._dynamo.reset
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1) or real_reset())
    _train(tiny, out, compile=True, deterministic=False)
    assert resets == []                     # a caller's compiled functions are left alone (the suite resets)
    plain, compiled = _metrics(reference_run), _metrics(out)
    assert [r["epoch"] for r in compiled] == [1, 2]
    for a, b in zip(plain, compiled):                   # inductor fuses and reorders: close, not equal
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-3)
    assert [segment["compiled"] for segment in _segments(out)] == [True]


@pytest.mark.slow
def test_a_run_that_measures_compile_times_it_once_and_leaves_the_callers_compiled_code(tiny, tmp_path,
                                                                                        monkeypatch):
    """``--measure-compile`` times this 12-step run's own model; compiling is made to win, so the
    loop compiles the module the measurement compiled: dynamo's cache serves it, one graph for the
    whole run. A function the caller compiled before stays compiled (nothing resets dynamo); nothing
    is written outside the run folder."""
    from torch._dynamo.utils import counters
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path / "user-cache"))
    monkeypatch.setattr(measure, "pays_back", lambda timing, steps: True)
    compilations = []

    def backend(graph, inputs):
        compilations.append(graph)
        return graph.forward

    torch._dynamo.reset()           # this test's own start: an earlier test's graph of the same model would serve it
    mine = torch.compile(lambda x: x * 3 + 1, backend=backend)
    mine(torch.ones(3))
    graphs = counters["stats"]["unique_graphs"]
    out = tmp_path / "run"
    _train(tiny, out, deterministic=False, measure_compile=True)
    assert counters["stats"]["unique_graphs"] == graphs + 1       # the measurement's graph, reused by the loop
    assert torch.equal(mine(torch.ones(3)), torch.full((3,), 4.0)) and len(compilations) == 1
    assert not (tmp_path / "user-cache").exists()
    (segment,) = _segments(out)
    assert segment["compiled"] is True
    assert "compile" not in json.loads((out / "config.json").read_text())
