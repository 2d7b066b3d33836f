"""The ``attncnn`` command is the one place that sets process-wide state, once, before a command
runs: cuBLAS's deterministic workspace for a deterministic training, glibc's heap policy for the
commands that run models on the CPU."""

from __future__ import annotations

import os

import pytest

from attncnn import cli
from attncnn.cli import presets as presets_command
from attncnn.cli import train as train_command
from attncnn.perf import host_memory


@pytest.fixture
def seen(monkeypatch):
    """What the train and presets handlers saw when they ran: the cuBLAS variable and the heap policy calls."""
    record: dict = {"heap": []}
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(host_memory, "reuse_freed_memory", lambda: record["heap"].append("set") or "heap")

    def handler(args):
        record["cublas"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        record["heap at handler"] = list(record["heap"])
        return 0

    monkeypatch.setattr(train_command, "handle", handler)
    monkeypatch.setattr(presets_command, "handle", handler)
    return record


def test_deterministic_training_gets_the_cublas_workspace_before_the_handler(seen):
    assert cli.main(["train", "--preset", "demo", "--deterministic", "--device", "cpu"]) == 0
    assert seen["cublas"] == ":4096:8"


def test_a_resumed_run_gets_it_too_since_its_recipe_may_be_deterministic(seen, tmp_path):
    assert cli.main(["train", "--resume", str(tmp_path)]) == 0
    assert seen["cublas"] == ":4096:8"


def test_a_training_without_it_and_a_value_already_set_are_left_alone(seen, monkeypatch):
    assert cli.main(["train", "--preset", "demo", "--device", "cpu"]) == 0
    assert seen["cublas"] is None
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert cli.main(["train", "--preset", "demo", "--deterministic", "--device", "cpu"]) == 0
    assert seen["cublas"] == ":16:8"


def test_the_heap_policy_is_set_once_before_a_cpu_command_and_not_for_others(seen):
    assert cli.main(["train", "--preset", "demo", "--device", "cpu"]) == 0
    assert seen["heap at handler"] == ["set"]
    seen["heap"].clear()
    assert cli.main(["presets"]) == 0
    assert seen["heap at handler"] == [] and seen["cublas"] is None
