"""Whether a run compiles: measured on its own model and optimizer, only where it can pay back,
cached as typed records, recorded."""

from __future__ import annotations

import json

import pytest
import torch

from attncnn.models import build_model
from attncnn.perf import compiling as compile_choice
from attncnn.perf.cache import FORMAT
from attncnn.perf.compiling import CompileTiming, choose_compile, compile_run, pays_back, time_compile
from attncnn.perf.machine import machine_record
from attncnn.runs import resolve_config
from attncnn.training import make_optimizer

CPU = torch.device("cpu")
SMALL = {"dim": 16, "mlp_dim": 16}
TIMING = {"eager": 0.4, "compiled": 0.2, "warmup": 20.0}


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


def _record(run, value, machine=None) -> dict:
    return {"choice": "compile", "machine": machine or machine_record(CPU), "run": run, "value": value,
            "measured": "2026-11-29"}


def _write(cache, records) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"format": FORMAT, "records": records}))


def _records(cache) -> list[dict]:
    return json.loads(cache.read_text())["records"]


def test_the_warm_up_floor_is_this_machines_shortest_recorded_compilation(monkeypatch):
    here = json.loads(json.dumps(machine_record(CPU)))
    records = [_record({"preset": "a"}, {"eager": 1, "compiled": 0.5, "warmup": 12.0}, here),
               _record({"preset": "b"}, {"eager": 1, "compiled": 0.5, "warmup": 7.5}, here),
               _record({"preset": "a"}, {"eager": 1, "compiled": 0.5, "warmup": 0.1}, {**here, "cpu": "another"})]
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("nothing is compiled when a record exists"))
    assert compile_choice.warmup_floor(CPU, records) == (7.5, "the shortest compilation recorded on this machine")


def test_without_a_record_the_floor_is_a_one_operation_compilation_timed_once(monkeypatch):
    compiled = []

    def fake_compile(fn, **kwargs):
        compiled.append(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(compile_choice, "_FIRST_COMPILE", {})
    other = _record({}, {"warmup": 0.1}, {**machine_record(CPU), "cpu": "another"})
    seconds, source = compile_choice.warmup_floor(CPU, [json.loads(json.dumps(other))])
    assert seconds > 0 and source == "a one-operation compilation, measured now"
    assert compile_choice.warmup_floor(CPU, None) == (seconds, source)     # once per process and device
    assert compiled == [{"dynamic": False}]


def _run(**overrides):
    """``(model, optimizer, config, choose_compile's keywords)`` of a small demo run of 2 x 1,000 steps."""
    config = resolve_config("demo", model=dict(SMALL), epochs=2)
    torch.manual_seed(0)
    model = build_model("demo", 3, **SMALL)
    kw = dict(model_options=dict(SMALL), image_shape=(3, 32, 32), num_classes=3, batch=4, precision="fp32",
              device=CPU, steps=2000)
    kw.update(overrides)
    return model, make_optimizer(model, config), config, kw


def test_a_measurement_on_the_runs_own_objects_is_cached_and_then_decides_by_the_run_length(choices_cache,
                                                                                           monkeypatch):
    calls = []
    model, optimizer, config, kw = _run()

    def fake(net, opt, images, labels, **probe):
        calls.append((net is model, opt is optimizer, tuple(images.shape), int(labels.max()) < 3, probe["precision"],
                      net.training, probe["steps"]))
        return CompileTiming(**TIMING)

    monkeypatch.setattr(compile_choice, "time_compile", fake)
    monkeypatch.setattr(compile_choice, "warmup_floor", lambda device, records: (1.0, "test"))
    model.eval()                                # the probe trains in train mode; the mode comes back
    assert choose_compile(model, optimizer, config, **kw) is True      # 800 s eager, saves 400 s, costs 20
    assert calls == [(True, True, (4, 3, 32, 32), True, "fp32", True, 2000)] and not model.training
    (record,) = _records(choices_cache)
    assert record["run"] == {"preset": "demo", "model": SMALL, "optimizer": "sgd", "image": [32, 32], "batch": 4,
                             "precision": "fp32"}
    assert record["run"] == compile_run(config, SMALL, batch=4, image_size=(32, 32), precision="fp32")
    assert record["value"] == TIMING and record["machine"] == json.loads(json.dumps(machine_record(CPU)))
    for _ in range(2):                                           # from the cache: the same answer, no timing
        assert choose_compile(model, optimizer, config, **kw) is True
    # the same shape in a run of 100 steps: saves 20 s, no more than the warm-up: off, from the same cache
    assert choose_compile(model, optimizer, config, **{**kw, "steps": 100}) is False
    # 200 steps save 40 s > 20 s: on, from the same cache (no minimum run length)
    assert choose_compile(model, optimizer, config, **{**kw, "steps": 200}) is True
    assert len(calls) == 1
    # another model option (the attention path taken) is another record: measured again
    choose_compile(model, optimizer, config, **{**kw, "model_options": {**SMALL, "impl": "dense"}})
    assert len(calls) == 2 and len(_records(choices_cache)) == 2


def test_a_run_shorter_than_the_floor_is_timed_eager_only_and_not_cached(choices_cache, monkeypatch, caplog):
    """The real probe on a tiny network: a few eager steps, far under the warm-up floor, so no compilation."""
    monkeypatch.setattr(compile_choice, "warmup_floor", lambda device, records: (30.0, "a test's floor"))
    model, optimizer, config, kw = _run(steps=6)
    with caplog.at_level("INFO"):
        assert choose_compile(model, optimizer, config, **kw) is False
    assert not choices_cache.exists()
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


def test_a_compiler_failure_means_training_eager(choices_cache, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore")

    monkeypatch.setattr(compile_choice, "time_compile", broken)
    model, optimizer, config, kw = _run()
    with caplog.at_level("WARNING"):
        assert choose_compile(model, optimizer, config, **kw) is False
    assert "torch.compile failed on this machine, training without it (RuntimeError: no C++ compiler found)" \
        in caplog.text
    assert not choices_cache.exists()


@pytest.mark.slow
def test_time_compile_times_both_and_the_compiled_step_trains_the_same_network():
    torch.manual_seed(0)
    model = build_model("demo", 3, **SMALL).train()
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    timing = time_compile(model, make_optimizer(model, resolve_config("demo")), images, labels, precision="fp32",
                          reps=1)
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
def test_a_bad_cached_timing_is_dropped_with_one_warning_and_measured_again(choices_cache, monkeypatch, caplog,
                                                                           entry, problem):
    calls = []
    monkeypatch.setattr(compile_choice, "time_compile", lambda *a, **kw: calls.append(1) or CompileTiming(**TIMING))
    model, optimizer, config, kw = _run()
    run = compile_run(config, SMALL, batch=4, image_size=(32, 32), precision="fp32")
    other = _record({**run, "batch": 8}, {"eager": 1, "compiled": 2, "warmup": 3})
    _write(choices_cache, [_record(run, entry), other])
    with caplog.at_level("WARNING"):
        for _ in range(2):                                      # the second run reads the repaired cache
            assert choose_compile(model, optimizer, config, **kw) is True
    assert len(calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(choices_cache) in warnings[0] and problem in warnings[0], warnings
    assert [(r["run"]["batch"], r["value"]) for r in _records(choices_cache)] == [(8, other["value"]), (4, TIMING)]


@pytest.mark.parametrize("text,problem", [
    ("{not json", "unreadable (JSONDecodeError"),
    ("[1, 2]", "it holds a JSON list, not format 1's"),
    ("\xff\xfe", "unreadable ("),
    ('{"a | b": {"eager": 1}}', "it holds format None, not format 1's"),        # an old keyed file's layout
    ('{"format": 2, "records": []}', "it holds format 2, not format 1's"),
])
def test_a_corrupt_cache_file_is_named_in_a_warning_and_rewritten(choices_cache, monkeypatch, caplog, text, problem):
    monkeypatch.setattr(compile_choice, "time_compile", lambda *a, **kw: CompileTiming(**TIMING))
    choices_cache.parent.mkdir(parents=True)
    choices_cache.write_bytes(text.encode("latin-1"))
    model, optimizer, config, kw = _run()
    with caplog.at_level("WARNING"):
        assert choose_compile(model, optimizer, config, **kw) is True
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"{choices_cache}: ignoring the speed-measurement "
                                                         "cache"), warnings
    assert problem in warnings[0]
    assert len(_records(choices_cache)) == 1


def test_a_cache_that_cannot_be_written_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path / "file" / "below"))       # a folder under a file
    monkeypatch.setattr(compile_choice, "time_compile", lambda *a, **kw: CompileTiming(**TIMING))
    model, optimizer, config, kw = _run()
    with caplog.at_level("WARNING"):
        assert choose_compile(model, optimizer, config, **kw) is True
    assert any(r.getMessage().startswith("could not cache a speed measurement in ") for r in caplog.records)


