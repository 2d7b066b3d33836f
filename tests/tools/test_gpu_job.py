"""tools/gpu_job.py: runs come back whole from a GPU job (packed within the return limits,
checked, unpacked without overwriting finished work), and fillers give way to primaries."""

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gpu_job as job

from attncnn.api import load_model
from attncnn.perf import cpu_name
from attncnn.reproduce import get_suite, job_state, plan
from attncnn.reproduce.running.machines import shared_epochs
from attncnn.reproduce.running.runner import TrainOptions, train_jobs
from attncnn.runs import (PREDICTIONS_FILE, WITHHELD_FILE, load_checkpoint, read_predictions,
                          read_withheld)

SPEC = job.RunSpec("mini-long", "quadratic-mini", 0)
OTHER = job.RunSpec("mini-long", "learned-mini", 0, filler=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_tiny_data):
    """A results-like root with a finished one-epoch quadratic-mini and an unfinished learned-mini
    (a finished run without finished.json: a resumable checkpoint with its optimiser state)."""
    root = tmp_path_factory.mktemp("gpu-job") / "work"
    data = make_tiny_data(8, 2)
    for spec in (SPEC, OTHER):
        jobs = plan(get_suite(spec.suite), root / spec.suite, seeds=(spec.seed,), only=(spec.preset,), epochs=1)
        train_jobs(jobs, TrainOptions(data=str(data), device="cpu", batch_size=4), progress=False)
    (root / OTHER.relative / "finished.json").unlink()
    return root


def _copy(trained, tmp_path) -> Path:
    root = tmp_path / "work"
    shutil.copytree(trained, root)
    return root


def test_run_specs_parse_and_refuse_other_forms():
    assert job.RunSpec.parse("paper-long/quadratic/0") == job.RunSpec("paper-long", "quadratic", 0)
    assert job.RunSpec.parse("mini-long/learned-content-mini/2:filler").filler
    assert job.RunSpec.parse("paper-long/learned-content/0@40:filler") == job.RunSpec(
        "paper-long", "learned-content", 0, filler=True, epochs=40)
    for text in ("paper-long/quadratic/0", "paper-long/learned-content/1@40", "mini-long/learned-mini/2@7:filler"):
        assert job.RunSpec.parse(text).text == text
    for bad in ("paper-long/quadratic", "paper-long/quadratic/x", "a/b/0:later", "a/b/0@", "a/b/0@0", "a/b/0@x"):
        with pytest.raises(ValueError, match="SUITE/PRESET/SEED"):
            job.RunSpec.parse(bad)


def test_a_run_with_its_own_length_is_planned_with_that_schedule(tmp_path):
    """``@EPOCHS``: a run shorter than its suite's (the longest schedule a job fits); its worker plans
    the suite job with that many epochs (warm-up and cosine fitted to them, recorded in its config)."""
    spec = job.RunSpec.parse("paper-long/learned-content/0@40")
    planned = job._job(spec, tmp_path, epochs=7)            # the run's own length wins over the job's --epochs
    assert dict(planned.overrides)["epochs"] == 40 and planned.folder == tmp_path / spec.relative
    assert dict(job._job(job.RunSpec.parse("paper-long/learned-content/0"), tmp_path).overrides)["epochs"] == 60


def test_the_300_epoch_runs_travel_as_fillers_that_train_until_the_deadline(tmp_path):
    """mini-300's six runs cannot finish in one job: each is a filler, resumed job after job. With no
    primary beside them, no filler is stopped before the deadline (nothing is projected late)."""
    specs = [job.RunSpec.parse(f"mini-300/{preset}/{seed}:filler") for seed in (0, 1, 2)
             for preset in ("quadratic-mini", "learned-mini")]
    for spec in specs:
        planned = job._job(spec, tmp_path)
        assert spec.filler and dict(planned.overrides) == {"epochs": 300, "checkpoint_every": 50}
        assert planned.folder == tmp_path / "mini-300" / spec.preset / f"seed{spec.seed}"
    fillers = [_run(True, 10_000.0) for _ in specs]
    assert job.to_stop(fillers, now=540.0, deadline=545.0) == []
    assert [r for r, why in job.to_stop(fillers, now=546.0, deadline=545.0)] == fillers


