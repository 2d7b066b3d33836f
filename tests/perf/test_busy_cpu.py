"""A choice measured while other work shares the CPU serves its own run and is not cached: the next run
on this machine measures again instead of inheriting the slowdown (the attention path, the compile choice)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from attncnn.models import build_model, preset_model_config
from attncnn.perf import compiling as compile_choice
from attncnn.perf import machine
from attncnn.perf.compiling import CompileTiming, choose_compile
from attncnn.perf.paths import choose_impl
from attncnn.runs import resolve_config
from attncnn.training import make_optimizer

CPU = torch.device("cpu")


@pytest.fixture
def load(monkeypatch):
    """``load(value)``: the 1-minute load average the library sees, on a machine of 2 cores."""
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)

    def set_load(value):
        monkeypatch.setattr(machine, "cpu_load", lambda: value)
    return set_load


def test_the_busy_rule_is_a_load_above_the_cores(load):
    load(2.0)
    assert machine.busy_reason(CPU) is None                     # its own two threads' worth: not busy
    load(None)
    assert machine.busy_reason(CPU) is None                     # no load average on this system
    load(3.4)
    assert machine.busy_reason(CPU) == "the CPU is busy (1-minute load average 3.4, above its 2 cores)"
    assert machine.busy_reason(torch.device("cuda")) is None    # a GPU's timing is not the CPU's


def _model_config():
    return preset_model_config("demo", 3, dim=16, mlp_dim=16)[1]


def _values(cache) -> list:
    return [r["value"] for r in json.loads(cache.read_text())["records"]]


def test_an_attention_path_measured_on_a_busy_cpu_is_used_and_not_cached(load, choices_cache, caplog):
    load(5.0)
    common = dict(batch=4, image_size=(32, 32), precision="fp32", device=CPU)
    with caplog.at_level(logging.INFO, logger="attncnn.perf.paths"):
        impl, timings, how = choose_impl(_model_config(), **common)
    assert how == "measured" and impl == min(timings, key=timings.get)
    assert not choices_cache.exists()
    (line,) = [r.getMessage() for r in caplog.records if "not cached" in r.getMessage()]
    assert line == ("attention path (training) measured while the CPU is busy (1-minute load average 5.0, above "
                    "its 2 cores): the choice serves this run and is not cached (the next run measures again)")
    load(0.5)                                                   # idle again: measured and cached
    chosen = choose_impl(_model_config(), **common)
    assert chosen.how == "measured"
    assert _values(choices_cache) == [chosen.impl]


def test_a_compile_choice_measured_on_a_busy_cpu_is_used_and_not_cached(load, choices_cache, monkeypatch, caplog):
    probes = []
    monkeypatch.setattr(compile_choice, "time_compile",
                        lambda *a, **k: probes.append(1) or CompileTiming(eager=0.4, compiled=0.2, warmup=20.0))
    monkeypatch.setattr(compile_choice, "warmup_floor", lambda device, records: (1.0, "test"))
    config = resolve_config("demo", model={"dim": 16, "mlp_dim": 16}, epochs=2)
    model = build_model("demo", 3, dim=16, mlp_dim=16)
    optimizer = make_optimizer(model, config)

    def choose():
        return choose_compile(model, optimizer, config, model_options=config.model, image_shape=(3, 32, 32),
                              num_classes=3, batch=4, precision="fp32", device=CPU, steps=2000)

    load(3.0)
    with caplog.at_level(logging.INFO, logger="attncnn.perf.compiling"):
        assert choose() is True                                 # this run takes the measured choice
    assert not choices_cache.exists()
    assert ("compile: measured while the CPU is busy (1-minute load average 3.0, above its 2 cores): the choice "
            "serves this run and is not cached (the next run measures again)") in caplog.messages
    assert choose() is True and len(probes) == 2                # measured again
    load(1.0)
    choose()
    assert len(_values(choices_cache)) == 1 and len(probes) == 3
    choose()
    assert len(probes) == 3                                     # from the cache now
