"""The run plan: made once for the machine at hand, taken by the loop as it is."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attncnn.perf import make_plan, resume_plan
from attncnn.perf import plan as plan_module
from attncnn.runs import resolve_config
from attncnn.runs.machine_file import MACHINE_FILE
from attncnn.training import RunOptions, RunPlan

HERE = {"cpu": "This CPU", "torch_threads": 2, "torch": "2.13.0", "device": "cpu"}
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
    monkeypatch.setattr(plan_module, "make_loaders", lambda config, dist, **data: (None, loader, None))
    monkeypatch.setattr(plan_module, "for_images", lambda config, dataset, new: config)   # no data set here
    monkeypatch.setattr(plan_module, "with_measured_paths", fake_paths)
    monkeypatch.setattr(plan_module, "with_compile_choice",
                        lambda config, *a: dataclasses.replace(config, compile=bool(config.compile)))
    monkeypatch.setattr(plan_module, "machine_info", lambda device: dict(HERE))
    return calls


def _run(tmp_path, config: dict, segments: list[dict] | None = None):
    """A run folder with this ``config.json`` and, given ``segments``, a ``machine.json``."""
    folder = tmp_path / "run"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "machine": GPU}) + "\n")
    if segments is not None:
        (folder / MACHINE_FILE).write_text(json.dumps({"segments": segments}))
    return folder


#: a config.json written before the recipe was kept apart: the GPU's device and measured paths in it
STARTED_ON_GPU = {"preset": "quadratic-mini", "device": "cuda", "model": {"impl": "separable", "eval_impl": "dense",
                                                                            "dim": 72}, "measure_paths": True}


def _segment(**values) -> dict:
    return {"epochs": [1, 1], "machine": GPU, **values}


def test_a_resumed_run_chooses_its_paths_and_device_here_and_changes_nothing_stored(tmp_path, measured):
    folder = _run(tmp_path, STARTED_ON_GPU)
    before = (folder / "config.json").read_text()
    plan = resume_plan(folder)
    assert measured == [{"dim": 72}]                        # the stored paths are not used, the rest kept
    assert (plan.impl, plan.eval_impl) == ("folded", "dense")
    assert plan.device == torch.device("cpu") and plan.precision == "fp32" and plan.machine == HERE
    assert (folder / "config.json").read_text() == before and not (folder / MACHINE_FILE).exists()


def test_a_resume_takes_the_paths_it_is_given_and_measures_nothing(tmp_path, measured):
    folder = _run(tmp_path, STARTED_ON_GPU)
    plan = resume_plan(folder, RunOptions(device="cpu", impl="dense"))
    assert measured == [] and (plan.impl, plan.eval_impl) == ("dense", None)
    deterministic = resume_plan(folder, RunOptions(deterministic=True))
    assert measured == [] and (deterministic.impl, deterministic.deterministic) == (None, True)


@pytest.mark.parametrize("run", ["old", "new"])
def test_a_resumed_bf16_run_keeps_bf16_only_where_it_is_fast(tmp_path, measured, monkeypatch, run):
    if run == "old":                                       # the precision in config.json
        folder = _run(tmp_path, {**STARTED_ON_GPU, "precision": "bf16"})
    else:                                                  # its first segment's; a later fp32 one does not change it
        folder = _run(tmp_path, {"preset": "quadratic-mini"}, [_segment(precision="bf16"), _segment(precision="fp32")])
    monkeypatch.setattr("attncnn.perf.precision.slow_bf16_reason", lambda device: "no bf16 units")
    assert resume_plan(folder).precision == "fp32"
    assert resume_plan(folder, RunOptions(precision="bf16")).precision == "bf16"     # asked: obeyed
    monkeypatch.setattr("attncnn.perf.precision.slow_bf16_reason", lambda device: None)
    assert resume_plan(folder).precision == "bf16"


@pytest.mark.parametrize("given", [None, True, False])
def test_a_resumed_run_is_deterministic_as_it_ran_unless_told(tmp_path, measured, given):
    old = _run(tmp_path / "old", {**STARTED_ON_GPU, "deterministic": True})
    new = _run(tmp_path / "new", {"preset": "quadratic-mini"}, [_segment(deterministic=False),
                                                                 _segment(deterministic=True)])
    for folder in (old, new):
        plan = resume_plan(folder, RunOptions(deterministic=given))
        assert plan.deterministic is (True if given is None else given)
    assert resume_plan(_run(tmp_path / "plain", {"preset": "quadratic-mini"})).deterministic is False


@pytest.mark.parametrize("given", [None, True, False])
def test_a_resumed_run_compiles_as_asked_else_as_this_machine_decides(tmp_path, measured, given):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "compile": True})      # an older run's setting is not used
    assert resume_plan(folder, RunOptions(compile=given)).compile is bool(given)


def test_an_older_runs_cache_folder_is_a_resumes_default(tmp_path, measured):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "data_dir": "/data/cache"})
    assert resume_plan(folder).options.data_dir == "/data/cache"
    assert resume_plan(folder, RunOptions(data_dir="here")).options.data_dir == "here"


def test_a_new_run_with_every_choice_given_measures_nothing(monkeypatch):
    monkeypatch.setattr(plan_module, "make_loaders", lambda *a, **k: pytest.fail("nothing to measure: no data needed"))
    monkeypatch.setattr(plan_module, "machine_info", lambda device: dict(HERE))
    options = RunOptions(device="cpu", precision="fp32", compile=False, impl="dense")
    plan = make_plan(resolve_config("demo"), options)
    assert plan == RunPlan(device=torch.device("cpu"), precision="fp32", compile=False, impl="dense",
                           options=options, machine=HERE)


def test_a_new_run_takes_the_measured_paths_and_the_resolved_precision(measured, monkeypatch):
    monkeypatch.setattr("attncnn.perf.precision.fast_bf16", lambda device: False)
    plan = make_plan(resolve_config("quadratic-mini"), RunOptions(device="cpu", precision="auto"))
    assert (plan.precision, plan.impl, plan.eval_impl, plan.compile) == ("fp32", "folded", "dense", False)
    assert measured == [{}]


def test_a_plan_refuses_an_unresolved_precision():
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        RunPlan(device=torch.device("cpu"), precision="auto")


def test_the_flags_a_resume_repeats_are_the_run_time_options_given():
    assert RunOptions().flags() == []
    assert RunOptions(device="cpu", compile=False, deterministic=True, impl="dense", download=True,
                      measure_paths=False).flags() == ["--device", "cpu", "--no-compile", "--deterministic",
                                                       "--impl", "dense", "--no-measure-paths"]
