"""A model's recorded attention paths are given back to the layers' rule where they cannot run."""

from __future__ import annotations

import torch

from attncnn.layers import attention_modules, paths_for_device_
from attncnn.models import build_model

SMALL = {"dim": 32, "mlp_dim": 32, "num_layers": 2, "num_heads": 2, "pooling": 4}


def _paths(model):
    return [(layer.impl, layer.eval_impl) for layer in attention_modules(model)]


def test_a_cuda_only_training_path_and_an_unfused_cpu_test_path_go_back_to_auto_on_a_cpu():
    model = build_model("learned-content-mini", impl="flex", eval_impl="sdpa-onehot", **SMALL)
    changes = paths_for_device_(model, "cpu")
    assert _paths(model) == [("auto", None)] * 2
    assert len(changes) == 4
    assert changes[0].startswith("blocks.0.attention: impl 'flex' -> 'auto' (FlexAttention has no backward on cpu")
    assert changes[1].startswith("blocks.0.attention: eval_impl 'sdpa-onehot' -> unset (PyTorch's fused CPU "
                                 "attention kernel needs")


def test_paths_that_run_on_the_device_are_kept():
    model = build_model("learned-content-mini", impl="explicit-onehot", eval_impl="bilinear", **SMALL)
    assert paths_for_device_(model, torch.device("cpu")) == []
    assert _paths(model) == [("explicit-onehot", "bilinear")] * 2
    # on CUDA (only the device's type is read: nothing runs) FlexAttention trains with heads of 16 channels
    flex = build_model("learned-content-mini", impl="flex", eval_impl="sdpa-onehot", **SMALL)
    assert paths_for_device_(flex, torch.device("cuda")) == []
    assert _paths(flex) == [("flex", "sdpa-onehot")] * 2


def test_a_test_path_dropped_falls_back_to_a_training_path_that_runs():
    model = build_model("learned-content-mini", impl="explicit", eval_impl="flex", **SMALL)
    paths_for_device_(model, "cpu")
    assert _paths(model) == [("explicit", None)] * 2
    model.eval()
    assert {layer.path(8, 8) for layer in attention_modules(model)} == {"explicit"}


def test_position_only_layers_and_networks_without_attention_are_untouched():
    quadratic = build_model("quadratic-mini", impl="separable", **SMALL)
    assert paths_for_device_(quadratic, "cpu") == [] and _paths(quadratic) == [("separable", None)] * 2
    assert paths_for_device_(build_model("resnet18-mini"), "cpu") == []
