"""An input in another dtype than a layer's parameters is refused by name, with the fix, before
PyTorch's "mat1 and mat2 must have the same dtype" from deep inside the forward; a float64 layer
takes float64 input, and autocast's mixed dtypes (bf16 input, float32 weights) still run."""

from __future__ import annotations

import pytest
import torch

import attncnn
from attncnn.layers import ATTENTION_KINDS, build_attention

D, NH, B, H, W = 8, 4, 2, 4, 4


def _layer(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_attention(kind, D, NH).eval()


def _input(dtype=torch.float32) -> torch.Tensor:
    return torch.randn(B, H, W, D, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_a_float64_input_to_a_float32_layer_is_refused_with_the_fix(kind):
    layer = _layer(kind)
    with pytest.raises(ValueError, match=r"got a torch\.float64 input but its parameters are torch\.float32: convert "
                                         r"the input \(x\.to\(torch\.float32\)\) or the layer "
                                         r"\(layer\.to\(torch\.float64\)\)$"):
        layer(_input(torch.float64))
    with pytest.raises(ValueError, match="float64 input"):               # the analysis tools' entry too
        layer.attention_probs(_input(torch.float64))


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_a_bf16_input_outside_autocast_is_pointed_to_autocast(kind):
    with pytest.raises(ValueError, match=r"torch\.bfloat16 input but its parameters are torch\.float32: .*"
                                         r"or keep torch\.float32 weights and run under "
                                         r'torch\.autocast\("cpu", dtype=torch\.bfloat16\)'):
        _layer(kind)(_input(torch.bfloat16))


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_matching_dtypes_and_autocast_run(kind):
    layer = _layer(kind)
    with torch.no_grad():
        reference = layer(_input())
        wide = layer.to(torch.float64)(_input(torch.float64))          # a float64 layer takes float64
        assert wide.dtype == torch.float64
        torch.testing.assert_close(wide.float(), reference, rtol=1e-5, atol=1e-5)
        layer.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = layer(_input(torch.bfloat16))                         # bf16 input, float32 weights
        assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="float64 input"):
            layer(_input(torch.float64))                                 # autocast leaves float64 alone


def test_the_image_transformer_checks_its_images_before_the_embedding():
    torch.manual_seed(0)
    model = attncnn.build_model("demo").eval()
    images = torch.rand(2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"ImageTransformer got a torch\.float64 input but its parameters are "
                                         r"torch\.float32: convert the input \(images\.to\(torch\.float32\)\) or the "
                                         r"model \(model\.to\(torch\.float64\)\)"):
        model(images.double())
    with torch.no_grad():
        assert model.double()(images.double()).dtype == torch.float64
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model.float()(images.bfloat16()).shape == (2, 10)
