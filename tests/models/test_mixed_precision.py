"""bf16 autocast on the image transformer: matrix products in bf16, the residual stream, LayerNorm
and the weights in float32 (docs/speed.md). On the ``device`` of tests/conftest.py, under that
device's autocast."""

from __future__ import annotations

import pytest
import torch

from attncnn.models import build_model


@pytest.mark.parametrize("attention", ["quadratic", "learned", "learned-content", "learned-content-9ffaa"])
def test_layernorm_and_the_residual_stream_stay_float32_under_bf16_autocast(attention, device):
    torch.manual_seed(0)
    model = build_model("demo", attention=attention, dim=16, mlp_dim=16, max_size=8).to(device)
    seen = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.LayerNorm, torch.nn.Linear)):
            module.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(name, (args[0].dtype,
                                                                                                 out.dtype)))
    images = torch.randn(2, 3, 32, 32).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(images)
    norms = {n: d for n, d in seen.items() if "norm" in n}
    assert norms and all(d == (torch.float32, torch.float32) for d in norms.values()), norms
    assert seen["blocks.0.fc1"][1] == torch.bfloat16 and seen["head"][1] == torch.bfloat16   # products in bf16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    reference = model(images)
    torch.testing.assert_close(logits.float(), reference, rtol=0.05, atol=0.05)


def test_float64_models_keep_float64(device):
    model = build_model("demo", dim=16, mlp_dim=16).double().to(device)
    assert model(torch.randn(2, 3, 32, 32, dtype=torch.float64).to(device)).dtype == torch.float64
