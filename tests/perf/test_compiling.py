"""Whether a run compiles: measured on its own training step, only where it can pay back, cached, recorded."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attncnn.models import build_model
from attncnn.perf import compiling as compile_choice
from attncnn.perf.compiling import (CACHE_NAME, CompileTiming, compile_cache_key, pays_back, time_compile,
                                    with_compile_choice)
from attncnn.runs import resolve_config
from attncnn.training import make_optimizer
from planned_runs import planned

CPU = torch.device("cpu")
SMALL = {"dim": 16, "mlp_dim": 16}


@pytest.mark.parametrize("timing,steps,expected", [
    (CompileTiming(eager=1.0, compiled=0.5, warmup=30.0), 100, True),      # saves 50 s, costs 30
    (CompileTiming(eager=1.0, compiled=0.5, warmup=30.0), 50, False),      # saves 25 s: less than the warm-up
    (CompileTiming(eager=1.0, compiled=0.95, warmup=1.0), 10_000, False),  # 1.05x: inside the margin
    (CompileTiming(eager=1.0, compiled=1.2, warmup=1.0), 10_000, False),   # slower compiled
    (CompileTiming(eager=1.0), 10_000, False),                             # compiled not measured
    (CompileTiming(eager=0.1, compiled=0.01, warmup=0.5), 100, True),      # a 10 s run: no minimum length
])
def test_compiling_is_chosen_only_where_it_pays_back(timing, steps, expected):
    assert pays_back(timing, steps) is expected


def test_the_warm_up_floor_is_this_machines_shortest_recorded_compilation(monkeypatch):
    from attncnn.perf.machine import machine_key
    here = machine_key(CPU)
    cache = {f"{here} | demo a": {"eager": 1, "compiled": 0.5, "warmup": 12.0},
             f"{here} | demo b": {"eager": 1, "compiled": 0.5, "warmup": 7.5},
             "another machine | demo a": {"eager": 1, "compiled": 0.5, "warmup": 0.1}}
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("nothing is compiled when a record exists"))
    assert compile_choice.warmup_floor(CPU, cache) == (7.5, "the shortest compilation recorded on this machine")


def test_without_a_record_the_floor_is_a_one_operation_compilation_timed_once(monkeypatch):
    compiled = []

    def fake_compile(fn, **kwargs):
        compiled.append(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(compile_choice, "_FIRST_COMPILE", {})
    seconds, source = compile_choice.warmup_floor(CPU, {"another machine | x": {"warmup": 0.1}})
    assert seconds > 0 and source == "a one-operation compilation, measured now"
    assert compile_choice.warmup_floor(CPU, None) == (seconds, source)     # once per process and device
    assert compiled == [{"dynamic": False}]


def _parts(*, steps_per_epoch=1000):
    dataset = SimpleNamespace(num_classes=3, train=SimpleNamespace(images=torch.zeros(1, 3, 32, 32, dtype=torch.uint8)))
    loader = type("Loader", (), {"batch_size": 4, "__len__": lambda self: steps_per_epoch})()
    dist = SimpleNamespace(enabled=False, device=CPU)
    return dataset, loader, dist


def _config(tmp_path, **overrides):
    values = dict(data_dir=str(tmp_path), model=dict(SMALL), precision="fp32", epochs=2)
    values.update(overrides)
    return planned("demo", **values)


@pytest.fixture
def timed(monkeypatch) -> list:
    """The calls of the probe (which would fail here: a test asserts there were none)."""
    calls = []

    def record(*args, **kwargs):
        calls.append(kwargs)
        raise RuntimeError("this run must not be measured")

    monkeypatch.setattr(compile_choice, "time_compile", record)
    return calls


@pytest.mark.parametrize("change,expected", [
    ({"compile": True}, True),                # given: kept, nothing measured
    ({"compile": False}, False),
    ({"deterministic": True}, False),         # unset, but a deterministic run never compiles unasked
])
def test_runs_that_are_not_measured(tmp_path, timed, change, expected):
    config = _config(tmp_path, **change)
    assert with_compile_choice(config, *_parts()).compile is expected
    assert timed == []


def test_runs_under_torchrun_do_not_compile_unasked(tmp_path, timed):
    dataset, loader, _ = _parts()
    assert with_compile_choice(_config(tmp_path), dataset, loader, SimpleNamespace(enabled=True, device=CPU)).compile \
        is False
    assert timed == []


def test_a_measurement_is_cached_and_then_decides_by_the_run_length(tmp_path, monkeypatch):
    calls = []

    def fake(model, optimizer, images, labels, **kw):
        calls.append((tuple(images.shape), kw["precision"], type(optimizer).__name__, model.training))
        return CompileTiming(eager=0.4, compiled=0.2, warmup=20.0)

    monkeypatch.setattr(compile_choice, "time_compile", fake)
    monkeypatch.setattr(compile_choice, "warmup_floor", lambda device, cache: (1.0, "test"))
    dataset, loader, dist = _parts()
    config = _config(tmp_path)                   # 2 epochs of 1,000 steps: 800 s eager, saves 400 s, costs 20
    assert with_compile_choice(config, dataset, loader, dist).compile is True
    assert calls == [((4, 3, 32, 32), "fp32", "SGD", True)]
    cache = json.loads((tmp_path / CACHE_NAME).read_text())
    key = compile_cache_key(config, 4, (32, 32), CPU)
    assert cache == {key: {"eager": 0.4, "compiled": 0.2, "warmup": 20.0}}
    assert "demo model=" in key and "optimizer=sgd" in key and "batch=4 fp32" in key
    for _ in range(2):                                           # from the cache: the same answer, no timing
        assert with_compile_choice(config, dataset, loader, dist).compile is True
    # the same shape in a run of 100 steps: saves 20 s, no more than the warm-up: off, from the same cache
    short = config.replace(epochs=1)
    assert with_compile_choice(short, *_parts(steps_per_epoch=100)).compile is False
    # 200 steps save 40 s > 20 s: on, from the same cache (no minimum run length)
    assert with_compile_choice(short, *_parts(steps_per_epoch=200)).compile is True
    assert len(calls) == 1
    # another model option is another key: measured again
    with_compile_choice(_config(tmp_path, model={**SMALL, "impl": "dense"}), dataset, loader, dist)
    assert len(calls) == 2 and len(json.loads((tmp_path / CACHE_NAME).read_text())) == 2


def test_a_run_shorter_than_the_floor_is_timed_eager_only_and_not_cached(tmp_path, monkeypatch, caplog):
    """The real probe on a tiny network: a few eager steps, far under the warm-up floor, so no compilation."""
    monkeypatch.setattr(compile_choice, "warmup_floor", lambda device, cache: (30.0, "a test's floor"))
    dataset, loader, dist = _parts(steps_per_epoch=3)
    with caplog.at_level("INFO"):
        assert with_compile_choice(_config(tmp_path), dataset, loader, dist).compile is False
    assert not (tmp_path / CACHE_NAME).exists()
    assert ("less than timing a compilation would: 30.0 s to compile, a test's floor, and up to 9 more steps"
            in caplog.text)


def test_the_probe_stops_where_the_rest_of_it_would_outlast_the_run(monkeypatch):
    """Each step timed at 1 s: the rest of the probe (the warm-up floor, then 2 eager steps and 7 more
    after the first; 7 after the eager timing) against the run's eager seconds. A run of 8 steps stops
    after its first step even with no warm-up at all; 9 steps go on to compile."""
    assert compile_choice.probe_steps() == 7 and compile_choice.probe_steps(reps=5) == 11

    def compiled(*args, **kwargs):
        raise AssertionError("the probe went on to compile")

    monkeypatch.setattr(torch, "compile", compiled)
    model = build_model("demo", 3, **SMALL).train()
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    optimizer = make_optimizer(model, resolve_config("demo"))
    probe = dict(precision="fp32", min_run_seconds=0.0)
    calls = []
    monkeypatch.setattr(compile_choice, "seconds", lambda fn, device: calls.append(fn) or 1.0)
    assert time_compile(model, optimizer, images, labels, steps=8, **probe) == CompileTiming(eager=1.0)
    assert len(calls) == 1                                                  # 8 s < 0 s + 9 s: after the first step
    assert time_compile(model, optimizer, images, labels, steps=13, **{**probe, "min_run_seconds": 5.0}) == \
        CompileTiming(eager=1.0)                                            # 13 s < 5 s + 9 s
    # a first step twice as slow as the rest (first touch): 15 x 2 s >= 10 s + 9 x 2 s goes on, and then
    # 15 x 1 s < 10 s + 7 s stops after the eager timing
    times = iter([2.0, 1.0, 1.0])
    monkeypatch.setattr(compile_choice, "seconds", lambda fn, device: next(times))
    assert time_compile(model, optimizer, images, labels, steps=15, **{**probe, "min_run_seconds": 10.0}) == \
        CompileTiming(eager=1.0)
    monkeypatch.setattr(compile_choice, "seconds", lambda fn, device: 1.0)
    with pytest.raises(AssertionError, match="went on to compile"):
        time_compile(model, optimizer, images, labels, steps=9, **probe)


def test_a_compiler_failure_means_training_eager(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore")

    monkeypatch.setattr(compile_choice, "time_compile", broken)
    with caplog.at_level("WARNING"):
        assert with_compile_choice(_config(tmp_path), *_parts()).compile is False
    assert "torch.compile failed on this machine, training without it (RuntimeError: no C++ compiler found)" \
        in caplog.text
    assert not (tmp_path / CACHE_NAME).exists()


@pytest.mark.slow
def test_time_compile_times_both_and_the_compiled_step_trains_the_same_network():
    torch.manual_seed(0)
    model = build_model("demo", 3, **SMALL).train()
    config = planned("demo", model=dict(SMALL), precision="fp32")
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    timing = time_compile(model, make_optimizer(model, config), images, labels, precision="fp32", reps=1)
    assert timing.eager > 0 and timing.compiled > 0 and timing.warmup > 0
    # the first compiled step traced the network (no timing bound: a busy machine slows any step)
    assert counters["stats"]["unique_graphs"] > graphs
    assert timing.speedup == pytest.approx(timing.eager / timing.compiled)
    assert model.training and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("entry,problem", [
    ({"eager": None, "compiled": 0.2, "warmup": 20.0}, "'eager' must be a positive number of seconds, got None"),
    ({"eager": 0.4, "compiled": "fast", "warmup": 20.0}, "'compiled' must be a positive number of seconds, got 'fast'"),
    ({"eager": 0.4, "compiled": 0.2}, "it has no 'warmup' seconds"),
    ({"eager": 0.4, "compiled": 0.0, "warmup": 20.0}, "'compiled' must be a positive number"),     # a ratio's divisor
    ([0.4, 0.2, 20.0], "a timing must be an object of eager, compiled, warmup seconds"),
])
def test_a_bad_cached_timing_is_dropped_with_one_warning_and_measured_again(tmp_path, monkeypatch, caplog,
                                                                           entry, problem):
    calls = []
    monkeypatch.setattr(compile_choice, "time_compile",
                        lambda *a, **kw: calls.append(1) or CompileTiming(eager=0.4, compiled=0.2, warmup=20.0))
    config = _config(tmp_path)
    key = compile_cache_key(config, 4, (32, 32), CPU)
    other = "another machine | demo"
    (tmp_path / CACHE_NAME).write_text(json.dumps({key: entry, other: {"eager": 1, "compiled": 2, "warmup": 3}}))
    with caplog.at_level("WARNING"):
        for _ in range(2):                                      # the second run reads the repaired cache
            assert with_compile_choice(config, *_parts()).compile is True
    assert len(calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(tmp_path / CACHE_NAME) in warnings[0] and problem in warnings[0], warnings
    assert json.loads((tmp_path / CACHE_NAME).read_text()) == {               # the good entries kept
        key: {"eager": 0.4, "compiled": 0.2, "warmup": 20.0}, other: {"eager": 1, "compiled": 2, "warmup": 3}}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff\xfe"])
def test_a_corrupt_cache_file_is_named_in_a_warning_and_rewritten(tmp_path, monkeypatch, caplog, text):
    monkeypatch.setattr(compile_choice, "time_compile",
                        lambda *a, **kw: CompileTiming(eager=0.4, compiled=0.2, warmup=20.0))
    (tmp_path / CACHE_NAME).write_bytes(text.encode("latin-1"))
    with caplog.at_level("WARNING"):
        assert with_compile_choice(_config(tmp_path), *_parts()).compile is True
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"{tmp_path / CACHE_NAME}: ignoring the speed-measurement "
                                                         "cache"), warnings
    assert len(json.loads((tmp_path / CACHE_NAME).read_text())) == 1


def test_an_estimate_finds_this_machines_measurement_whatever_path_it_took(tmp_path):
    """The dry run of a suite knows no run's attention path yet: of the cached measurements that
    differ from its shape only in the path, it takes the fastest eager one; any other shape, preset
    or machine is not it, and entries of presets whose paths this one lacks do not trip it."""
    config = planned("learned-content-mini", data_dir=str(tmp_path), precision="fp32")

    def key(preset_config, model, batch=100):
        return compile_cache_key(preset_config, batch, (32, 32), CPU, model=model)

    other = planned("quadratic-mini", data_dir=str(tmp_path), precision="fp32")
    entries = {
        key(config, {"impl": "explicit-onehot"}): {"eager": 1.4, "compiled": 1.2, "warmup": 20.0},
        key(config, {"impl": "explicit-half", "eval_impl": "sdpa"}): {"eager": 1.9, "compiled": 1.3, "warmup": 25.0},
        key(config, {"impl": "sdpa"}, batch=50): {"eager": 0.5, "compiled": 0.4, "warmup": 20.0},
        key(other, {"impl": "folded"}): {"eager": 0.3, "compiled": 0.28, "warmup": 24.0},
    }
    here = key(config, {"impl": "sdpa"})
    entries["another machine" + here[here.index(" | "):]] = {"eager": 0.1, "compiled": 0.05, "warmup": 9.0}
    (tmp_path / CACHE_NAME).write_text(json.dumps(entries))
    assert compile_choice.cached_timing(config, 100, (32, 32), CPU) == CompileTiming(1.4, 1.2, 20.0)
    assert compile_choice.cached_timing(config, 64, (32, 32), CPU) is None
    assert compile_choice.cached_timing(config.replace(precision="bf16"), 100, (32, 32), CPU) is None
    assert compile_choice.cached_timing(other, 100, (32, 32), CPU) == CompileTiming(0.3, 0.28, 24.0)
    # another model option is another shape
    wider = planned("learned-content-mini", data_dir=str(tmp_path), precision="fp32", model={"dim": 32})
    assert compile_choice.cached_timing(wider, 100, (32, 32), CPU) is None
