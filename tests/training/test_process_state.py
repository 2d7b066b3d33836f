"""A library call leaves the caller's process as it found it: ``train`` never writes the environment
(cuBLAS's deterministic workspace is checked, not set) and planning never sets the heap policy; the
``attncnn`` command sets both at start-up (tests/test_cli_process_state.py)."""

from __future__ import annotations

import os

import pytest
import torch

from attncnn.perf import host_memory, make_plan
from attncnn.runs import resolve_config
from attncnn.training import RunOptions, RunPlan, TrainingError, train
from attncnn.training.components import deterministic_algorithms

CUDA = torch.device("cuda")        # a device object only: nothing here runs on it


def test_deterministic_on_cuda_without_the_cublas_workspace_is_refused_and_the_environment_untouched(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = dict(os.environ)
    with pytest.raises(TrainingError, match=r"CUBLAS_WORKSPACE_CONFIG is unset: set CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                                            r"in the environment before the process starts CUDA; the attncnn "
                                            r"command does this for --deterministic"):
        with deterministic_algorithms(True, CUDA):
            pass
    assert dict(os.environ) == before
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("value", [":1:1", "4096:8", ""])
def test_a_cublas_workspace_that_is_not_deterministic_is_named(monkeypatch, value):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with pytest.raises(TrainingError, match=f"CUBLAS_WORKSPACE_CONFIG is '{value}'"):
        with deterministic_algorithms(True, CUDA):
            pass
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == value


@pytest.mark.parametrize("value", [":4096:8", ":16:8"])
def test_a_deterministic_cublas_workspace_is_accepted(monkeypatch, value):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with deterministic_algorithms(True, CUDA):
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == value


def test_the_cpu_needs_no_cublas_workspace(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with deterministic_algorithms(True, torch.device("cpu")):
        assert torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_train_refuses_before_its_run_folder_exists(monkeypatch, tmp_path):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    config = resolve_config("demo", data=str(tmp_path / "no-data"))
    with pytest.raises(TrainingError, match="CUBLAS_WORKSPACE_CONFIG=:4096:8"):
        train(config, tmp_path / "run", RunPlan(device=CUDA, precision="fp32", deterministic=True), progress=False)
    assert not (tmp_path / "run").exists() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_planning_leaves_the_heap_policy_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "_state", {})          # as in a fresh process: nothing set yet
    monkeypatch.setattr(host_memory, "reuse_freed_memory", lambda: calls.append(1) or "heap")
    monkeypatch.setattr(host_memory, "_set_heap_policy", lambda: calls.append(2) or "heap")
    plan = make_plan(resolve_config("demo"), RunOptions(device="cpu", compile=False))
    assert plan.device.type == "cpu" and calls == []
