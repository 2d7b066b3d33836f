"""Theorem 1 inside a network (attncnn.theory.layer_as_conv, ``attncnn theorem --model``): layer 1 of a
conv-initialised model against F.conv2d on the layer's real input, with the kernel read from the
value matrix directly (not through the extraction code)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from attncnn.cli import main
from attncnn.models import build_model
from attncnn.theory import default_alpha, layer_as_conv, off_target_mass


def _value_kernel(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """The K x K kernel a full-width conv-initialised layer holds: head h = u*K + v owns input
    columns h*D:(h+1)*D of the value map (Lemma 1), and that slice is the tap (u, v)."""
    d, k = attention.dim, 3
    w = attention.value.weight.detach()                                       # (D_out, K*K*D)
    kernel = w.reshape(w.shape[0], k, k, d).permute(0, 3, 1, 2)                # (D_out, D, K, K)
    return kernel, attention.value.bias.detach()


def _interior_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref)[:, 1:-1, 1:-1].abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("preset", ["quadratic-conv-mini", "learned-conv-mini"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_conv_initialised_layer_1_is_the_value_kernel(test_images, preset, dtype, tolerance):
    torch.manual_seed(0)
    model = build_model(preset, head_dim=None, value_init="conv", locality_strength=default_alpha(dtype))
    x = test_images[:4].to(dtype)
    check = layer_as_conv(model, x)
    tokens = model.tokens(x).detach()                                          # (4, 16, 16, 64)
    with torch.no_grad():
        out = model.blocks[0].attention(tokens)
    kernel, bias = _value_kernel(model.blocks[0].attention)
    ref = F.conv2d(tokens.permute(0, 3, 1, 2), kernel, bias, padding=1).permute(0, 2, 3, 1)
    assert _interior_relative_error(out, ref) <= tolerance
    # The extraction finds the same kernel, every head on its own tap, one-hot.
    assert torch.allclose(check.conv.weight, kernel, rtol=0, atol=0)
    assert check.conv.report.max_center_distance <= 1e-9
    assert all(h.target_mass == pytest.approx(1.0, abs=1e-6) for h in check.conv.report.heads)
    assert check.conv.report.errors["relative"]["interior"] <= tolerance
    assert check.conv.report.errors["relative"]["border"] > 0.01               # zero padding vs renormalised


def test_narrow_heads_fold_into_a_rank_limited_kernel(test_images):
    """quadratic-conv-mini as shipped (heads of width 64 with a value projection): layer 1 is still a
    3x3 convolution at high alpha, with the folded matrices W_in^(h) W_out^(h) as taps."""
    torch.manual_seed(1)
    model = build_model("quadratic-conv-mini", head_dim=16, locality_strength=default_alpha(torch.float64))
    check = layer_as_conv(model, test_images[:2], layer=2)
    assert check.layer == 2 and check.conv.report.errors["relative"]["interior"] <= 1e-12
    ranks = torch.linalg.matrix_rank(check.conv.weight.permute(2, 3, 0, 1)).flatten()
    assert ranks.max().item() <= 16


def test_configured_alpha_is_a_blurred_convolution_within_lemma_2(test_images):
    torch.manual_seed(0)
    model = build_model("quadratic-conv-mini")                                 # ConViT's locality strength 1
    check = layer_as_conv(model, test_images[:2].float())
    assert check.init == "conv" and check.alpha == 1.0
    assert check.lemma2_off_target == pytest.approx(off_target_mass(1.0))
    masses = [h.target_mass for h in check.conv.report.heads]
    # Lemma 2 bounds the off-target mass of an interior query (exact on the infinite lattice).
    assert all(1 - m <= check.lemma2_off_target + 1e-6 for m in masses)
    assert max(masses) < 0.4
    assert check.conv.report.errors["relative"]["interior"] > 0.1


@pytest.mark.parametrize("preset", ["gpsa-mini", "learned-content-mini", "learned-content-9ffaa-mini",
                                    "quadratic-mini"])
def test_content_layers_and_random_init(test_images, preset):
    torch.manual_seed(0)
    model = build_model(preset)
    if preset == "quadratic-mini":                     # random init: any layer has a nearest convolution
        check = layer_as_conv(model, test_images[:1].float())
        assert check.init == "random" and check.alpha is None and check.lemma2_off_target is None
        assert check.conv.report.max_center_distance > 0.1
        return
    with pytest.raises(ValueError, match="depends on the content"):
        layer_as_conv(model, test_images[:1].float())


def test_bad_layer_and_model(test_images):
    model = build_model("quadratic-conv-mini")
    with pytest.raises(ValueError, match="between 1 and 6"):
        layer_as_conv(model, test_images[:1].float(), layer=0)
    with pytest.raises(ValueError, match="not an image transformer"):
        layer_as_conv(build_model("resnet18-mini"), test_images[:1].float())


def _theorem(capsys, cifar10_path, data_cache_dir, *argv):
    rc = main(["theorem", "--data", str(cifar10_path), "--data-dir", str(data_cache_dir), "--images", "2", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_command_reports_layer_1_equal_to_a_convolution(capsys, cifar10, cifar10_path, data_cache_dir):
    rc, out, err = _theorem(capsys, cifar10_path, data_cache_dir, "--model", "quadratic-conv-mini",
                            "--set", "locality_strength=87.4", "--json")
    assert rc == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    assert (r["dtype"], r["layer"], r["heads"], r["kernel_size"], r["init"]) == ("float32", 1, 9, 3, "conv")
    assert r["locality_strength"] == 87.4 and r["relative_error"]["interior"] <= 1e-5
    assert r["min_target_mass"] == pytest.approx(1.0) and len(r["per_head"]) == 9
    rc, out, _ = _theorem(capsys, cifar10_path, data_cache_dir, "--model", "quadratic-conv-mini")
    assert rc == 0 and "differs from a 3x3 convolution" in out and "| head | center" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "quadratic-conv-mini", "--kernel", "3"], "--kernel: these options describe a convolution"),
    (["--set", "locality_strength=2"], "--model only"),
    (["--model", "/nonexistent/run", "--set", "dim=8"], "not one"),
    (["--model", "/nonexistent/run"], "neither a preset"),
    (["--model", "gpsa-mini"], "depends on the content"),
])
def test_bad_model_options_exit_2(capsys, cifar10_path, data_cache_dir, argv, message):
    rc, _, err = _theorem(capsys, cifar10_path, data_cache_dir, *argv)
    assert rc == 2 and message in err
