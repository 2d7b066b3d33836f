"""The measured choice of the attention path: timed once per machine and shape on a run's own layer,
cached as typed records, recorded."""

from __future__ import annotations

import json

import pytest
import torch

from attncnn.layers import build_attention
from attncnn.models import build_model, preset_model_config
from attncnn.perf import paths as path_choice
from attncnn.perf.cache import FORMAT
from attncnn.perf.machine import machine_record
from attncnn.perf.paths import choose_impl, choose_path, run_paths
from attncnn.perf.timing import paths_restored, run_impl, time_impls

CPU = torch.device("cpu")


def _model_config(**overrides):
    return preset_model_config("demo", 3, dim=16, mlp_dim=16, **overrides)[1]


def _records(cache) -> list[dict]:
    data = json.loads(cache.read_text())
    assert data["format"] == FORMAT
    return data["records"]


def test_time_impls_times_every_path_and_restores_the_layer():
    layer = build_attention("quadratic", 16, 4, impl="dense").train()
    timings = time_impls(layer, torch.randn(2, 12, 12, 16), reps=1)
    assert set(timings) == {"dense", "separable", "folded"} and all(t > 0 for t in timings.values())
    assert layer.impl == "dense" and all(p.grad is None for p in layer.parameters())


def test_time_impls_of_a_test_pass_times_the_forward_alone_and_restores_both_paths():
    layer = build_attention("gpsa", 16, 4, head_dim=4, impl="explicit-half", eval_impl="sdpa").eval()
    x = torch.randn(2, 6, 6, 16)
    timings = time_impls(layer, x, reps=1, backward=False)
    assert set(timings) == {"explicit", "explicit-half", "sdpa"} and all(t > 0 for t in timings.values())
    assert (layer.impl, layer.eval_impl) == ("explicit-half", "sdpa")
    assert all(p.grad is None for p in layer.parameters())


def test_a_path_that_raises_leaves_the_layer_on_its_own_paths_without_gradients():
    layer = build_attention("gpsa", 16, 4, head_dim=4, impl="explicit-half", eval_impl="sdpa").train()
    with pytest.raises(RuntimeError, match="a kernel failed"):
        with paths_restored(layer):
            run_impl(layer, torch.randn(2, 6, 6, 16), "explicit")        # leaves gradients, switches the path
            assert layer.impl == "explicit" and layer.eval_impl is None
            raise RuntimeError("a kernel failed")
    assert (layer.impl, layer.eval_impl) == ("explicit-half", "sdpa")
    assert all(p.grad is None for p in layer.parameters())


def test_a_test_pass_is_measured_in_eval_mode_without_gradients_and_cached_apart(choices_cache, monkeypatch):
    seen = []

    def fake(layer, x, **kw):
        seen.append((layer.training, kw["backward"]))
        return {"explicit": 0.3, "explicit-half": 0.1, "sdpa": 0.2} if kw["backward"] else \
            {"explicit": 0.3, "explicit-half": 0.2, "sdpa": 0.1}

    monkeypatch.setattr(path_choice, "time_impls", fake)
    convit = preset_model_config("convit-mini", 10)[1]
    common = dict(batch=4, image_size=(32, 32), precision="bf16", device=CPU)
    assert choose_impl(convit, **common)[0] == "explicit-half"
    assert choose_impl(convit, mode="eval", **common)[0] == "sdpa"
    assert seen == [(True, True), (False, False)]
    records = _records(choices_cache)
    assert [(r["choice"], r["run"]["mode"], r["value"]) for r in records] == [
        ("attention-path", "train", "explicit-half"), ("attention-path", "eval", "sdpa")]
    assert choose_impl(convit, mode="eval", **common) == ("sdpa", None, "cached")     # not measured
    with pytest.raises(ValueError, match="mode must be 'train' or 'eval'"):
        choose_impl(convit, mode="test", **common)


