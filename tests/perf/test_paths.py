"""The measured choice of the attention path: timed once per machine and shape, cached, recorded."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attncnn.layers import build_attention
from attncnn.models import preset_model_config
from attncnn.perf import paths as path_choice
from attncnn.perf.paths import CACHE_NAME, choose_impl, with_measured_paths
from attncnn.perf.timing import paths_restored, run_impl, time_impls
from planned_runs import planned

CPU = torch.device("cpu")


def _model_config(**overrides):
    return preset_model_config("demo", 3, dim=16, mlp_dim=16, **overrides)[1]


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


def test_a_test_pass_is_measured_in_eval_mode_without_gradients_and_cached_apart(tmp_path, monkeypatch):
    seen = []

    def fake(layer, x, **kw):
        seen.append((layer.training, kw["backward"]))
        return {"explicit": 0.3, "explicit-half": 0.1, "sdpa": 0.2} if kw["backward"] else \
            {"explicit": 0.3, "explicit-half": 0.2, "sdpa": 0.1}

    monkeypatch.setattr(path_choice, "time_impls", fake)
    convit = preset_model_config("convit-mini", 10)[1]
    common = dict(batch=4, image_size=(32, 32), precision="bf16", device=CPU, cache_dir=tmp_path)
    assert choose_impl(convit, **common)[0] == "explicit-half"
    assert choose_impl(convit, mode="eval", **common)[0] == "sdpa"
    assert seen == [(True, True), (False, False)]
    cache = json.loads((tmp_path / CACHE_NAME).read_text())
    assert sorted(cache.values()) == ["explicit-half", "sdpa"]
    assert [k for k, v in cache.items() if v == "sdpa"][0].endswith(" | test pass")
    assert choose_impl(convit, mode="eval", **common) == ("sdpa", None, "cached")     # not measured
    with pytest.raises(ValueError, match="mode must be 'train' or 'eval'"):
        choose_impl(convit, mode="test", **common)


def test_a_measured_choice_is_cached_and_then_deterministic(tmp_path, monkeypatch):
    config = _model_config()
    impl, timings, how = choose_impl(config, batch=4, image_size=(32, 32), precision="fp32", device=CPU,
                                     cache_dir=tmp_path)
    assert how == "measured" and timings is not None and impl == min(timings, key=timings.get)
    cache = json.loads((tmp_path / CACHE_NAME).read_text())
    assert list(cache.values()) == [impl] and "quadratic dim=16 heads=4" in next(iter(cache))
    assert next(iter(cache)).endswith(" paths=dense,separable,folded")      # the paths it chose among

    def no_timing(*args, **kwargs):
        raise AssertionError("a cached choice must not be measured again")

    monkeypatch.setattr(path_choice, "time_impls", no_timing)
    for _ in range(3):
        assert choose_impl(config, batch=4, image_size=(32, 32), precision="fp32", device=CPU,
                           cache_dir=tmp_path) == (impl, None, "cached")
    # another shape is another key: measured (here: refused), not taken from the cache
    with pytest.raises(AssertionError, match="must not be measured"):
        choose_impl(config, batch=8, image_size=(32, 32), precision="fp32", device=CPU, cache_dir=tmp_path)


def test_a_choice_made_among_fewer_paths_is_measured_again(tmp_path, monkeypatch):
    """A cache written before a path existed (its key names other paths, or none) is not reused."""
    config = _model_config()
    key = path_choice.path_cache_key(config, 4, (16, 16), "fp32", CPU, ("dense", "separable"))
    (tmp_path / CACHE_NAME).write_text(json.dumps({key: "separable", key.rsplit(" paths=", 1)[0]: "dense"}))
    monkeypatch.setattr(path_choice, "time_impls",
                        lambda layer, x, **kw: {"dense": 0.3, "separable": 0.2, "folded": 0.1})
    assert choose_impl(config, batch=4, image_size=(32, 32), precision="fp32", device=CPU,
                       cache_dir=tmp_path)[0] == "folded"


def test_the_fastest_path_is_chosen(tmp_path, monkeypatch):
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"dense": 0.2, "separable": 0.1})
    assert choose_impl(_model_config(), batch=4, image_size=(32, 32), precision="bf16", device=CPU,
                       cache_dir=tmp_path) == ("separable", {"dense": 0.2, "separable": 0.1}, "measured")
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"explicit": 0.3, "sdpa": 0.4})
    gpsa = preset_model_config("gpsa-mini", 3)[1]
    assert choose_impl(gpsa, batch=4, image_size=(32, 32), precision="bf16", device=CPU,
                       cache_dir=tmp_path)[0] == "explicit"


#: seconds of one call of each path (sums exactly in binary)
FIRST_CALL = {"dense": 0.5, "separable": 0.125, "folded": 0.375}


def test_timing_pays_where_the_runs_calls_on_the_slowest_path_outlast_it():
    assert not path_choice.timing_pays(FIRST_CALL, uses=13)           # 13 x 0.5 = 6.5 s < 7 timed calls of each: 7 s
    assert path_choice.timing_pays(FIRST_CALL, uses=14)               # 7 s: a choice could pay
    assert path_choice.timing_pays(FIRST_CALL, uses=6, reps=3) and path_choice.REPS == 7     # 3 timed calls: 3 s


def test_a_run_too_short_for_timing_takes_the_fastest_first_call_and_caches_nothing(tmp_path, monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("a run this short must not be timed")

    monkeypatch.setattr(path_choice, "time_impls", no_timing)
    config = _model_config()
    common = dict(batch=4, image_size=(32, 32), precision="fp32", device=CPU, cache_dir=tmp_path)
    impl, first, how = choose_impl(config, uses=1, **common)           # the real layer, each path called once
    assert how == "one call each" and set(first) == {"dense", "separable", "folded"}
    assert all(t > 0 for t in first.values()) and impl == min(first, key=first.get)
    assert not (tmp_path / CACHE_NAME).exists()

    monkeypatch.setattr(path_choice, "_working_paths", lambda *a, **k: dict(FIRST_CALL))
    assert choose_impl(config, uses=13, **common) == ("separable", FIRST_CALL, "one call each")
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"dense": 0.1, "separable": 0.3,
                                                                            "folded": 0.2})
    assert choose_impl(config, uses=14, **common)[::2] == ("dense", "measured")        # timed, and cached
    assert list(json.loads((tmp_path / CACHE_NAME).read_text()).values()) == ["dense"]


def test_a_runs_steps_and_test_passes_decide_whether_its_paths_are_timed(tmp_path, monkeypatch, caplog):
    """A run's calls of its attention layers: steps x layers in training, test batches x test passes
    x layers in its test passes (the first call of each path here: 0.5, 0.125, 0.375 s)."""
    timed = []
    monkeypatch.setattr(path_choice, "_working_paths", lambda *a, **k: dict(FIRST_CALL))
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        timed.append(backward) or {"dense": 0.1, "separable": 0.3, "folded": 0.2})
    config = planned("demo", data_dir=str(tmp_path), model={"dim": 16, "mlp_dim": 16}, precision="fp32",
                            epochs=2, eval_batch_size=4)
    dataset, dist = _run_parts(tmp_path)
    dataset.test = SimpleNamespace(labels=torch.zeros(12, dtype=torch.int64))     # 3 test batches of 4
    # 6 steps x 2 layers = 12 calls: not timed; 2 passes x 3 batches x 2 layers = 12 calls: not timed
    with caplog.at_level("INFO", logger="attncnn.perf.paths"):
        out = with_measured_paths(config, dataset, 4, dist, steps=6)
    assert out.model == {"dim": 16, "mlp_dim": 16, "impl": "separable"} and timed == []
    assert "the run's 12 calls of the layer take less than timing 7 more of each would; not cached" in caplog.text
    # 7 steps: 14 calls, timed; the test passes still not
    assert with_measured_paths(config, dataset, 4, dist, steps=7).model["impl"] == "dense" and timed == [True]
    timed.clear()                               # 5 epochs, 1 step: the test passes' 30 calls are timed
    config = config.replace(epochs=5, data_dir=str(tmp_path / "other"))
    with_measured_paths(config, dataset, 4, dist, steps=1)
    assert timed == [False]


def _run_parts(tmp_path):
    dataset = SimpleNamespace(num_classes=3, train=SimpleNamespace(images=torch.zeros(1, 3, 32, 32, dtype=torch.uint8)))
    dist = SimpleNamespace(enabled=False, device=CPU)
    return dataset, dist


@pytest.mark.parametrize("change,measured", [
    ({}, True),
    ({"deterministic": True}, False),
    ({"measure_paths": False}, False),
    ({"model": {"dim": 16, "mlp_dim": 16, "impl": "dense"}}, False),
])
def test_which_runs_measure(tmp_path, monkeypatch, change, measured):
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, **kw: {"dense": 0.1, "separable": 0.2})
    config = planned("demo", data_dir=str(tmp_path), model={"dim": 16, "mlp_dim": 16}, precision="fp32")
    config = config.replace(**change)
    dataset, dist = _run_parts(tmp_path)
    out = with_measured_paths(config, dataset, 4, dist)
    assert (out.model.get("impl") == "dense" and out is not config) == measured
    if not measured:
        assert out.model == config.model


@pytest.mark.parametrize("eval_timings,expected", [
    ({"dense": 0.1, "separable": 0.2}, {"dim": 16, "mlp_dim": 16, "impl": "dense"}),        # the same path: unset
    ({"dense": 0.2, "separable": 0.1}, {"dim": 16, "mlp_dim": 16, "impl": "dense", "eval_impl": "separable"}),
])
def test_a_run_evaluates_with_its_fastest_test_pass_path(tmp_path, monkeypatch, eval_timings, expected):
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        {"dense": 0.1, "separable": 0.2} if backward else eval_timings)
    config = planned("demo", data_dir=str(tmp_path), model={"dim": 16, "mlp_dim": 16}, precision="fp32")
    dataset, dist = _run_parts(tmp_path)
    assert with_measured_paths(config, dataset, 4, dist).model == expected


def test_a_test_pass_is_timed_on_the_batch_it_runs(tmp_path, monkeypatch):
    batches = []
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        batches.append((backward, x.shape[0])) or {"dense": 0.1, "separable": 0.2})
    config = planned("demo", data_dir=str(tmp_path), model={"dim": 16, "mlp_dim": 16}, precision="fp32",
                            eval_batch_size=50)
    dataset, dist = _run_parts(tmp_path)
    with_measured_paths(config, dataset, 4, dist)                                   # no test set given: 50
    dataset.test = SimpleNamespace(labels=torch.zeros(7, dtype=torch.int64))        # 7 test images: one batch of 7
    with_measured_paths(config.replace(data_dir=str(tmp_path / "other")), dataset, 4, dist)
    assert batches == [(True, 4), (False, 50), (True, 4), (False, 7)]


def test_a_test_pass_path_the_user_names_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        {"dense": 0.1, "separable": 0.2} if backward else {"dense": 0.2, "separable": 0.1})
    config = planned("demo", data_dir=str(tmp_path), model={"dim": 16, "mlp_dim": 16, "eval_impl": "dense"},
                            precision="fp32")
    dataset, dist = _run_parts(tmp_path)
    assert with_measured_paths(config, dataset, 4, dist).model == {"dim": 16, "mlp_dim": 16, "eval_impl": "dense",
                                                                   "impl": "dense"}


def test_networks_without_attention_and_multi_process_runs_keep_their_configuration(tmp_path):
    dataset, dist = _run_parts(tmp_path)
    resnet = planned("resnet18-mini", data_dir=str(tmp_path))
    assert with_measured_paths(resnet, dataset, 4, dist) is resnet
    config = planned("demo", data_dir=str(tmp_path))
    assert with_measured_paths(config, dataset, 4, SimpleNamespace(enabled=True, device=CPU)) is config


def test_a_cached_path_that_does_not_exist_is_dropped_with_a_warning_and_measured_again(tmp_path, monkeypatch,
                                                                                      caplog):
    """An edited cache naming no real path used to reach the layer as the run's eval_impl and
    refuse training with advice about an option the user never set."""
    monkeypatch.setattr(path_choice, "time_impls", lambda layer, x, backward=True, **kw:
                        {"dense": 0.1, "separable": 0.2} if backward else {"dense": 0.2, "separable": 0.1})
    config = planned("demo", data_dir=str(tmp_path), model={"dim": 16, "mlp_dim": 16}, precision="fp32")
    dataset, dist = _run_parts(tmp_path)
    model_config = preset_model_config("demo", 3, **config.model)[1]
    grid, paths = (32 // model_config.pooling,) * 2, ("dense", "separable", "folded")
    train = path_choice.path_cache_key(model_config, 4, grid, "fp32", CPU, paths)
    test = path_choice.path_cache_key(model_config, config.eval_batch_size, grid, "fp32", CPU, paths) + " | test pass"
    cache = tmp_path / CACHE_NAME
    cache.write_text(json.dumps({train: "separable", test: "turbo", "elsewhere paths=dense,folded": 3}))
    with caplog.at_level("WARNING"):
        assert with_measured_paths(config, dataset, 4, dist).model == {"dim": 16, "mlp_dim": 16, "impl": "separable"}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all(w.startswith(f"{cache}: ignoring the cached entry") for w in warnings)
    assert "the attention path 'turbo', which is not one of dense, folded, separable" in warnings[0]
    assert "an attention path's name was expected, got 3" in warnings[1]
    assert json.loads(cache.read_text()) == {train: "separable", test: "separable"}     # cached, then measured


@pytest.mark.parametrize("key,value,ok", [
    ("m | quadratic grid=16x16 paths=dense,separable", "separable", True),
    ("m | quadratic grid=16x16 paths=dense,separable | test pass", "folded", False),   # not among those compared
    ("m | quadratic grid=16x16", "sdpa", True),                                    # an older key: any real path
    ("m | quadratic grid=16x16 paths=dense,bogus", "bogus", False),
    ("m | quadratic grid=16x16", None, False),
])
def test_which_cached_paths_are_taken(key, value, ok):
    assert (path_choice.path_problem(key, value) is None) is ok


def test_a_path_that_fails_here_is_left_out_of_the_choice_with_a_warning(tmp_path, monkeypatch, caplog):
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
        impl, timings, _ = choose_impl(config, batch=2, image_size=(8, 8), precision="fp32", device=CPU,
                                       cache_dir=tmp_path)
    assert set(timings) == {"explicit", "explicit-half", "sdpa", "bilinear"} and impl in timings
    assert any("attention path explicit-onehot failed on cpu (RuntimeError: no kernel for this); it is left out"
               in r.getMessage() for r in caplog.records)

    def broken(self, x, return_attention=False):
        raise RuntimeError("nothing runs")

    monkeypatch.setattr(LearnedRelativeContentAttention, "forward", broken)
    with pytest.raises(RuntimeError, match="nothing runs"):
        choose_impl(config, batch=2, image_size=(8, 8), precision="fp32", device=CPU, cache_dir=tmp_path / "other")
