"""What ``--impl measure`` and ``--measure-compile`` do: time the candidates on the run's real model
and optimizer, and put every piece of their state back (weights, buffers, optimizer state,
gradients, modes, paths, random states), so that a run that measured trains exactly as one that
was handed the same choices; nothing is written anywhere."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attncnn.layers import attention_modules, build_attention
from attncnn.models import build_model
from attncnn.perf import measure
from attncnn.perf.measure import CompileTiming, kept_state, pays_back, time_compile
from attncnn.perf.plan import RunChooser
from attncnn.perf.timing import paths_restored, run_impl, time_impls
from attncnn.runs import resolve_config
from attncnn.training import Choices, RunParts, make_optimizer
from attncnn.training.step import training_step

CPU = torch.device("cpu")
SMALL = {"dim": 16, "mlp_dim": 16}


def _snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Everything a chooser must leave as it was, copied."""
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": repr(optimizer.state_dict()),
            "momentum": [t.clone() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)],
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "modes": [m.training for m in model.modules()],
            "paths": [(m.impl, m.eval_impl) for m in model.modules() if hasattr(m, "eval_impl")],
            "rng": torch.get_rng_state()}


def assert_same_state(before: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    after = _snapshot(model, optimizer)
    assert before["weights"].keys() == after["weights"].keys()
    for name, value in before["weights"].items():
        assert torch.equal(value, after["weights"][name]), name
    assert before["optimizer"] == after["optimizer"]
    assert len(before["momentum"]) == len(after["momentum"])
    assert all(torch.equal(a, b) for a, b in zip(before["momentum"], after["momentum"]))
    assert all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
               for a, b in zip(before["grads"], after["grads"]))
    assert before["modes"] == after["modes"] and before["paths"] == after["paths"]
    assert torch.equal(before["rng"], after["rng"])
    expected = torch.Generator().manual_seed(0)
    expected.set_state(before["rng"])
    assert torch.equal(torch.rand(3), torch.rand(3, generator=expected))      # the next random numbers


