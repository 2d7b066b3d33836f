"""Data-parallel training under torchrun: 2 CPU processes (gloo) against 1 process at the same
global batch, stop/NaN agreement between the processes, and the launch checks.

The slow tests start real ``python -m torch.distributed.run --nproc_per_node 2`` jobs on the tiny
image-folder data set (60 training images, global batch 10: 6 steps per epoch, 2 epochs).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attncnn.cli import main
from attncnn.data import DeviceLoader, load_dataset
from attncnn.runs import RunFolder, load_checkpoint, load_model
from attncnn.training import evaluate
from attncnn.training.distributed import launch_from_env, per_process_batch, rank_device
from attncnn.training.rng import rank_seed

TIMING_KEYS = {"seconds", "images_per_second", "eval_seconds"}
TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# Run by each process in place of `-m attncnn`: injects a SIGTERM or a NaN into one rank only,
# then runs the normal command line.
HOOK = '''
import os, signal, sys
from attncnn.cli import main
from attncnn.training import LRSchedule, state

rank = int(os.environ["RANK"])
if os.environ.get("SIGNAL_AT"):                      # "rank,epoch,step": SIGTERM during that step
    at = tuple(int(v) for v in os.environ["SIGNAL_AT"].split(","))
    real_set_lr = LRSchedule.set_lr
    def set_lr(self, optimizer, epoch, step):
        if (rank, epoch, step) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_set_lr(self, optimizer, epoch, step)
    LRSchedule.set_lr = set_lr
if os.environ.get("NAN_AT"):                         # "rank,call": NaN logits at that training forward
    nan_rank, nan_call = (int(v) for v in os.environ["NAN_AT"].split(","))
    real_build = state.build_checked
    def build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        inner, calls = model.forward, [0]
        def forward(x):
            out = inner(x)
            if model.training and rank == nan_rank:
                calls[0] += 1
                if calls[0] == nan_call:
                    out = out + float("nan")
            return out
        model.forward = forward
        return model
    state.build_checked = build
if os.environ.get("POINT_DELAY"):                    # seconds rank 0 takes to point a run at its data
    import time
    from attncnn import runs
    real_point = runs.point_at_data
    def point_at_data(*args, **kwargs):
        time.sleep(float(os.environ["POINT_DELAY"]))
        return real_point(*args, **kwargs)
    runs.point_at_data = point_at_data
sys.exit(main(sys.argv[1:]))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    """This environment without torchrun's variables, one thread per process, the tests' data cache."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", ATTNCNN_DATA_DIR=str(cache), **extra)
    return env


def _train_args(data: Path, out: Path, *more: str) -> list[str]:
    return ["train", "--preset", "demo", "--set", "dropout=0", "--data", str(data),
            "--batch-size", "10", "--epochs", "2", "--deterministic", "--device", "cpu", "--no-progress",
            "--precision", "fp32", "--out", str(out), *more]      # fp32: the tolerances below are fp32's


