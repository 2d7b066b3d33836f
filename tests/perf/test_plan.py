"""The run plan: made once for the machine at hand, taken by the loop as it is."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attncnn.perf import make_plan, resume_plan
from attncnn.perf import plan as plan_module
from attncnn.runs import config_from_dict, resolve_config
from attncnn.training import RunPlan

HERE = {"cpu": "This CPU", "torch_threads": 2, "torch": "2.13.0", "device": "cpu"}
#: what an epoch record of this machine says (HERE as ``epoch_machine`` writes it)
SAME_MACHINE = {"cpu": "This CPU", "threads": 2, "torch": "2.13.0", "device": "cpu"}
GPU = {"cpu": "Host CPU", "threads": 1, "torch": "2.11.0", "device": "cuda", "gpu": "Some GPU"}


@pytest.fixture
def measured(monkeypatch):
    """Record path measurements instead of running them (they need a data set and seconds of timing)."""
    calls = []

    def fake_paths(config, dataset, batch, dist, steps=None):
        calls.append(dict(config.model))
        assert steps == config.epochs * 5                   # the run's steps: epochs x the loader's length
        return dataclasses.replace(config, model={**config.model, "impl": "folded", "eval_impl": "dense"})

    loader = type("L", (), {"batch_size": 4, "__len__": lambda self: 5})()
    monkeypatch.setattr(plan_module, "make_loaders", lambda config, dist: (None, loader, None))
    monkeypatch.setattr(plan_module, "for_images", lambda config, dataset, new: config)   # no data set here
    monkeypatch.setattr(plan_module, "with_measured_paths", fake_paths)
    monkeypatch.setattr(plan_module, "with_compile_choice",
                        lambda config, *a: dataclasses.replace(config, compile=False))
    monkeypatch.setattr("attncnn.perf.machine.machine_info", lambda device: dict(HERE))
    return calls


def _run(tmp_path, config: dict, machine: dict):
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "machine": machine}) + "\n")
    return folder


STARTED_ON_GPU = {"preset": "quadratic-mini", "device": "cuda", "model": {"impl": "dense", "dim": 72},
                  "measure_paths": True}


def test_a_run_resumed_on_another_machine_measures_its_paths_again_and_takes_its_device(tmp_path, measured):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "model": {"impl": "separable", "eval_impl": "dense", "dim": 72}}, GPU)
    plan = resume_plan(folder, device="auto")
    assert measured == [{"dim": 72}]                        # both measured paths dropped, the rest kept
    assert (plan.impl, plan.eval_impl, plan.device_option) == ("folded", "dense", "auto")
    assert plan.device == torch.device("cpu") and plan.precision == "fp32"
    stored = config_from_dict(json.loads((folder / "config.json").read_text()))
    assert plan.changes_stored(stored)                      # the loop rewrites config.json
    assert json.loads((folder / "config.json").read_text())["model"]["impl"] == "separable"   # not before


def test_the_same_machine_keeps_the_path_so_the_run_continues_exactly(tmp_path, measured):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "device": "cpu"}, SAME_MACHINE)
    plan = resume_plan(folder, device="cpu")
    assert measured == [] and plan.impl == "dense" and plan.device_option is None
    assert not plan.changes_stored(config_from_dict(json.loads((folder / "config.json").read_text())))


@pytest.mark.parametrize("change, keep",
                         [({}, True), ({"measure_paths": False}, False), ({"deterministic": True}, False)])
def test_a_chosen_path_or_a_run_that_never_measured_keeps_its_path(tmp_path, measured, change, keep):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "device": "cpu", **change}, GPU)
    plan = resume_plan(folder, device="cpu", keep_impl=keep)
    assert measured == [] and plan.impl == "dense"


def test_a_resumed_bf16_run_keeps_bf16_only_where_it_is_fast(tmp_path, measured, monkeypatch):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "device": "cpu", "precision": "bf16"}, HERE)
    monkeypatch.setattr("attncnn.perf.precision.slow_bf16_reason", lambda device: "no bf16 units")
    assert resume_plan(folder, device="cpu").precision == "fp32"
    assert resume_plan(folder, device="cpu", precision="bf16").precision == "bf16"     # asked: obeyed
    monkeypatch.setattr("attncnn.perf.precision.slow_bf16_reason", lambda device: None)
    assert resume_plan(folder, device="cpu").precision == "bf16"


@pytest.mark.parametrize("given", [None, True, False])
def test_a_resumed_run_compiles_as_asked_else_as_it_started(tmp_path, measured, given):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "device": "cpu", "compile": True}, SAME_MACHINE)
    plan = resume_plan(folder, device="cpu", compile=given)
    assert plan.compile is (True if given is None else given) and measured == []
    assert not plan.changes_stored(config_from_dict(json.loads((folder / "config.json").read_text())))


def test_a_new_run_with_every_choice_given_measures_nothing(monkeypatch):
    monkeypatch.setattr(plan_module, "make_loaders", lambda *a: pytest.fail("nothing to measure: no data needed"))
    config = resolve_config("demo", precision="fp32", compile=False, device="cpu", model={"impl": "dense"})
    plan = make_plan(config)
    assert plan == RunPlan(device=torch.device("cpu"), precision="fp32", compile=False, impl="dense")
    assert plan.applied_to(config) == config


def test_a_new_run_takes_the_measured_paths_and_the_resolved_precision(measured, monkeypatch):
    monkeypatch.setattr("attncnn.perf.precision.fast_bf16", lambda device: False)
    plan = make_plan(resolve_config("quadratic-mini", device="cpu", precision="auto"))
    assert (plan.precision, plan.impl, plan.eval_impl, plan.compile) == ("fp32", "folded", "dense", False)
    assert measured == [{}]


def test_a_plan_refuses_an_unresolved_precision():
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        RunPlan(device=torch.device("cpu"), precision="auto")