def test_kept_state_puts_back_buffers_optimizer_state_gradients_and_random_numbers():
    """A network with BatchNorm statistics, an optimizer with momentum buffers and gradients left by
    a step (a resumed run's state), trained, evaluated and re-pathed inside."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 30 * 30, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    training_step(model, optimizer, images, labels, "fp32")              # momentum buffers, grads, BN statistics
    model[1].eval()                                                       # a mode of its own: kept
    before = _snapshot(model, optimizer)
    with kept_state(model, optimizer, CPU):
        model.train()
        for _ in range(3):
            training_step(model, optimizer, torch.randn(4, 3, 32, 32), labels, "fp32")
        optimizer.param_groups[0]["lr"] = 5.0
        model.zero_grad(set_to_none=True)
    assert_same_state(before, model, optimizer)
    assert model[1].num_batches_tracked.item() == 1 and optimizer.param_groups[0]["lr"] == 0.1


def _parts(model, optimizer, config, **overrides) -> RunParts:
    values = dict(model=model, optimizer=optimizer, config=config, device=CPU, precision="fp32", batch=4,
                  image_shape=(3, 32, 32), num_classes=3, steps=100_000, eval_batch=8, test_batches=100,
                  test_passes=10)
    values.update(overrides)
    return RunParts(**values)


def test_measured_paths_are_the_fastest_of_each_mode_on_the_runs_own_layer(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path))
    seen = []

    def timed(layer, x, *, backward, **kw):
        seen.append((layer, tuple(x.shape), backward, layer.training, kw["impls"]))
        return {"dense": 0.3, "separable": 0.2, "folded": 0.1} if backward else {"dense": 0.1, "separable": 0.2,
                                                                                  "folded": 0.3}

    monkeypatch.setattr(measure, "time_impls", timed)
    config = resolve_config("demo", model=SMALL)
    torch.manual_seed(0)
    model = build_model("demo", 3, **SMALL)
    optimizer = make_optimizer(model, config)
    before = _snapshot(model, optimizer)
    choices = RunChooser(impl="measure", eval_impl="measure", compile=None)(_parts(model, optimizer, config))
    assert choices == Choices(impl="folded", eval_impl="dense", compile=None)
    assert [(shape, backward, training) for _, shape, backward, training, _ in seen] == [
        ((4, 8, 8, 16), True, True), ((8, 8, 8, 16), False, False)]        # demo: 32 x 32 images over pooling 4
    assert all(layer is attention_modules(model)[0] for layer, *_ in seen)      # the run's own first layer
    assert seen[0][4] == ("dense", "separable", "folded")
    assert_same_state(before, model, optimizer)
    assert list(tmp_path.iterdir()) == []                                   # nothing cached


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


@pytest.mark.parametrize("timing,steps,expected", [
    (CompileTiming(eager=1.0, compiled=0.5, warmup=30.0), 100, True),      # saves 50 s, costs 30
    (CompileTiming(eager=1.0, compiled=0.5, warmup=30.0), 50, False),      # saves 25 s: less than the warm-up
    (CompileTiming(eager=1.0, compiled=0.95, warmup=1.0), 10_000, False),  # 1.05x: inside the margin
    (CompileTiming(eager=1.0, compiled=1.2, warmup=1.0), 10_000, False),   # slower compiled
    (CompileTiming(eager=0.1, compiled=0.01, warmup=0.5), 100, True),      # a 10 s run: no minimum length
])
def test_compiling_is_chosen_only_where_it_pays_back(timing, steps, expected):
    assert pays_back(timing, steps) is expected


def test_a_compiler_failure_means_training_eager(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore")

    monkeypatch.setattr(measure, "time_compile", broken)
    model = build_model("demo", 3, **SMALL)
    optimizer = make_optimizer(model, resolve_config("demo"))
    with caplog.at_level("WARNING"):
        assert measure.measure_compile(model, optimizer, image_shape=(3, 32, 32), num_classes=3, batch=2,
                                       precision="fp32", device=CPU, steps=10) is False
    assert "torch.compile failed on this machine, training without it (RuntimeError: no C++ compiler found)" \
        in caplog.text


@pytest.mark.slow
def test_time_compile_times_both_and_the_compiled_step_trains_the_same_network():
    torch.manual_seed(0)
    model = build_model("demo", 3, **SMALL).train()
    # the trainer tests' batch (tests/training/test_trainer.py): one compiled graph, in inductor's cache for both
    images, labels = torch.randn(10, 3, 32, 32), torch.arange(10) % 3
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    timing = time_compile(model, make_optimizer(model, resolve_config("demo")), images, labels, precision="fp32",
                          reps=1)
    assert timing.eager > 0 and timing.compiled > 0 and timing.warmup > 0
    # the first compiled step traced the network (no timing bound: a busy machine slows any step)
    assert counters["stats"]["unique_graphs"] > graphs
    assert timing.speedup == pytest.approx(timing.eager / timing.compiled)
    assert model.training and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
def test_a_measured_compile_leaves_the_run_exactly_as_before():
    """A real compilation timed on a new run's network and optimizer."""
    config = resolve_config("demo", model=SMALL)
    torch.manual_seed(0)
    model = build_model("demo", 3, **SMALL)
    optimizer = make_optimizer(model, config)
    before = _snapshot(model, optimizer)
    choices = RunChooser(impl=None, eval_impl=None, compile="measure")(_parts(model, optimizer, config, batch=10))
    assert_same_state(before, model, optimizer)
    assert optimizer.state_dict()["state"] == {} and all(p.grad is None for p in model.parameters())
    assert choices.impl is None and isinstance(choices.compile, bool)


def test_a_path_that_fails_here_is_left_out_of_the_measurement_with_a_warning(monkeypatch, caplog):
    real = measure.run_impl

    def failing(layer, x, impl, **kw):
        if impl == "separable":
            raise RuntimeError("no kernel for this device\nmore")
        return real(layer, x, impl, **kw)

    timed = []
    monkeypatch.setattr(measure, "run_impl", failing)
    monkeypatch.setattr(measure, "time_impls", lambda layer, x, *, impls, **kw: timed.append(impls) or {
        impl: 0.1 * (i + 1) for i, impl in enumerate(impls)})
    model = build_model("demo", 3, **SMALL)
    with caplog.at_level("WARNING", logger="attncnn.perf.measure"):
        assert measure.measure_paths(model, grid=(8, 8), batch=2, eval_batch=None, precision="fp32",
                                     device=CPU) == ("dense", None)
    assert timed == [("dense", "folded")]
    assert "attention path separable failed on cpu (RuntimeError: no kernel for this device)" in caplog.text
