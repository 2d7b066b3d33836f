"""The run plan: made once for the machine at hand, taken by the loop as it is."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from attncnn.perf import make_plan, resume_plan
from attncnn.perf import plan as plan_module
from attncnn.perf.plan import RunChooser
from attncnn.errors import InputError
from attncnn.runs import resolve_config
from attncnn.runs.machine_file import MACHINE_FILE
from attncnn.training import Choices, RunOptions, RunPlan

HERE = {"cpu": "This CPU", "torch_threads": 2, "torch": "2.13.0", "device": "cpu"}
GPU = {"cpu": "Host CPU", "threads": 1, "torch": "2.11.0", "device": "cuda", "gpu": "Some GPU"}


@pytest.fixture
def here(monkeypatch):
    """This machine as the plan records it, fixed; a plan must neither load data nor build a model."""
    monkeypatch.setattr(plan_module, "machine_info", lambda device: dict(HERE))
    monkeypatch.setattr("attncnn.data.load_dataset", lambda *a, **k: pytest.fail("a plan loads no data"))
    monkeypatch.setattr("attncnn.models.build_model", lambda *a, **k: pytest.fail("a plan builds no model"))


#: the chooser of a plan that leaves the paths and compile open: the written rule decides all three
EVERYTHING = RunChooser(impl="rule", eval_impl="rule", compile="rule")


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


def test_a_resumed_run_leaves_its_paths_to_be_chosen_here_and_changes_nothing_stored(tmp_path, here):
    folder = _run(tmp_path, STARTED_ON_GPU)
    before = (folder / "config.json").read_text()
    plan = resume_plan(folder)
    assert (plan.impl, plan.eval_impl, plan.compile, plan.choose) == (None, None, None, EVERYTHING)   # not the stored
    assert plan.device == torch.device("cpu") and plan.precision == "fp32" and plan.machine == HERE
    assert (folder / "config.json").read_text() == before and not (folder / MACHINE_FILE).exists()


def test_a_resume_takes_the_paths_it_is_given_and_chooses_only_the_rest(tmp_path, here):
    folder = _run(tmp_path, STARTED_ON_GPU)
    plan = resume_plan(folder, RunOptions(device="cpu", impl="dense"))
    assert (plan.impl, plan.eval_impl) == ("dense", None)
    assert plan.choose == RunChooser(impl=None, eval_impl=None, compile="rule")
    deterministic = resume_plan(folder, RunOptions(deterministic=True))
    assert (deterministic.impl, deterministic.deterministic, deterministic.compile) == (None, True, None)
    # a deterministic run takes the rule's paths (the same for the same command) and never compiles unless asked
    assert deterministic.choose == RunChooser(impl="rule", eval_impl="rule", compile="rule", deterministic=True)


@pytest.mark.parametrize("run", ["old", "new"])
def test_a_resumed_bf16_run_keeps_bf16_only_where_it_is_fast(tmp_path, here, monkeypatch, run):
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
def test_a_resumed_run_is_deterministic_as_it_ran_unless_told(tmp_path, here, given):
    old = _run(tmp_path / "old", {**STARTED_ON_GPU, "deterministic": True})
    new = _run(tmp_path / "new", {"preset": "quadratic-mini"}, [_segment(deterministic=False),
                                                                 _segment(deterministic=True)])
    for folder in (old, new):
        plan = resume_plan(folder, RunOptions(deterministic=given))
        assert plan.deterministic is (True if given is None else given)
    assert resume_plan(_run(tmp_path / "plain", {"preset": "quadratic-mini"})).deterministic is False


@pytest.mark.parametrize("given", [None, True, False])
def test_a_resumed_run_compiles_as_asked_else_as_this_machine_decides(tmp_path, here, given):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "compile": True})      # an older run's setting is not used
    plan = resume_plan(folder, RunOptions(compile=given))
    assert plan.compile is given and (plan.choose.compile == "rule") is (given is None)


def test_an_older_runs_cache_folder_is_a_resumes_default(tmp_path, here):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "data_dir": "/data/cache"})
    assert resume_plan(folder).options.data_dir == "/data/cache"
    assert resume_plan(folder, RunOptions(data_dir="here")).options.data_dir == "here"


def test_a_new_run_with_every_choice_given_has_nothing_to_choose(here):
    options = RunOptions(device="cpu", precision="fp32", compile=False, impl="dense")
    plan = make_plan(resolve_config("demo"), options)
    assert plan == RunPlan(device=torch.device("cpu"), precision="fp32", compile=False, impl="dense",
                           options=options, machine=HERE)


@pytest.mark.parametrize("options,chooser", [
    (RunOptions(), EVERYTHING),
    (RunOptions(eval_impl="dense"), RunChooser(impl="rule", eval_impl=None, compile="rule")),
    (RunOptions(impl="dense"), RunChooser(impl=None, eval_impl=None, compile="rule")),
    (RunOptions(impl="measure"), RunChooser(impl="measure", eval_impl="measure", compile="rule")),
    (RunOptions(impl="dense", eval_impl="measure"), RunChooser(impl=None, eval_impl="measure", compile="rule")),
    (RunOptions(measure_compile=True), RunChooser(impl="rule", eval_impl="rule", compile="measure")),
    (RunOptions(compile=True), RunChooser(impl="rule", eval_impl="rule", compile=None)),
    (RunOptions(impl="dense", compile=False), None),
    (RunOptions(deterministic=True), RunChooser(impl="rule", eval_impl="rule", compile="rule", deterministic=True)),
])
def test_a_new_run_leaves_to_its_chooser_exactly_what_the_options_leave_open(here, options, chooser):
    plan = make_plan(resolve_config("quadratic-mini"), options)
    assert plan.choose == chooser and plan.compile is (None if chooser and chooser.compile else bool(options.compile))
    assert "measure" not in (plan.impl, plan.eval_impl)          # not a path: the network is built without it


def test_under_torchrun_the_rule_decides_and_nothing_is_measured(here, monkeypatch):
    monkeypatch.setattr(plan_module, "launch_from_env", lambda: object())
    monkeypatch.setattr(plan_module, "plan_device", lambda device: torch.device("cpu"))
    plan = make_plan(resolve_config("quadratic-mini"), RunOptions())
    assert (plan.choose, plan.compile, plan.impl) == (EVERYTHING, None, None)
    for options, flag in ((RunOptions(impl="measure"), "--impl measure"),
                          (RunOptions(measure_compile=True), "--measure-compile")):
        with pytest.raises(InputError, match=f"{flag} times the run's choices in this process, but under torchrun"):
            make_plan(resolve_config("quadratic-mini"), options)


def test_measuring_compile_and_giving_it_exclude_each_other(here):
    with pytest.raises(InputError, match="--measure-compile times whether to compile, but --compile/--no-compile"):
        make_plan(resolve_config("quadratic-mini"), RunOptions(measure_compile=True, compile=False))


def test_a_given_path_the_layers_lack_is_refused_by_the_plan(here):
    with pytest.raises(ValueError, match="has no impl 'sdpa'"):
        make_plan(resolve_config("quadratic-mini"), RunOptions(impl="sdpa"))


def test_a_new_run_takes_the_resolved_precision(here, monkeypatch):
    monkeypatch.setattr("attncnn.perf.precision.fast_bf16", lambda device: False)
    plan = make_plan(resolve_config("quadratic-mini"), RunOptions(device="cpu", precision="auto"))
    assert (plan.precision, plan.impl, plan.eval_impl, plan.compile) == ("fp32", None, None, None)


def test_a_plans_choices_are_taken_whole():
    plan = RunPlan(device=torch.device("cpu"), precision="fp32", compile=None, eval_impl="sdpa", choose=EVERYTHING)
    assert plan.decided() == RunPlan(device=torch.device("cpu"), precision="fp32", eval_impl="sdpa")
    decided = plan.decided(Choices(impl="explicit", compile=True))
    assert (decided.impl, decided.eval_impl, decided.compile, decided.choose) == ("explicit", "sdpa", True, None)
    both = plan.decided(Choices(impl="explicit", eval_impl="bilinear", compile=False))
    assert (both.impl, both.eval_impl, both.compile) == ("explicit", "bilinear", False)


def test_a_plan_refuses_an_unresolved_precision():
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        RunPlan(device=torch.device("cpu"), precision="auto")


def test_the_flags_a_resume_repeats_are_the_run_time_options_given():
    assert RunOptions().flags() == []
    assert RunOptions(device="cpu", compile=False, deterministic=True, impl="dense", download=True,
                      eval_impl="measure").flags() == ["--device", "cpu", "--no-compile", "--deterministic",
                                                       "--impl", "dense", "--eval-impl", "measure"]
    assert RunOptions(measure_compile=True).flags() == ["--measure-compile"]


def test_the_compile_mode_and_optimizer_kernel_flags_come_back_as_the_options_given():
    """What a resume command repeats parses back into the same options (the train command's own flags)."""
    import argparse

    from attncnn.cli._parsing import add_config_options, given_options
    options = RunOptions(device="cuda", compile_mode="reduce-overhead", fused_optimizer=True)
    assert options.flags() == ["--device", "cuda", "--compile-mode", "reduce-overhead", "--fused-optimizer"]
    parser = argparse.ArgumentParser()
    add_config_options(parser, RunOptions)
    assert RunOptions(**given_options(parser.parse_args(options.flags()), RunOptions)) == options
    with pytest.raises(ValueError, match="compile_mode must be one of default, reduce-overhead, got 'max-autotune'"):
        RunOptions(compile_mode="max-autotune")


@pytest.fixture
def on_cuda(here, monkeypatch):
    """A plan made as on a CUDA machine (the device is only named: nothing runs on it)."""
    monkeypatch.setattr(plan_module, "plan_device", lambda device: torch.device("cuda"))


@pytest.mark.parametrize("resumed", [False, True])
def test_cuda_graphs_compile_without_the_probe_and_keep_the_optimizer_kernel_asked(tmp_path, on_cuda, resumed):
    options = RunOptions(precision="fp32", compile_mode="reduce-overhead", fused_optimizer=True)
    plan = (resume_plan(_run(tmp_path, STARTED_ON_GPU), options) if resumed
            else make_plan(resolve_config("quadratic-mini"), options))
    assert (plan.compile, plan.compile_mode, plan.fused_optimizer) == (True, "reduce-overhead", True)
    assert plan.choose == RunChooser(impl="rule", eval_impl="rule", compile=None)    # paths only
    assert plan.decided().compile is True
    default = make_plan(resolve_config("quadratic-mini"), RunOptions(precision="fp32"))
    assert (default.compile, default.compile_mode, default.fused_optimizer) == (None, "default", False)


@pytest.mark.parametrize("resumed", [False, True])
@pytest.mark.parametrize("options,message", [
    (RunOptions(device="cpu", compile_mode="reduce-overhead"),
     "--compile-mode reduce-overhead replays CUDA graphs, which only CUDA has, but this run trains on cpu; drop "
     "--compile-mode (or train with --device cuda on a GPU)"),
    (RunOptions(device="cpu", compile_mode="reduce-overhead", compile=False),
     "--compile-mode reduce-overhead compiles the training step, but --no-compile says not to; drop one of them"),
])
def test_cuda_graphs_are_refused_off_cuda_and_without_compiling(tmp_path, here, resumed, options, message):
    from attncnn.errors import InputError
    with pytest.raises(InputError) as info:
        if resumed:
            resume_plan(_run(tmp_path, STARTED_ON_GPU), options)
        else:
            make_plan(resolve_config("quadratic-mini"), options)
    assert str(info.value) == message


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attncnn.perf.plan" and r.levelno == logging.WARNING]


def test_a_resume_names_the_unknown_values_it_passes_over(tmp_path, here, caplog):
    # an older config.json edited to "fp8" and "warp" resumed without a word about either
    old = {"preset": "quadratic-mini", "precision": "fp8", "model": {"impl": "warp", "eval_impl": "dense"}}
    folder = _run(tmp_path / "a", old, [_segment(precision="fp32")])
    with caplog.at_level(logging.INFO, logger="attncnn.perf.plan"):
        assert resume_plan(folder).precision == "fp32"
    assert _warnings(caplog) == [f"{folder / 'config.json'} stores values attncnn does not know, ignored: precision "
                                 "'fp8' (resuming in fp32); impl 'warp' (this machine chooses the path; --impl "
                                 "names one)"]
    caplog.clear()
    folder = _run(tmp_path / "b", {"preset": "quadratic-mini", "precision": "fp8"})     # no machine.json: asked
    with caplog.at_level(logging.INFO, logger="attncnn.perf.plan"):
        assert resume_plan(folder, RunOptions(precision="fp32")).precision == "fp32"
    assert _warnings(caplog) == [f"{folder / 'config.json'} stores values attncnn does not know, ignored: precision "
                                 "'fp8' (resuming in fp32)"]
    caplog.clear()
    folder = _run(tmp_path / "c", {"preset": "quadratic-mini"}, [_segment(precision="fp64")])
    with caplog.at_level(logging.INFO, logger="attncnn.perf.plan"):
        assert resume_plan(folder).precision == "fp32"
    assert _warnings(caplog) == [f"{folder / MACHINE_FILE} records precision 'fp64', which attncnn does not know: "
                                 "ignored, resuming in fp32"]


def test_known_values_an_older_run_stored_are_passed_over_in_silence(tmp_path, here, caplog):
    folder = _run(tmp_path, {**STARTED_ON_GPU, "precision": "fp32"})        # separable / dense: known paths
    with caplog.at_level(logging.INFO, logger="attncnn.perf.plan"):
        resume_plan(folder)
    assert _warnings(caplog) == []


def test_a_resumed_run_that_trained_on_a_removed_path_says_so_once_and_takes_the_rule(tmp_path, here, caplog):
    """A run folder of an older version: machine.json and config.json name paths this version no longer has."""
    folder = _run(tmp_path, {"preset": "learned-content-mini", "model": {"impl": "sdpa-onehot"}},
                  [_segment(attention_paths={"train": ["flex"] * 6, "test": ["sdpa"] * 6})])
    with caplog.at_level("INFO", logger="attncnn.perf.plan"):
        plan = resume_plan(folder)
    assert (plan.impl, plan.eval_impl, plan.choose) == (None, None, EVERYTHING)
    lines = [r.getMessage() for r in caplog.records if "no longer has" in r.getMessage()]
    assert lines == [f"{folder}: it trained on the attention path flex, sdpa-onehot, which this version no longer "
                     "has; it continues on the path the rule gives (named below), which computes the same function"]
    caplog.clear()
    with caplog.at_level("INFO", logger="attncnn.perf.plan"):
        resume_plan(_run(tmp_path / "today", {"preset": "quadratic-mini"},
                         [_segment(attention_paths={"train": ["folded"] * 6, "test": ["dense"] * 6})]))
    assert "no longer has" not in caplog.text
