"""The benchmark's reference-style baseline computes the same outputs as our layers."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from reference_style import reference_style_model  # noqa: E402

from attncnn import build_model  # noqa: E402


@pytest.mark.parametrize("preset", ["quadratic", "quadratic-generalized", "learned", "learned-content"])
def test_reference_style_equals_ours(preset):
    torch.manual_seed(0)
    model = build_model(preset, num_layers=2, dim=32, mlp_dim=16).double().eval()
    ref = reference_style_model(model).eval()
    x = torch.randn(3, 3, 32, 24, dtype=torch.float64)     # non-square 16x12 token grid
    torch.testing.assert_close(ref(x), model(x), rtol=1e-10, atol=1e-10)