def test_a_measured_choice_is_a_typed_record_and_then_deterministic(choices_cache, monkeypatch):
    config = _model_config()
    impl, timings, how = choose_impl(config, batch=4, image_size=(32, 32), precision="fp32", device=CPU)
    assert how == "measured" and timings is not None and impl == min(timings, key=timings.get)
    (record,) = _records(choices_cache)
    assert record["machine"] == json.loads(json.dumps(machine_record(CPU)))
    assert record["run"] == {"kind": "quadratic", "dim": 16, "heads": 4, "head_dim": 16, "attn_dropout": 0.0,
                             "grid": [8, 8], "batch": 4, "precision": "fp32", "mode": "train",
                             "paths": ["dense", "separable", "folded"]}
    assert record["value"] == impl and record["measured"].count("-") == 2

    def no_timing(*args, **kwargs):
        raise AssertionError("a cached choice must not be measured again")

    monkeypatch.setattr(path_choice, "time_impls", no_timing)
    for _ in range(3):
        assert choose_impl(config, batch=4, image_size=(32, 32), precision="fp32", device=CPU) == (impl, None, "cached")
    # another shape is another record: measured (here: refused), not taken from the cache
    with pytest.raises(AssertionError, match="must not be measured"):
        choose_impl(config, batch=8, image_size=(32, 32), precision="fp32", device=CPU)


def test_a_record_of_another_machine_or_fewer_paths_is_not_taken(choices_cache, monkeypatch):
    """Lookup is by equality of the typed fields: a record measured among fewer paths (before a
    path existed) or on another machine is measured again, not reused."""
    layer = build_attention("quadratic", 16, 4)
    run = path_choice.path_run(layer, batch=4, grid=(16, 16), precision="fp32", mode="train",
                               paths=("dense", "separable", "folded"))
    here = machine_record(CPU)
    records = [{"choice": "attention-path", "machine": here, "run": {**run, "paths": ["dense", "separable"]},
                "value": "separable", "measured": "2026-11-01"},
               {"choice": "attention-path", "machine": {**here, "cpu": "Another CPU"}, "run": run,
                "value": "dense", "measured": "2026-11-01"}]
    choices_cache.parent.mkdir(parents=True)
    choices_cache.write_text(json.dumps({"format": FORMAT, "records": records}))
    monkeypatch.setattr(path_choice, "time_impls",
                        lambda layer, x, **kw: {"dense": 0.3, "separable": 0.2, "folded": 0.1})
    assert choose_path(layer, batch=4, grid=(16, 16), precision="fp32", device=CPU) == (
        "folded", {"dense": 0.3, "separable": 0.2, "folded": 0.1}, "measured")
    assert len(_records(choices_cache)) == 3                        # the others kept beside the new one


def test_the_fastest_path_is_chosen(choices_cache, monkeypatch):
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"dense": 0.2, "separable": 0.1})
    assert choose_impl(_model_config(), batch=4, image_size=(32, 32), precision="bf16",
                       device=CPU) == ("separable", {"dense": 0.2, "separable": 0.1}, "measured")
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"explicit": 0.3, "sdpa": 0.4})
    gpsa = preset_model_config("gpsa-mini", 3)[1]
    assert choose_impl(gpsa, batch=4, image_size=(32, 32), precision="bf16", device=CPU)[0] == "explicit"


#: seconds of one call of each path (sums exactly in binary)
FIRST_CALL = {"dense": 0.5, "separable": 0.125, "folded": 0.375}


def test_timing_pays_where_the_runs_calls_on_the_slowest_path_outlast_it():
    assert not path_choice.timing_pays(FIRST_CALL, uses=13)           # 13 x 0.5 = 6.5 s < 7 timed calls of each: 7 s
    assert path_choice.timing_pays(FIRST_CALL, uses=14)               # 7 s: a choice could pay
    assert path_choice.timing_pays(FIRST_CALL, uses=6, reps=3) and path_choice.REPS == 7     # 3 timed calls: 3 s


