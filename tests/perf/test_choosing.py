"""The chooser a plan hands to the loop: it decides on the run's real model and optimizer, and puts
every piece of their state back (weights, buffers, optimizer state, gradients, modes, paths, random
states), so that a run that measured trains exactly as one that was handed the same choices."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from attncnn.models import build_model
from attncnn.perf import compiling as compile_choice
from attncnn.perf.choosing import RunChooser, kept_state
from attncnn.runs import resolve_config
from attncnn.training import Choices, RunParts, make_optimizer
from attncnn.training.step import training_step

CPU = torch.device("cpu")


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


def test_under_torchrun_the_chooser_measures_nothing():
    def untouchable(*args, **kwargs):
        raise AssertionError("nothing is measured under torchrun")

    parts = _parts(untouchable, untouchable, None, distributed=True)
    assert RunChooser()(parts) == Choices(compile=False)
    assert RunChooser(compile=False)(parts) == Choices()


@pytest.mark.slow
def test_a_choice_made_on_the_real_objects_leaves_their_state_exactly_as_before(choices_cache, monkeypatch):
    """Paths measured (every path of the first layer, both modes) and compile probed (a real
    compilation: the warm-up floor set to nothing) on a new run's network and optimizer."""
    monkeypatch.setattr(compile_choice, "warmup_floor", lambda device, records: (0.0, "test"))
    config = resolve_config("demo", model={"dim": 16, "mlp_dim": 16})
    torch.manual_seed(0)
    model = build_model("demo", 3, dim=16, mlp_dim=16)
    optimizer = make_optimizer(model, config)
    assert optimizer.state_dict()["state"] == {}              # a new run's optimizer: empty, and empty afterwards
    before = _snapshot(model, optimizer)
    choices = RunChooser()(_parts(model, optimizer, config))
    assert_same_state(before, model, optimizer)
    assert optimizer.state_dict()["state"] == {} and all(p.grad is None for p in model.parameters())
    records = json.loads(choices_cache.read_text())["records"]
    assert [r["choice"] for r in records] == ["attention-path", "attention-path", "compile"]   # all three measured
    assert choices.impl == records[0]["value"] and isinstance(choices.compile, bool)
    assert records[2]["run"]["model"] == {"dim": 16, "mlp_dim": 16, "impl": choices.impl,
                                          **({"eval_impl": choices.eval_impl} if choices.eval_impl else {})}
    assert records[2]["value"]["compiled"] is not None                  # the compiled step was timed