def test_a_run_as_long_as_the_job_fits_is_parsed_and_never_planned_unsized(tmp_path):
    spec = job.RunSpec.parse("paper-long/learned-content/0@fit")
    assert spec == job.RunSpec("paper-long", "learned-content", 0, epochs="fit") and spec.fit
    assert spec.text == "paper-long/learned-content/0@fit" and not job.RunSpec.parse("a/b/0@3").fit
    with pytest.raises(ValueError, match="filler"):            # a filler resumes later: nothing to size
        job.RunSpec.parse("mini-long/learned-content-mini/0@fit:filler")
    with pytest.raises(ValueError, match="fitted_spec"):
        job._job(spec, tmp_path)


def test_fit_epochs_takes_the_most_that_end_in_time_and_no_more_than_the_suite():
    # 90 % of 200 s, less 20 s to set up, leaves 160 s: 10 epochs of 16 s
    assert job.fit_epochs(200.0, setup=20.0, epoch=16.0, most=60) == 10
    assert job.fit_epochs(200.0, setup=20.0, epoch=15.9, most=60) == 10      # 10.06: still 10
    assert job.fit_epochs(200.0, setup=20.0, epoch=16.1, most=60) == 9
    assert job.fit_epochs(10_000.0, setup=20.0, epoch=16.0, most=60) == 60   # the suite's length at most
    with pytest.raises(ValueError, match="--fit-seconds"):
        job.fit_epochs(30.0, setup=20.0, epoch=16.0, most=60)


def test_a_fit_run_is_sized_once_and_resumed_at_its_own_length(tmp_path, capsys):
    spec = job.RunSpec.parse("paper-long/learned-content/0@fit")
    timed = []

    def measure(s):
        timed.append(s)
        return {"setup": 30.0, "epoch": 17.0, "step": 0.033, "infer": 0.1, "steps": 500, "test_batches": 20,
                "compile": True, "impl": "explicit-half", "eval_impl": "sdpa"}

    sized = job.fitted_spec(spec, tmp_path, 600.0, measure)
    assert sized == job.RunSpec("paper-long", "learned-content", 0, epochs=30)    # (540 - 30) / 17
    assert timed == [job.RunSpec("paper-long", "learned-content", 0)]             # timed as the suite's run
    assert "@fit -> 30 epochs of 60" in capsys.readouterr().out
    assert job.fitted_spec(spec, tmp_path, 1e5, measure, epochs=3).epochs == 3    # a smoke job's --epochs
    folder = tmp_path / spec.relative                                             # the lease's second call
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"epochs": 30, "preset": "learned-content"}))
    timed.clear()
    assert job.fitted_spec(spec, tmp_path, 50.0, measure).epochs == 30 and timed == []
    plain = job.RunSpec.parse("paper-long/quadratic/0@12:filler")
    assert job.fitted_spec(plain, tmp_path, 1.0, measure) is plain


def test_a_new_runs_epoch_is_timed_as_its_worker_trains_it(tmp_path, make_tiny_data):
    data = make_tiny_data(8, 2)                  # 3 classes: 24 training images, 6 test images
    planned = job._job(job.RunSpec("mini-long", "quadratic-mini", 0), tmp_path)
    planned = type(planned)(planned.preset, planned.seed, planned.folder,
                            planned.overrides + (("model", {"num_layers": 1}),))
    timing = job.measure_epoch(planned, TrainOptions(data=str(data), device="cpu", batch_size=4, compile=False))
    assert (timing["steps"], timing["test_batches"], timing["compile"], timing["device"]) == (6, 1, False, "cpu")
    assert timing["epoch"] == pytest.approx(6 * timing["step"] + timing["infer"])
    assert 0 < timing["step"] < timing["setup"] and timing["infer"] > 0
    assert not planned.folder.exists()           # timing leaves no run behind


