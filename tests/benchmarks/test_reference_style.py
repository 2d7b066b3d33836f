"""The benchmark's reference-style baseline computes the same outputs as our layers."""


import pytest
import torch

from reference_style import reference_style_model

from attncnn import build_model
from attncnn.models import count_parameters
from attncnn.perf.bench.harness import bench_preset_isolated


@pytest.mark.parametrize("preset", ["quadratic", "quadratic-generalized", "learned", "learned-content"])
def test_reference_style_equals_ours(preset):
    torch.manual_seed(0)
    model = build_model(preset, num_layers=2, dim=32, mlp_dim=16).double().eval()
    ref = reference_style_model(model).eval()
    x = torch.randn(3, 3, 32, 24, dtype=torch.float64)     # non-square 16x12 token grid
    torch.testing.assert_close(ref(x), model(x), rtol=1e-10, atol=1e-10)


def test_the_harness_times_the_baseline_in_a_fresh_process():
    # benchmarks/compare.py's call: the baseline is benchmarks' function, which the package does not
    # import; the spawned process finds it on the sys.path it inherits
    options = dict(num_layers=1, dim=32, mlp_dim=16)
    result = bench_preset_isolated(preset="quadratic", baseline=reference_style_model, batch_size=2, reps=1,
                                   overrides=options)
    assert result["baseline"] == "reference_style_model" and result["train_images_per_s"] > 0
    assert result["parameters"] == count_parameters(build_model("quadratic", **options))
    assert result["attention_paths"] == {"train": None, "eval": None}        # its layers are not ours