def test_a_run_too_short_for_timing_takes_the_fastest_first_call_and_caches_nothing(choices_cache, monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("a run this short must not be timed")

    monkeypatch.setattr(path_choice, "time_impls", no_timing)
    config = _model_config()
    common = dict(batch=4, image_size=(32, 32), precision="fp32", device=CPU)
    impl, first, how = choose_impl(config, uses=1, **common)           # the real layer, each path called once
    assert how == "one call each" and set(first) == {"dense", "separable", "folded"}
    assert all(t > 0 for t in first.values()) and impl == min(first, key=first.get)
    assert not choices_cache.exists()

    monkeypatch.setattr(path_choice, "_working_paths", lambda *a, **k: dict(FIRST_CALL))
    assert choose_impl(config, uses=13, **common) == ("separable", FIRST_CALL, "one call each")
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"dense": 0.1, "separable": 0.3,
                                                                            "folded": 0.2})
    assert choose_impl(config, uses=14, **common)[::2] == ("dense", "measured")     # timed, and cached
    assert [r["value"] for r in _records(choices_cache)] == ["dense"]


def _demo():
    torch.manual_seed(0)
    return build_model("demo", 3, dim=16, mlp_dim=16)   # 2 quadratic attention blocks, pooling 4: an 8x8 grid


def test_a_runs_steps_and_test_passes_decide_whether_its_paths_are_timed(choices_cache, monkeypatch, caplog):
    """A run's calls of its attention layers: steps x layers in training, test batches over its test
    passes x layers (the first call of each path here: 0.5, 0.125, 0.375 s)."""
    timed = []
    monkeypatch.setattr(path_choice, "_working_paths", lambda *a, **k: dict(FIRST_CALL))
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        timed.append(backward) or {"dense": 0.1, "separable": 0.3, "folded": 0.2})
    common = dict(image_size=(32, 32), batch=4, eval_batch=4, precision="fp32", device=CPU)
    # 6 steps x 2 layers = 12 calls: not timed; 6 test batches x 2 layers = 12 calls: not timed
    with caplog.at_level("INFO", logger="attncnn.perf.paths"):
        assert run_paths(_demo(), steps=6, test_calls=6, **common) == ("separable", None) and timed == []
    assert "the run's 12 calls of the layer take less than timing 7 more of each would; not cached" in caplog.text
    # 7 steps: 14 calls, timed; the test passes still not
    assert run_paths(_demo(), steps=7, test_calls=6, **common) == ("dense", "separable") and timed == [True]
    timed.clear()                           # cached now; 15 test batches: 30 calls, timed
    assert run_paths(_demo(), steps=1, test_calls=15, **common) == ("dense", None) and timed == [False]


@pytest.mark.parametrize("eval_timings,expected", [
    ({"dense": 0.1, "separable": 0.2}, ("dense", None)),             # the same path: unset
    ({"dense": 0.2, "separable": 0.1}, ("dense", "separable")),
])
def test_a_run_evaluates_with_its_fastest_test_pass_path(choices_cache, monkeypatch, eval_timings, expected):
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        {"dense": 0.1, "separable": 0.2} if backward else eval_timings)
    assert run_paths(_demo(), image_size=(32, 32), batch=4, eval_batch=50, precision="fp32", device=CPU) == expected


def test_the_paths_are_timed_on_the_runs_own_layer_and_batches(choices_cache, monkeypatch):
    seen = []
    model = _demo()
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        seen.append((layer, backward, tuple(x.shape))) or {"dense": 0.1, "separable": 0.2})
    run_paths(model, image_size=(32, 32), batch=4, eval_batch=7, precision="fp32", device=CPU)
    first = model.blocks[0].attention
    assert seen == [(first, True, (4, 8, 8, 16)), (first, False, (7, 8, 8, 16))]
    assert run_paths(model, image_size=(32, 32), batch=4, eval_batch=None, precision="fp32",
                     device=CPU) == ("dense", None) and len(seen) == 2          # cached; no test-pass choice asked
    resnet = build_model("resnet18-mini", 3)
    assert run_paths(resnet, image_size=(32, 32), batch=4, eval_batch=4, precision="fp32", device=CPU) == (None, None)