def test_an_estimate_finds_this_machines_measurement_whatever_path_it_took(choices_cache):
    """The dry run of a suite knows no run's attention path yet: of the cached measurements that
    differ from its shape only in the path, it takes the fastest eager one; any other shape, preset
    or machine is not it."""
    config = resolve_config("learned-content-mini")
    other = resolve_config("quadratic-mini")

    def run(recipe, model, batch=100):
        return compile_run(recipe, {**recipe.model, **model}, batch=batch, image_size=(32, 32), precision="fp32")

    here = run(config, {"impl": "sdpa"})
    _write(choices_cache, [
        _record(run(config, {"impl": "explicit-onehot"}), {"eager": 1.4, "compiled": 1.2, "warmup": 20.0}),
        _record(run(config, {"impl": "explicit-half", "eval_impl": "sdpa"}),
                {"eager": 1.9, "compiled": 1.3, "warmup": 25.0}),
        _record(run(config, {"impl": "sdpa"}, batch=50), {"eager": 0.5, "compiled": 0.4, "warmup": 20.0}),
        _record(run(other, {"impl": "folded"}), {"eager": 0.3, "compiled": 0.28, "warmup": 24.0}),
        _record(here, {"eager": 0.1, "compiled": 0.05, "warmup": 9.0}, {**machine_record(CPU), "cpu": "another"}),
    ])
    estimate = dict(batch=100, image_size=(32, 32), precision="fp32", device=CPU)
    assert compile_choice.cached_timing(config, **estimate) == CompileTiming(1.4, 1.2, 20.0)
    assert compile_choice.cached_timing(config, **{**estimate, "batch": 64}) is None
    assert compile_choice.cached_timing(config, **{**estimate, "precision": "bf16"}) is None
    assert compile_choice.cached_timing(other, **estimate) == CompileTiming(0.3, 0.28, 24.0)
    # another model option is another shape
    wider = resolve_config("learned-content-mini", model={"dim": 32})
    assert compile_choice.cached_timing(wider, **estimate) is None