def _run(args: list[str], env: dict[str, str], *, processes: int = 1, script: Path | None = None,
         timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m attncnn ARGS`` (or ``python SCRIPT ARGS``), under torchrun when ``processes`` > 1."""
    target = [str(script)] if script is not None else ["-m", "attncnn"]
    launcher = [] if processes == 1 else ["-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                                          "--master_port", str(_free_port())]
    if processes == 1 and script is None:
        command = [sys.executable, "-m", "attncnn", *args]
    else:
        command = [sys.executable, *launcher, *target, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.fixture(scope="module")
def runs(make_tiny_data, data_cache_dir, tmp_path_factory) -> dict:
    """The same 2-epoch training with 1 process and with 2 (the latter with mid-epoch checkpoints
    and one periodic checkpoint kept, which must change nothing), both at global batch 10."""
    data = make_tiny_data(20, 6)
    root = tmp_path_factory.mktemp("ddp")
    one, two = root / "one", root / "two"
    single = _run(_train_args(data, one), _env(data_cache_dir))
    assert single.returncode == 0, single.stderr
    double = _run(_train_args(data, two, "--checkpoint-every-steps", "4", "--keep-checkpoints", "1"),
                  _env(data_cache_dir), processes=2)
    assert double.returncode == 0, double.stderr
    return {"data": data, "cache": data_cache_dir, "root": root, "one": one, "two": two,
            "two_stdout": double.stdout, "two_stderr": double.stderr}


@pytest.mark.slow
def test_two_processes_follow_the_one_process_trajectory(runs):
    one, two = _metrics(runs["one"]), _metrics(runs["two"])
    assert [r["epoch"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (a["epoch"], key)
    # The gradient all-reduce adds two half-batch means where one process takes one full-batch
    # mean: float32 rounding differs by ~1e-7 per step (measured: 1.2e-7 after 12 steps), so the
    # weights agree to 1e-5, a hundred times that, not bit for bit.
    w1, w2 = load_file(str(runs["one"] / "checkpoints" / "last.safetensors")), \
        load_file(str(runs["two"] / "checkpoints" / "last.safetensors"))
    model_keys = sorted(k for k in w1 if k.startswith("model."))
    assert model_keys == sorted(k for k in w2 if k.startswith("model."))
    for key in model_keys:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.slow
def test_only_rank_0_writes_and_the_checkpoint_loads_in_one_process(runs):
    two = runs["two"]
    assert sorted(p.name for p in runs["root"].iterdir()) == ["one", "two"]          # one run folder each
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in runs["one"].iterdir())
    assert len(list((two / "tb").iterdir())) == 1                                     # one event file
    assert len(_metrics(two)) == 2 and (two / "finished.json").is_file()
    # the demo preset saves a periodic checkpoint every epoch; rank 0 deleted epoch 1's (keep 1)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == [
        "best.safetensors", "epoch_0002.safetensors", "last.safetensors"]
    assert (runs["one"] / "checkpoints" / "epoch_0001.safetensors").is_file()           # kept by default
    assert runs["two_stdout"].count("run folder:") == 1                               # printed by rank 0
    assert "global batch 10 = 5 examples per process" in runs["two_stderr"]
    ckpt = load_checkpoint(two / "checkpoints" / "last.safetensors")
    assert not any(k.startswith("module.") for k in ckpt.model_state)                # the unwrapped model
    assert (ckpt.metadata["epoch"], ckpt.metadata["step_in_epoch"]) == (2, 0)
    assert "rng.rank1.torch_cpu" in ckpt.extra_tensors                                  # rank 1's dropout stream
    model, meta = load_model(two)
    dataset = load_dataset(str(runs["data"]))
    result = evaluate(model, DeviceLoader(dataset.test, batch_size=7, train=False))
    best = [r for r in _metrics(two) if r["epoch"] == meta["epoch"]][0]
    assert result.examples == 18                                                      # each test image once
    assert result.accuracy == best["test_accuracy"]
    assert result.loss == pytest.approx(best["test_loss"], rel=1e-5)


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_after_the_same_step_and_resumes_exactly(runs, tmp_path):
    """Also a run shipped from another machine, resumed under torchrun: its config.json records its
    data set's name only, rank 0 rewrites it with the path here (slowly, through the hook), and rank
    1 must wait for that rather than read the old configuration and fail to find "its" data set. (One
    torchrun job for both: the resume reads the folder the stop left.)"""
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    out = tmp_path / "run"
    # SIGTERM to rank 1 only, during global step 7; the processes agree at the next mid-epoch
    # checkpoint (global step 8 = epoch 2, step 2), where both stop and rank 0 saves.
    stopped = _run(_train_args(runs["data"], out, "--checkpoint-every-steps", "4"),
                   _env(runs["cache"], SIGNAL_AT="1,1,0"), processes=2, script=script)
    assert stopped.returncode != 0
    reports = stopped.stderr.count("interrupted by SIGTERM at ")
    assert reports >= 2 and stopped.stderr.count("interrupted by SIGTERM at epoch 2/2, step 2 of 6;") == reports
    assert f"torchrun --nproc_per_node 2 -m attncnn train --resume {out}" in stopped.stderr
    meta = load_checkpoint(out / "checkpoints" / "last.safetensors").metadata
    assert (meta["epoch"], meta["step_in_epoch"]) == (1, 2) and meta["train_count"] == 20   # both shards' sums
    assert not (out / "finished.json").exists()

    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "data": runs["data"].name}))     # as if shipped
    resumed = _run(["train", "--resume", str(out), "--data", str(runs["data"]), "--no-progress"],
                   _env(runs["cache"], POINT_DELAY="3"), processes=2, script=script)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "config.json").read_text())["data"] == str(runs["data"].resolve())
    assert (out / "finished.json").is_file()
    a, b = load_file(str(runs["two"] / "checkpoints" / "last.safetensors")), \
        load_file(str(out / "checkpoints" / "last.safetensors"))
    assert a.keys() == b.keys()
    for key in a:                                           # weights, optimiser and RNG states
        assert torch.equal(a[key], b[key]), key
    assert _without_timings(_metrics(out)) == _without_timings(_metrics(runs["two"]))


@pytest.mark.slow
def test_a_nan_on_one_process_stops_both_with_the_same_error(runs, tmp_path):
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    out = tmp_path / "run"
    failed = _run(_train_args(runs["data"], out), _env(runs["cache"], NAN_AT="1,8"), processes=2, script=script)
    assert failed.returncode != 0
    message = ("the training loss became nan on rank 1 of 2 at epoch 2, step 2 of 6 (batch index 1 of the "
               "epoch's shuffled order, global step 8)")
    assert failed.stderr.count(message) == 2 == failed.stderr.count("the training loss became")   # both, alike
    assert "the last good checkpoint is" in failed.stderr and "(end of epoch 1)" in failed.stderr
    meta = load_checkpoint(out / "checkpoints" / "last.safetensors").metadata
    assert (meta["epoch"], meta["step_in_epoch"]) == (1, 0)
    assert [r["epoch"] for r in _metrics(out)] == [1] and not (out / "finished.json").exists()


@pytest.mark.slow
def test_a_taken_run_folder_stops_every_process_at_once(runs):
    # Every process checks that a new run's folder is free before it loads any data (the command's
    # own check), so none of them waits for the others in a collective: the job ends within the
    # timeout, every rank with the same one-line refusal.
    again = _run(_train_args(runs["data"], runs["two"]), _env(runs["cache"]), processes=2, timeout=60)
    assert again.returncode != 0
    assert f"run folder {runs['two']} already exists and is not empty; use --resume" in again.stderr


@pytest.mark.slow
def test_a_folder_in_use_is_refused_by_rank_0_and_stops_the_job(runs, tmp_path):
    # Only rank 0 checks the lock (two ranks checking at once once took each other for a trainer);
    # the refusal must still end every process promptly, with the holder named: also rank 1, which
    # waits for rank 0 to point this shipped run at its data set (for up to 120 s on its own).
    with RunFolder(tmp_path / "run", mode="new") as held:
        held.write_config({"preset": "demo", "data": "tiny.zip"})
        refused = _run(["train", "--resume", str(tmp_path / "run"), "--data", str(tmp_path / "tiny.zip"),
                        "--no-progress"], _env(runs["cache"]), processes=2, timeout=60)
    assert refused.returncode != 0
    assert f"run folder {tmp_path / 'run'} is in use: attncnn pid {os.getpid()} on host" in refused.stderr


# -- sharding of the device loader -----------------------------------------------------------------

def _split(n: int):
    from attncnn.data import ImageSplit

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=gen)
    return ImageSplit(images, torch.arange(n))                   # label = example id


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_ranks_batches_together_are_the_one_process_batch_augmentation_included(world_size):
    # Rank r takes perm[r::W] and the crop offsets and flips are drawn per example id, so the
    # k-th batches of the W ranks, interleaved, are the k-th batch of one process at W times the
    # batch size, pixel for pixel.
    split, batch = _split(60), 12
    one = DeviceLoader(split, batch_size=batch, train=True, seed=3)
    shards = [DeviceLoader(split, batch_size=batch // world_size, train=True, seed=3, rank=r,
                           world_size=world_size) for r in range(world_size)]
    for epoch in (0, 1):
        for loader in (one, *shards):
            loader.set_epoch(epoch)
        assert all(len(s) == len(one) == 5 for s in shards)
        for (x, y), *parts in zip(one, *shards):
            xs = torch.stack([p[0] for p in parts], dim=1).flatten(0, 1)   # (b, W, C, H, W) -> (B, C, H, W)
            ys = torch.stack([p[1] for p in parts], dim=1).flatten()
            assert torch.equal(xs, x) and torch.equal(ys, y)


def test_evaluation_shards_cover_each_example_once():
    split = _split(23)
    seen = torch.cat([y for r in range(4)
                      for _, y in DeviceLoader(split, batch_size=2, train=False, rank=r, world_size=4)])
    assert sorted(seen.tolist()) == list(range(23))
    # training drops n % W examples so that every rank takes the same number of steps
    assert [DeviceLoader(split, batch_size=2, train=True, rank=r, world_size=4).num_examples
            for r in range(4)] == [5] * 4


# -- launch checks (in-process: the environment torchrun would set, no process group) --------------

def _as_rank(monkeypatch, rank: int, world_size: int) -> None:
    for name, value in (("WORLD_SIZE", world_size), ("RANK", rank), ("LOCAL_RANK", rank),
                        ("LOCAL_WORLD_SIZE", world_size)):
        monkeypatch.setenv(name, str(value))


def test_a_batch_size_that_does_not_split_over_the_processes_is_refused(make_tiny_data, tmp_path, monkeypatch,
                                                                      capsys):
    _as_rank(monkeypatch, 0, 2)
    out = tmp_path / "run"
    args = _train_args(make_tiny_data(20, 6), out)
    args[args.index("--batch-size") + 1] = "9"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ("--batch-size 9 is the global batch and must split evenly over the 2 processes; use a multiple of 2 "
            "(e.g. 8, 10)") in err
    assert not out.exists()                                  # refused before anything was written


def test_launch_from_env():
    assert launch_from_env({}) is None
    assert launch_from_env({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}) is None   # one process: no group
    launch = launch_from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (launch.rank, launch.local_rank, launch.world_size) == (3, 1, 4)
    with pytest.raises(ValueError, match="WORLD_SIZE=2 is set but RANK is not; start distributed training with "
                                         "torchrun"):
        launch_from_env({"WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(ValueError, match="RANK=2 / LOCAL_RANK=0 do not fit WORLD_SIZE=2"):
        launch_from_env({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"})
    with pytest.raises(ValueError, match="LOCAL_RANK='x' is not an integer"):
        launch_from_env({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"})


def test_rank_device_and_per_process_batch():
    assert rank_device("cpu", 3) == torch.device("cpu")
    with pytest.raises(ValueError, match="names one GPU.*--device cuda .or auto.*CUDA_VISIBLE_DEVICES"):
        rank_device("cuda:1", 0)
    if not torch.cuda.is_available():
        assert rank_device("auto", 1) == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA is not available; use --device cpu"):
            rank_device("cuda", 0)
    assert per_process_batch(100, 4) == 25
    with pytest.raises(ValueError, match=r"--batch-size 100 .* 8 processes; use a multiple of 8 \(e.g. 96, 104\)"):
        per_process_batch(100, 8)
    assert rank_seed(42, 1) != rank_seed(42, 2) and rank_seed(42, 1) == rank_seed(42, 1)


def test_plain_training_creates_no_process_group(make_tiny_data, tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("no group without torchrun"))
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    args = _train_args(make_tiny_data(20, 6), tmp_path / "run")
    args[args.index("--epochs") + 1] = "1"
    assert main(args + ["--set", "dim=16", "--set", "mlp_dim=16"]) == 0
    assert not dist.is_initialized()
