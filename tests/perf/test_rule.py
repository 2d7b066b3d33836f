"""The written rule for attention paths and compile: exact outputs for the rows of its tables."""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import ATTENTION_LAYERS
from attncnn.perf import rule
from attncnn.perf.rule import COMPILE, MIN_COMPILED_SECONDS, PATHS, choose, device_kind

MINI, DEMO = (16, 16), (8, 8)         # the mini presets' token grid on 32 x 32 images; demo's (pooling 4)


def _paths(device, kind, grid=MINI, precision="bf16"):
    choice = choose(device, kind, grid, precision, 0)
    return choice.train_impl, choice.eval_impl


@pytest.mark.parametrize("device,kind,grid,expected", [
    ("cpu-amx", "quadratic", MINI, ("folded", "folded")),
    ("cpu-amx", "learned", DEMO, ("folded", "dense")),
    ("cpu-amx", "quadratic-generalized", MINI, ("folded", "folded")),
    ("cpu", "quadratic", MINI, ("separable", "separable")),
    ("cpu", "learned", MINI, ("separable", "separable")),
    ("cpu", "quadratic", DEMO, ("dense", "dense")),                      # below the separable threshold
    ("cpu", "quadratic", (12, 12), ("separable", "separable")),          # H W = 6 (H + W): at it
    ("cpu", "quadratic", (11, 11), ("dense", "dense")),
    ("cpu", "quadratic-generalized", MINI, ("dense", "dense")),
    ("cpu-amx", "learned-content", MINI, ("auto", "auto")),
    ("cpu", "learned-content", MINI, ("auto", "auto")),
    ("cpu-amx", "content", MINI, ("explicit-half", "auto")),
    ("cpu-amx", "gpsa", MINI, ("explicit-half", "auto")),
    ("cpu", "gpsa", MINI, ("explicit-half", "auto")),
    ("cuda", "quadratic", MINI, ("dense", "dense")),
    ("cuda", "learned", DEMO, ("dense", "dense")),
    ("cuda", "quadratic-generalized", MINI, ("dense", "dense")),
    ("cuda", "learned-content", MINI, ("explicit-half", "sdpa")),
    ("cuda", "gpsa", MINI, ("auto", "auto")),                             # no measurement: the layers' rule
    ("cpu", "content", MINI, ("auto", "auto")),
    ("cpu", "learned-content-9ffaa", MINI, ("auto", "auto")),
    ("mps", "quadratic", MINI, ("auto", "auto")),
    ("cpu", None, MINI, (None, None)),                                    # a ResNet: no attention layers
])
def test_the_paths_of_each_row(device, kind, grid, expected):
    assert _paths(device, kind, grid) == expected
    assert _paths(device, kind, grid, "fp32") == expected                 # the winners measured agree in fp32


def test_every_path_the_rule_names_is_one_the_kind_has():
    for (device, family), (train, evaluate, source) in PATHS.items():
        assert source
        kinds = [k for k in ATTENTION_LAYERS if rule.family(k) == family]
        assert kinds, family
        for kind in kinds:
            for grid in (DEMO, MINI):
                for path in _paths(device, kind, grid):
                    assert path in ATTENTION_LAYERS[kind].impls_of(kind), (device, kind, path)


@pytest.mark.parametrize("device,kind,batch,minimum", [
    ("cpu", None, 100, 5475),              # 600 s at 912.5 images/s eager
    ("cpu-amx", None, 100, 8334),          # at 1,389
    ("cpu-amx", "learned-content", 100, 413),
    ("cpu-amx", "gpsa", 100, 516),
    ("cuda", "learned-content", 100, 12060),
    ("cpu", None, 10, 54750),              # smaller batches: more steps to the same ten minutes
])
def test_a_run_compiles_exactly_from_ten_minutes_of_eager_training(device, kind, batch, minimum):
    speed = COMPILE[device, rule.family(kind)][0]
    assert (minimum - 1) * batch / speed < MIN_COMPILED_SECONDS <= minimum * batch / speed
    assert choose(device, kind, MINI, "bf16", minimum, batch=batch).compile is True
    assert choose(device, kind, MINI, "bf16", minimum - 1, batch=batch).compile is False


@pytest.mark.parametrize("device,kind", [("cpu", "quadratic"), ("cpu", "learned-content"), ("cpu", "gpsa"),
                                         ("cpu-amx", "quadratic"), ("cpu-amx", "quadratic-generalized"),
                                         ("cuda", "quadratic"), ("cuda", None), ("mps", None)])
def test_where_compiling_was_not_measured_faster_no_run_compiles(device, kind):
    choice = choose(device, kind, MINI, "bf16", 10**9)
    assert choice.compile is False and "compile off: not measured faster" in choice.source


def test_the_rule_is_pure_and_checks_its_arguments():
    assert choose("cpu", "quadratic", MINI, "bf16", 3000) == choose("cpu", "quadratic", MINI, "bf16", 3000)
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16'"):
        choose("cpu", "quadratic", MINI, "auto", 1)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        choose("cpu", "quadratic", MINI, "bf16", -1)


def test_the_device_kind_splits_cpus_by_amx_tiles(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert device_kind("cpu") == "cpu-amx" and device_kind(torch.device("cpu")) == "cpu-amx"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert device_kind("cpu") == "cpu"
    assert device_kind("cuda:1") == "cuda" and device_kind("meta") == "meta"
