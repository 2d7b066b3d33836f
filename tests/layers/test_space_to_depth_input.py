"""``SpaceToDepth`` (the paper's invertible-pooling stem) against a plain loop over the patches, and
what it says about channels-first images, the usual mistake: a ``(B, 3, 32, 32)`` batch read as a
3x32 grid of 32 channels used to be refused as "grid 3x32 is not divisible by the pooling width 2"."""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import SpaceToDepth, space_to_depth

PERMUTE = r"images\.permute\(0, 2, 3, 1\)"


def _patches(x: torch.Tensor, p: int) -> torch.Tensor:
    """Space-to-depth written out: token [i, j] lists its patch row by row, each pixel's channels
    together, i.e. x[i*p + a, j*p + b, c] at feature (a*p + b)*C + c."""
    b, h, w, c = x.shape
    out = torch.empty(b, h // p, w // p, p * p * c, dtype=x.dtype)
    for i in range(h // p):
        for j in range(w // p):
            out[:, i, j] = torch.cat([x[:, i * p + a, j * p + col] for a in range(p) for col in range(p)], dim=-1)
    return out


@pytest.mark.parametrize("shape,p,channels", [((2, 32, 32, 3), 2, 3), ((1, 8, 12, 5), 4, None), ((3, 6, 4, 1), 2, 1)])
def test_the_module_folds_patches_in_the_documented_order(shape, p, channels):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    y = SpaceToDepth(p, channels=channels)(x)
    assert y.shape == (shape[0], shape[1] // p, shape[2] // p, p * p * shape[3])
    assert torch.equal(y, _patches(x, p))
    assert torch.equal(y, space_to_depth(x, p))                      # the model's call, unchanged


@pytest.mark.parametrize("shape", [(8, 3, 32, 32), (2, 1, 28, 28), (4, 4, 31, 31)])
def test_channels_first_images_are_named_as_such_with_the_fix(shape):
    with pytest.raises(ValueError, match=rf"looks like channels-first images \(B, C, H, W\) with C={shape[1]}: "
                                         rf"pass {PERMUTE}"):
        SpaceToDepth(2)(torch.zeros(shape))


def test_a_module_that_knows_its_channels_refuses_any_other_width():
    stem = SpaceToDepth(2, channels=3)
    # divisible, so without the channel count it would have run on a 4x32 grid of 32 channels
    assert SpaceToDepth(2)(torch.zeros(1, 4, 32, 32)).shape == (1, 2, 16, 128)
    with pytest.raises(ValueError, match=rf"channels-first images \(B, C, H, W\) with C=3: pass {PERMUTE}"):
        stem(torch.zeros(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"expects a channels-last grid \(B, H, W, 3\), got shape \(2, 32, 32, 4\) "
                                         r"with 4 channels; give it 3-channel grids or pool with channels=4"):
        stem(torch.zeros(2, 32, 32, 4))
    assert "channels=3" in repr(stem)


@pytest.mark.parametrize("shape", [(1, 31, 32, 3), (1, 32, 29, 3), (1, 5, 4, 8)])
def test_a_grid_that_is_really_indivisible_keeps_its_own_error(shape):
    with pytest.raises(ValueError, match=r"grid \d+x\d+ is not divisible by the pooling width 2") as caught:
        SpaceToDepth(2)(torch.zeros(shape))
    assert "channels-first" not in str(caught.value)