def test_a_cached_path_that_does_not_exist_is_dropped_with_a_warning_and_measured_again(choices_cache, monkeypatch,
                                                                                      caplog):
    """An edited cache naming no real path used to reach the layer as the run's eval_impl and
    refuse training with advice about an option the user never set."""
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        {"dense": 0.1, "separable": 0.2} if backward else {"dense": 0.2, "separable": 0.1})
    layer = _demo().blocks[0].attention
    paths = ("dense", "separable", "folded")
    here = machine_record(CPU)
    train = path_choice.path_run(layer, batch=4, grid=(8, 8), precision="fp32", mode="train", paths=paths)
    test = path_choice.path_run(layer, batch=50, grid=(8, 8), precision="fp32", mode="eval", paths=paths)
    records = [{"choice": "attention-path", "machine": here, "run": train, "value": "separable"},
               {"choice": "attention-path", "machine": here, "run": test, "value": "turbo"},
               {"choice": "attention-path", "machine": here, "run": {"paths": ["dense"]}, "value": 3},
               {"choice": "attention-path", "machine": "here", "run": {}, "value": "dense"}]
    choices_cache.parent.mkdir(parents=True)
    choices_cache.write_text(json.dumps({"format": FORMAT, "records": records}))
    with caplog.at_level("WARNING"):
        assert run_paths(_demo(), image_size=(32, 32), batch=4, eval_batch=50, precision="fp32",
                         device=CPU) == ("separable", None)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 3 and all(w.startswith(f"{choices_cache}: ignoring a") for w in warnings), warnings
    assert "its 'machine' must be a JSON object, got 'here'" in warnings[0]
    assert "the attention path 'turbo', which is not one of dense, folded, separable" in warnings[1]
    assert "an attention path's name was expected, got 3" in warnings[2]
    assert [(r["run"]["mode"], r["value"]) for r in _records(choices_cache)] == [("train", "separable"),
                                                                               ("eval", "separable")]


@pytest.mark.parametrize("run,value,ok", [
    ({"paths": ["dense", "separable"]}, "separable", True),
    ({"paths": ["dense", "separable"]}, "folded", False),                        # not among those compared
    ({"paths": ["dense", "bogus"]}, "bogus", False),
    ({}, "dense", False),                                                         # no paths compared
    ({"paths": ["dense"]}, None, False),
])
def test_which_cached_paths_are_taken(run, value, ok):
    assert (path_choice.path_problem(run, value) is None) is ok


def test_a_path_that_fails_here_is_left_out_of_the_choice_with_a_warning(choices_cache, monkeypatch, caplog):
    """A fused kernel a device or torch build lacks can raise where the other paths run: the run
    then chooses among the others (and says which failed), instead of stopping."""
    from attncnn.layers.learned_content import LearnedRelativeContentAttention
    real = LearnedRelativeContentAttention.forward

    def forward(self, x, return_attention=False):
        if self.path() == "explicit-onehot":
            raise RuntimeError("no kernel for this\nsecond line")
        return real(self, x, return_attention)

    monkeypatch.setattr(LearnedRelativeContentAttention, "forward", forward)
    config = preset_model_config("learned-content-mini", 10, num_layers=1, dim=16, max_size=4)[1]
    with caplog.at_level("WARNING"):
        impl, timings, _ = choose_impl(config, batch=2, image_size=(8, 8), precision="fp32", device=CPU)
    assert set(timings) == {"explicit", "explicit-half", "sdpa", "bilinear"} and impl in timings
    assert any("attention path explicit-onehot failed on cpu (RuntimeError: no kernel for this); it is left out"
               in r.getMessage() for r in caplog.records)

    def broken(self, x, return_attention=False):
        raise RuntimeError("nothing runs")

    monkeypatch.setattr(LearnedRelativeContentAttention, "forward", broken)
    with pytest.raises(RuntimeError, match="nothing runs"):
        choose_impl(config, batch=2, image_size=(8, 8), precision="fp32", device=CPU, mode="eval")
