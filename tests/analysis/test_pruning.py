"""Pruning degenerate heads: counts, parameters, and unchanged outputs when pruned heads are silent."""

from __future__ import annotations

import pytest
import torch

from attncnn.analysis.pruning import prune_degenerate_heads, prune_layer
from attncnn.layers import QuadraticAttention
from attncnn.models import build_model, count_parameters


def _silence(layer, heads):
    """Make heads degenerate (tiny spread) and zero their value columns."""
    dh = layer.head_dim
    with torch.no_grad():
        for h in heads:
            layer.spreads[h] = 1e-4 if not layer.full_covariance else 1e-4 * torch.eye(2)
            layer.value.weight[:, h * dh:(h + 1) * dh] = 0.0


@pytest.mark.parametrize("attention", ["quadratic", "quadratic-generalized"])
def test_pruning_silent_heads_keeps_the_outputs(attention):
    torch.manual_seed(0)
    model = build_model("demo", attention=attention, dim=16, mlp_dim=16, num_heads=9, num_layers=3).eval()
    _silence(model.blocks[0].attention, [1, 4])
    _silence(model.blocks[2].attention, [8])
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        before = model(images)
    params = count_parameters(model)
    result = prune_degenerate_heads(model)
    assert result.pruned == [[1, 4], [], [8]]
    assert result.heads_before == [9, 9, 9] and result.heads_after == [7, 9, 8]
    per_head = 2 + (4 if attention == "quadratic-generalized" else 1) + 16 * 16     # centre, spread, value block
    assert result.parameters_before == params and result.parameters_after == params - 3 * per_head
    assert result.parameters_after == count_parameters(model)
    with torch.no_grad():
        torch.testing.assert_close(model(images), before, rtol=1e-5, atol=1e-6)


def test_prune_layer_with_a_value_projection_and_errors():
    torch.manual_seed(0)
    layer = QuadraticAttention(8, 4, head_dim=3).eval()
    x = torch.randn(2, 5, 5, 8)
    with torch.no_grad():
        layer.value.weight[:, 3:6] = 0.0                      # head 1 silent
        small = prune_layer(layer, torch.tensor([True, False, True, True]))
        torch.testing.assert_close(small(x), layer(x))
    assert small.num_heads == 3 and small.value_in.out_features == 9
    with pytest.raises(ValueError, match="every head"):
        prune_layer(layer, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="quadratic"):
        prune_degenerate_heads(build_model("learned", num_layers=1, dim=16, mlp_dim=16))
