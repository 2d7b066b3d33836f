"""benchmarks/parity.py: the fp32 probe is deterministic for one code, and a difference is found,
measured relative to the tensor's scale and named."""


from pathlib import Path

import pytest
import torch

from parity import fp32_difference, probe

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_of_one_code_twice_is_identical(tmp_path):
    first = probe(ROOT / "src", "demo", tmp_path / "a.safetensors")
    second = probe(ROOT / "src", "demo", tmp_path / "b.safetensors")
    assert first["logits"].shape == (8, 10) and any(k.startswith("grad.") for k in first)
    assert fp32_difference(first, second) == (0.0, "")


def test_a_difference_is_relative_to_the_tensors_scale_and_named():
    f64 = {"dtype": torch.float64}
    base = {"logits": torch.tensor([2.0, -4.0], **f64), "grad.w": torch.tensor([1e-3, 0.0], **f64)}
    new = {"logits": torch.tensor([2.0, -4.0 + 4e-6], **f64), "grad.w": torch.tensor([1e-3 + 1e-8, 0.0], **f64)}
    worst, name = fp32_difference(base, new)
    assert name == "grad.w" and worst == pytest.approx(1e-5, rel=1e-3)      # 1e-8 of 1e-3, not of 4
    with pytest.raises(ValueError, match="different models"):
        fp32_difference(base, {"logits": base["logits"]})