@pytest.mark.parametrize("flags", [[], ["--compile-mode", "reduce-overhead", "--fused-optimizer"]])
def test_the_jobs_compile_mode_and_optimizer_kernel_reach_every_runs_options(monkeypatch, flags):
    """``train --compile-mode ... --fused-optimizer`` hands both to each worker's command line, and
    the worker trains with them as run-time options (none of them without the flags)."""
    seen = []
    monkeypatch.setattr(job, "_train", lambda args: seen.append(args) or 0)
    monkeypatch.setattr(job, "_worker", lambda args: seen.append(args) or 0)
    assert job.main(["train", "mini-long/quadratic-mini/0", "--data", "d", "--budget", "9", "--pack-to", "o",
                     "--device", "cuda", *flags]) == 0
    passed = job._run_flags(seen[0])
    assert passed == flags
    assert job.main(["worker", "mini-long/quadratic-mini/0", "--root", "r", "--data", "d", *passed]) == 0
    options = job._train_options(seen[1]).run_options()
    assert (options.compile_mode, options.fused_optimizer, options.compile) == (
        ("reduce-overhead", True, None) if flags else ("default", False, None))
    assert options.flags() == ["--device", "cuda", *flags]          # what a --resume command repeats


def test_a_timing_that_runs_past_the_time_left_is_stopped_with_its_workers(tmp_path, monkeypatch,
                                                                           assert_process_ends):
    """The @fit timing child (here a script that starts a worker and sleeps) is stopped at the job's
    time left, its worker too, and the run is refused with a message saying so, so the job goes on
    to pack what it has instead of spending the call on one compilation."""
    worker_pid = tmp_path / "worker.pid"
    stall = tmp_path / "stall.py"
    stall.write_text("import pathlib, subprocess, sys, time\n"
                     "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                     f"pathlib.Path({str(worker_pid)!r}).write_text(str(w.pid))\n"
                     "print('compiling', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(job, "__file__", str(stall))
    args = SimpleNamespace(data="unused", device="cpu", compile=False, compile_mode="default", fused_optimizer=False,
                           epochs=None, train_subset=None)
    log = tmp_path / "fit.log"
    with pytest.raises(RuntimeError, match=r"timing paper-long/learned-content/seed0 took more than 3 s, the job's "
                                           r"time left; stopped: compiling"):
        job._measure_in_child(job.RunSpec("paper-long", "learned-content", 0), tmp_path, args, log, timeout=3.0)
    assert "compiling" in log.read_text()
    pid = int(worker_pid.read_text())
    assert_process_ends(pid, "the timing's worker")


@pytest.mark.slow
def test_a_pack_unpacks_into_results_with_its_weights_and_resumable_state(trained, tmp_path):
    root = _copy(trained, tmp_path)
    before = load_checkpoint(root / SPEC.relative / "checkpoints" / "last.safetensors").model_state
    manifest = job.pack(root, [SPEC, OTHER], tmp_path / "out", epochs=1)
    assert [e["state"] for e in manifest["runs"]] == ["finished", "interrupted"]
    assert all(p["bytes"] <= job.PART_BYTES for p in manifest["parts"])
    results = tmp_path / "results"
    lines = job.unpack(tmp_path / "out", results)
    assert len(lines) == 2 and "finished after 1 epochs" in lines[0]
    finished = results / SPEC.relative
    assert sorted(p.name for p in finished.iterdir()) == ["checkpoints", "config.json", "finished.json",
                                                          "machine.json", "metrics.jsonl"]
    after = load_checkpoint(finished / "checkpoints" / "last.safetensors")
    assert after.optimizer_state is None                       # weights only, as tools/ship.py trims them
    assert all(torch.equal(before[k], after.model_state[k]) for k in before)
    resumable = load_checkpoint(results / OTHER.relative / "checkpoints" / "last.safetensors")
    assert resumable.optimizer_state is not None
    jobs = plan(get_suite("mini-long"), results / "mini-long", seeds=(0,), only=("learned-mini",), epochs=1)
    assert job_state(jobs[0]) == "interrupted"


@pytest.mark.slow
def test_a_finished_run_takes_its_prediction_record_home_even_without_its_weights(trained, tmp_path,
                                                                                  make_tiny_data):
    """The worker records each test image's prediction on the device the run trained on, so that the
    record (what checks a run shipped without its weights) travels in the pack."""
    root = _copy(trained, tmp_path)
    folder = root / SPEC.relative
    data = str(make_tiny_data(8, 2))                 # the fixture's data set
    said = job.record_predictions(folder, data, "cpu")
    record = read_predictions(folder / PREDICTIONS_FILE)
    final = json.loads((folder / "finished.json").read_text())["final"]
    assert "prediction record" in said and record.indices is None and len(record.predictions) == 6
    assert record.epoch == 1 and record.test_accuracy == final["test_accuracy"]   # the run's own last evaluation
    assert record.device == f"cpu: {cpu_name()}"
    stamp = (folder / PREDICTIONS_FILE).stat().st_mtime_ns
    assert "kept" in job.record_predictions(folder, data, "cpu")
    assert (folder / PREDICTIONS_FILE).stat().st_mtime_ns == stamp
    # a failure is said, not raised: the finished run still comes back
    other = _copy(trained, tmp_path / "other") / SPEC.relative
    said = job.record_predictions(other, str(tmp_path / "no-such-data"), "cpu")
    assert "no prediction record" in said and not (other / PREDICTIONS_FILE).exists()

    # no room for the weights, even in bfloat16: the run comes back as one shipped without them, its
    # record made from the file that stayed behind
    manifest = job.pack(root, [SPEC], tmp_path / "out", epochs=1, max_bytes=20_000, data=data)
    weights = root / job.LEFT_BEHIND / SPEC.relative / "checkpoints" / "last.safetensors"
    digest, size = hashlib.sha256(weights.read_bytes()).hexdigest(), weights.stat().st_size
    assert manifest["runs"][0]["weights"] == "withheld"
    assert manifest["runs"][0]["predictions"] == record.test_accuracy
    job.unpack(tmp_path / "out", tmp_path / "results")
    back = tmp_path / "results" / SPEC.relative
    assert read_predictions(back / PREDICTIONS_FILE) == record and not (back / "checkpoints").exists()
    withheld = read_withheld(back)
    assert (withheld["sha256"], withheld["bytes"], withheld["weights_dtype"]) == (digest, size, "bfloat16")
    assert withheld["metadata"]["epoch"] == 1
    assert "attncnn reproduce mini-long --only quadratic-mini --seeds 0" in withheld["retrain"]
    assert [layer["layer"] for layer in withheld["final_layers"]] == list(range(1, 7))
    assert "left on the GPU machine of the job that trained it" in withheld["weights_note"]
    with pytest.raises(FileNotFoundError, match="its weights are not \\(left on the GPU machine"):
        load_model(back)
    assert str(tmp_path) not in (back / WITHHELD_FILE).read_text()      # no path of the machine that packed it


@pytest.mark.slow
def test_a_record_of_weights_left_behind_that_cannot_be_made_leaves_the_run_as_before(trained, tmp_path,
                                                                                     make_tiny_data, monkeypatch):
    import withhold
    root = _copy(trained, tmp_path)
    data = str(make_tiny_data(8, 2))
    job.record_predictions(root / SPEC.relative, data, "cpu")

    def broken(*args, **kwargs):
        raise RuntimeError("the attention could not be measured")

    monkeypatch.setattr(withhold, "final_layer_metrics", broken)
    manifest = job.pack(root, [SPEC], tmp_path / "out", epochs=1, max_bytes=20_000, data=data)
    assert manifest["runs"][0]["weights"] == "left behind"
    job.unpack(tmp_path / "out", tmp_path / "results")
    back = tmp_path / "results" / SPEC.relative
    assert (back / PREDICTIONS_FILE).is_file() and not (back / WITHHELD_FILE).exists()
    assert not (back / "checkpoints" / "last.safetensors").exists()


@pytest.mark.slow
def test_a_pack_over_the_limit_stores_weights_in_bfloat16_that_load_exactly(trained, tmp_path):
    root = _copy(trained, tmp_path)
    weights = root / SPEC.relative / "checkpoints" / "last.safetensors"
    before = load_checkpoint(weights).model_state
    full = job.pack(_copy(trained, tmp_path / "probe"), [SPEC], tmp_path / "probe-out", epochs=1)
    size = sum(p["bytes"] for p in full["parts"])
    manifest = job.pack(root, [SPEC], tmp_path / "out", epochs=1, max_bytes=int(size * 0.8))
    assert manifest["runs"][0]["weights"] == "bfloat16" and sum(p["bytes"] for p in manifest["parts"]) <= size * 0.8
    # packed again (the same runs finished in a second call on the warm machine): still said
    assert job.pack(root, [SPEC], tmp_path / "again", epochs=1)["runs"][0]["weights"] == "bfloat16"
    job.unpack(tmp_path / "out", tmp_path / "results")
    model = load_model(tmp_path / "results" / SPEC.relative)     # bfloat16 file, float32 network
    state = model.network.state_dict()
    for name, value in before.items():
        assert state[name].dtype == value.dtype
        assert torch.equal(state[name], value.to(torch.bfloat16).to(value.dtype))


@pytest.mark.slow
def test_the_lending_limits_are_the_tools_arguments_part_size_and_file_count_included(trained, tmp_path):
    full = job.pack(_copy(trained, tmp_path / "probe"), [SPEC], tmp_path / "probe-out", epochs=1)
    size = sum(p["bytes"] for p in full["parts"])
    part = size // 3 + 1
    split = job.pack(_copy(trained, tmp_path / "split"), [SPEC], tmp_path / "split-out", epochs=1, part_bytes=part)
    # a new pack of a copy compresses to about `size` (a few bytes either way: file times), so 3 or 4 parts,
    # every one within the limit and all but the last full
    sizes = [p["bytes"] for p in split["parts"]]
    assert all(b <= part for b in sizes) and len(sizes) == -(-sum(sizes) // part) >= 3
    assert "weights" not in split["runs"][0]
    # three files returned: one part beside pack.json and the log, so the pack shrinks to one part
    one = job.pack(_copy(trained, tmp_path / "one"), [SPEC], tmp_path / "one-out", epochs=1, part_bytes=part,
                   max_files=3)
    assert len(one["parts"]) == 1 and one["runs"][0]["weights"] in ("bfloat16", "left behind")
    with pytest.raises(ValueError, match="--max-files must be above 2"):
        job.pack(_copy(trained, tmp_path / "none"), [SPEC], tmp_path / "none-out", epochs=1, max_files=2)


@pytest.mark.slow
def test_weights_that_cannot_fit_stay_behind_and_records_still_come_back(trained, tmp_path):
    root = _copy(trained, tmp_path)
    manifest = job.pack(root, [SPEC, OTHER], tmp_path / "out", epochs=1, max_bytes=200_000)
    finished, unfinished = manifest["runs"]
    assert finished["weights"] == "left behind" and unfinished["checkpoint"] == "left behind"
    lines = job.unpack(tmp_path / "out", tmp_path / "results")
    assert (tmp_path / "results" / SPEC.relative / "metrics.jsonl").is_file()
    assert not (tmp_path / "results" / SPEC.relative / "checkpoints" / "last.safetensors").exists()
    # an unfinished run without its checkpoint would restart and append to its old records: not written
    assert not (tmp_path / "results" / OTHER.relative).exists() and "not unpacked" in lines[1]


@pytest.mark.slow
def test_an_unfinished_checkpoint_stays_behind_before_a_finished_runs_weights(trained, tmp_path):
    # the room of the finished run alone, in float32: its bfloat16 weights fit once the unfinished
    # run's checkpoint (weights and optimiser state) stays behind
    alone = job.pack(_copy(trained, tmp_path / "probe"), [SPEC], tmp_path / "probe-out", epochs=1)
    room = sum(p["bytes"] for p in alone["parts"])
    manifest = job.pack(_copy(trained, tmp_path), [SPEC, OTHER], tmp_path / "out", epochs=1, max_bytes=room)
    finished, unfinished = manifest["runs"]
    assert finished["weights"] == "bfloat16" and unfinished["checkpoint"] == "left behind"
    assert sum(p["bytes"] for p in manifest["parts"]) <= room
    lines = job.unpack(tmp_path / "out", tmp_path / "results")
    assert load_model(tmp_path / "results" / SPEC.relative).network is not None
    assert not (tmp_path / "results" / OTHER.relative).exists() and "not unpacked" in lines[1]


@pytest.mark.slow
def test_unpack_keeps_finished_runs_and_refuses_damaged_parts(trained, tmp_path):
    root = _copy(trained, tmp_path)
    job.pack(root, [SPEC, OTHER], tmp_path / "out", epochs=1)
    results = tmp_path / "results"
    shutil.copytree(trained / SPEC.relative, results / SPEC.relative)
    marker = results / SPEC.relative / "metrics.jsonl"
    marker.write_text(marker.read_text())                      # the run already here: must stay untouched
    stamp = marker.stat().st_mtime_ns
    lines = job.unpack(tmp_path / "out", results)
    assert "kept the finished run" in lines[0] and marker.stat().st_mtime_ns == stamp
    part = tmp_path / "out" / json.loads((tmp_path / "out" / job.PACK_FILE).read_text())["parts"][0]["file"]
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=part.name):
        job.unpack(tmp_path / "out", results)


def _run(filler: bool, end: float | None, alive: bool = True):
    process = SimpleNamespace(poll=lambda: None if alive else 0)
    return SimpleNamespace(spec=job.RunSpec("s", "p", 0, filler), process=process, stopped=False,
                           projected_end=lambda: end)


def test_fillers_give_way_when_a_primary_is_projected_late_and_all_stop_at_the_deadline():
    primary, filler = _run(False, 90.0), _run(True, None)
    assert job.to_stop([primary, filler], now=10.0, deadline=100.0) == []
    primary.projected_end = lambda: 120.0
    assert [r for r, _ in job.to_stop([primary, filler], now=10.0, deadline=100.0)] == [filler]
    assert [r for r, _ in job.to_stop([primary, filler], now=101.0, deadline=100.0)] == [primary, filler]
    finished = _run(False, 500.0, alive=False)                  # a primary that has ended is never late
    assert job.to_stop([finished, filler], now=10.0, deadline=100.0) == []


def test_each_epoch_records_how_many_of_the_jobs_runs_shared_the_gpu(tmp_path):
    job.write_training(tmp_path, ["paper-long/learned/seed0", "mini-long/learned-content-mini/seed0"])
    metrics = job.sharing_metrics(lambda model: {"attn/layer1/distance": 1.0}, tmp_path)
    job.write_training(tmp_path, ["paper-long/learned/seed0"])      # the filler stopped during epoch 1
    records = [{"epoch": e, **metrics(None)} for e in (1, 2)]
    assert [r["device_runs"] for r in records] == [2, 1]
    assert records[0]["attn/layer1/distance"] == 1.0
    assert all(isinstance(r["load_average"], float) and r["load_average"] >= 0 for r in records)    # Linux has one
    gpu = {"cpu": "Intel Xeon", "threads": 16, "torch": "2.11.0+cu130", "device": "cuda", "gpu": "NVIDIA H100"}
    # a GPU run keeps few of the 16 cores busy: the load average alone would call neither epoch shared
    assert shared_epochs([{**r, "machine": gpu, "load_average": 3.0} for r in records]) == [1]
    assert job.read_training(tmp_path / "no-job") == 1          # a run trained outside a job: alone


def test_a_packed_data_set_rebuilds_the_same_zip_members(tmp_path, make_tiny_data):
    import zipfile
    source = make_tiny_data(2, 1)
    original = tmp_path / "tiny.zip"
    with zipfile.ZipFile(original, "w") as archive:
        for path in sorted(source.rglob("*")):
            archive.write(path, path.relative_to(source).as_posix() + ("/" if path.is_dir() else ""))
    packed = tmp_path / f"tiny{job.DATA_SUFFIX}"
    job.pack_data(original, packed)
    rebuilt = job.unpack_data(packed, tmp_path / "there")
    assert rebuilt.name == "tiny.zip"
    with zipfile.ZipFile(original) as a, zipfile.ZipFile(rebuilt) as b:
        assert [i.filename for i in a.infolist()] == [i.filename for i in b.infolist()]
        assert all(a.read(i) == b.read(i.filename) for i in a.infolist() if not i.is_dir())


@pytest.mark.slow
def test_a_run_folder_that_is_no_suite_run_is_carried_on_with_its_own_configuration(trained, tmp_path,
                                                                                    make_tiny_data):
    # A pruned model's fine-tune lives beside the suite's runs but is none of them: the job resumes it
    # with its own recipe and length, and its starting weights travel with it, unfinished or finished.
    from attncnn.cli import main
    root = _copy(trained, tmp_path)
    data = str(make_tiny_data(8, 2))                 # the fixture's data set
    carried = job.RunSpec("mini-long", "quadratic-mini-finetune", 0, filler=True)
    folder = root / carried.relative
    start = tmp_path / "pruned.safetensors"
    shutil.copy(root / SPEC.relative / "checkpoints" / "last.safetensors", start)
    assert main(["train", "--preset", "quadratic-mini", "--init-from", str(start), "--data", data, "--epochs", "2",
                 "--checkpoint-every", "1", "--batch-size", "4", "--seed", "0", "--device", "cpu",
                 "--precision", "fp32", "--no-compile", "--no-progress", "--out", str(folder)]) == 0
    shutil.copy(start, folder / "checkpoints" / "pruned.safetensors")       # kept in the run, as prune keeps it
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "init_from": str(folder / "checkpoints" /
                                                                                "pruned.safetensors")}))
    for name in ("finished.json", "checkpoints/last.safetensors", "checkpoints/epoch_0002.safetensors"):
        (folder / name).unlink()                     # as if stopped after epoch 1
    metrics = folder / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines(keepends=True)[0])
    carried_job = job._job(carried, root)
    assert (carried_job.preset, carried_job.seed, carried_job.folder) == ("quadratic-mini", 0, folder)
    assert dict(carried_job.overrides) == {"epochs": 2} and job_state(carried_job) == "interrupted"
    assert job._job(job.RunSpec("mini-long", "quadratic-mini-finetune", 0, epochs=2), root) == carried_job
    with pytest.raises(ValueError, match="goes on with its own configuration, 2 epochs; drop @5"):
        job._job(job.RunSpec("mini-long", "quadratic-mini-finetune", 0, epochs=5), root)
    with pytest.raises(ValueError, match="no run folder of that name was carried along"):
        job._job(job.RunSpec("mini-long", "nothing-here", 0), root)

    unfinished = tmp_path / "unfinished"
    shutil.copytree(root, unfinished)
    manifest = job.pack(unfinished, [carried], tmp_path / "out-unfinished")
    assert [(e["state"], e["epochs"]) for e in manifest["runs"]] == [("interrupted", 1)]
    job.unpack(tmp_path / "out-unfinished", tmp_path / "results")
    back = tmp_path / "results" / carried.relative / "checkpoints"
    assert sorted(p.name for p in back.iterdir()) == ["epoch_0001.safetensors", "pruned.safetensors"]

    args = SimpleNamespace(run=job.RunSpec("mini-long", "quadratic-mini-finetune", 0).text, root=str(root),
                           compile=False, compile_mode="default", fused_optimizer=False, epochs=None, data=data,
                           device="cpu", train_subset=None)
    assert job._worker(args) == 0                    # the worker of a job, here on the CPU
    assert job_state(carried_job) == "finished"
    assert [r["epoch"] for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())] == [1, 2]
    manifest = job.pack(root, [carried], tmp_path / "out-finished")
    assert [(e["state"], e["epochs"]) for e in manifest["runs"]] == [("finished", 2)]
    assert manifest["runs"][0]["predictions"] == manifest["runs"][0]["test_accuracy"]
    job.unpack(tmp_path / "out-finished", tmp_path / "results")      # carries the unfinished copy further
    assert sorted(p.name for p in back.iterdir()) == ["last.safetensors", "pruned.safetensors"]
    assert json.loads((back.parent / "config.json").read_text())["init_from"] == "pruned.safetensors"
    assert torch.equal(load_checkpoint(back / "pruned.safetensors").model_state["head.weight"],
                       load_checkpoint(start).model_state["head.weight"])
