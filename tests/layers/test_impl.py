"""The computation path as a constructor argument (``impl``) and the registry of attention kinds.
Outputs and gradients on the ``device`` of tests/conftest.py (inputs drawn on the CPU, then moved)."""

from __future__ import annotations

import pytest
import torch

from attncnn.layers import (ATTENTION_KINDS, ATTENTION_LAYERS, GridAttention, attention_class, attention_modules,
                            build_attention, dense_attention, local_init_)
from attncnn.models import build_model

D, NH = 8, 9
IMPLS = {"quadratic": ("auto", "dense", "separable", "folded"), "quadratic-generalized": ("auto", "dense", "folded"),
         "learned": ("auto", "dense", "separable", "folded"),
         "learned-content": ("auto", "explicit", "explicit-half", "sdpa", "bilinear", "explicit-onehot"),
         "learned-content-9ffaa": ("auto", "explicit", "explicit-half", "sdpa"),
         "content": ("auto", "explicit", "explicit-half", "sdpa"),
         "gpsa": ("auto", "explicit", "explicit-half", "sdpa")}


def _layer(kind, device="cpu", **kwargs):
    extra = {"max_size": 6} if kind.startswith("learned") else {}
    torch.manual_seed(0)
    layer = build_attention(kind, D, NH, **extra, **kwargs).double()
    if layer.has_positional_term:
        local_init_(layer, alpha=0.7)           # non-trivial positional maps, centres on a 3x3 grid
    return layer.to(device)


def test_every_kind_is_registered_once_with_its_declared_paths():
    assert set(ATTENTION_KINDS) == set(IMPLS)
    for kind in ATTENTION_KINDS:
        cls = attention_class(kind)
        assert kind in cls.KINDS and ATTENTION_LAYERS[kind] is cls
        layer = _layer(kind)
        assert layer.kind == kind and layer.impls == IMPLS[kind] == cls.impls_of(kind)
    with pytest.raises(ValueError, match="unknown attention kind 'conv'; choose one of quadratic, "):
        attention_class("conv")


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("head_dim", [None, 6])
@pytest.mark.parametrize("training", [False, True])
def test_every_path_equals_the_explicit_path_in_float64(kind, head_dim, training, device):
    """Outputs and gradients (input and every parameter) of each impl against the explicit path
    (``return_attention=True``, the plain product of the materialised map), float64, attn_drop 0."""
    reference = _layer(kind, device, head_dim=head_dim).train(training)
    x = torch.randn(2, 5, 6, D, dtype=torch.float64).to(device)    # within the learned tables' max_size 6
    weight = torch.randn(2, 5, 6, D, dtype=torch.float64).to(device)

    def run(layer, **kw):
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        out = layer(xg, **kw)
        out = out[0] if isinstance(out, tuple) else out
        (out * weight).sum().backward()
        return out.detach(), {"x": xg.grad, **{n: p.grad for n, p in layer.named_parameters()}}

    expected, expected_grads = run(reference, return_attention=True)
    for impl in reference.impls:
        layer = _layer(kind, device, head_dim=head_dim, impl=impl).train(training)
        assert layer.impl == impl
        out, grads = run(layer)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12, msg=impl)
        for name, grad in expected_grads.items():
            if grad is None:
                assert grads[name] is None
                continue
            torch.testing.assert_close(grads[name], grad, rtol=1e-9, atol=1e-11, msg=f"{impl}: {name}")


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_attention_probs_of_a_real_input_are_the_returned_probabilities(kind, device):
    layer = _layer(kind, device).eval()
    x = torch.randn(2, 4, 5, D, dtype=torch.float64).to(device)
    with torch.no_grad():
        _, returned = layer(x, return_attention=True)
        probs = layer.attention_probs(x)
    assert probs.shape == ((1 if layer.position_only else 2), NH, 20, 20)
    torch.testing.assert_close(probs, returned, rtol=0, atol=0)


def test_the_path_a_layer_takes_is_what_it_reports():
    layer = _layer("quadratic", attn_drop=0.1)
    assert layer.eval().path(16, 16) == "separable" and layer.path(4, 4) == "dense"
    assert layer.train().path(16, 16) == "dense"                          # dropout on the (N, N) map
    content = _layer("content")
    assert content.path(16, 16) == "explicit-half"                        # full-width heads
    assert _layer("content", head_dim=4).path(16, 16) == "sdpa"
    assert _layer("learned-content").path(16, 16) == "explicit-onehot"    # full-width heads, the fold saves little
    wide = build_attention("learned-content", 400, 9)                        # the paper's layer: the fold saves 42 %
    assert wide.path(16, 16) == wide.path() == "bilinear" and wide.path(64, 64) == "explicit-onehot"
    assert _layer("learned-content", head_dim=6).path(16, 16) == "sdpa"
    assert _layer("learned-content", impl="explicit-half").path(16, 16) == "explicit-half"
    assert _layer("gpsa", attn_drop=0.1).train().path(16, 16) == "explicit"


@pytest.mark.parametrize("kind,bad", [("quadratic", "sdpa"), ("gpsa", "separable"), ("content", "dense")])
def test_an_impl_the_layer_does_not_have_is_a_one_line_error_naming_the_ones_it_has(kind, bad):
    with pytest.raises(ValueError) as err:
        _layer(kind, impl=bad)
    message = str(err.value)
    assert "\n" not in message and f"no impl {bad!r}" in message and ", ".join(IMPLS[kind]) in message
    layer = _layer(kind)
    with pytest.raises(ValueError, match=f"no impl {bad!r}"):
        layer.impl = bad
    assert layer.impl == "auto"


def test_models_take_impl_from_their_configuration_and_reject_a_missing_one():
    model = build_model("quadratic-mini", impl="dense")
    assert model.config.impl == "dense"
    assert {m.impl for m in attention_modules(model)} == {"dense"}
    assert model.train().attention_paths() == ["dense"] * 6
    assert build_model("quadratic-mini").eval().attention_paths() == ["separable"] * 6
    assert build_model("learned-content-mini").attention_paths() == ["explicit-onehot"] * 6
    assert build_model("learned-content-mini", head_dim=8).attention_paths() == ["sdpa"] * 6     # narrow heads
    with pytest.raises(ValueError, match="quadratic-generalized attention has no impl 'separable'; choose one of "
                                         "auto, dense"):
        build_model("quadratic-generalized-mini", impl="separable")
    with pytest.raises(ValueError, match="no impl 'sdpa'"):
        build_model("quadratic-mini", impl="sdpa")


def test_dense_attention_sets_impl_and_restores_it():
    model = build_model("quadratic-mini", impl="separable")
    content = build_model("gpsa-mini")
    with dense_attention(model), dense_attention(content):
        assert {m.impl for m in attention_modules(model)} == {"dense"}
        assert {m.impl for m in attention_modules(content)} == {"explicit"}    # GPSA: its written-out map
    assert {m.impl for m in attention_modules(model)} == {"separable"}


def test_every_layer_declares_what_the_models_and_analysis_ask():
    for cls in set(ATTENTION_LAYERS.values()):
        assert issubclass(cls, GridAttention) and cls.KINDS and "auto" == cls.IMPLS[0]
        for flag in ("position_only", "has_positional_term", "has_centers", "has_gates"):
            assert isinstance(getattr(cls, flag), bool)


def test_eval_impl_is_the_path_of_eval_mode_and_computes_the_same_output(device):
    layer = _layer("gpsa", device, head_dim=6, impl="explicit-half", eval_impl="sdpa")
    assert layer.train().path(5, 6) == "explicit-half" and layer.eval().path(5, 6) == "sdpa"
    plain = _layer("gpsa", device, head_dim=6, impl="explicit-half")
    plain.load_state_dict(layer.state_dict())
    assert plain.eval().path(5, 6) == "explicit-half"                      # unset: impl in both modes
    x = torch.randn(2, 5, 6, D, dtype=torch.float64).to(device)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="has no impl 'folded' \\(eval_impl\\)"):
        layer.eval_impl = "folded"
    with pytest.raises(ValueError, match="eval_impl"):
        build_model("convit-mini", eval_impl="dense")


def test_dense_attention_sets_both_paths_and_restores_them():
    model = build_model("quadratic-mini", impl="folded", eval_impl="separable").eval()
    with dense_attention(model):
        assert model.attention_paths() == ["dense"] * 6
    assert model.attention_paths() == ["separable"] * 6
    assert {(m.impl, m.eval_impl) for m in attention_modules(model)} == {("folded", "separable")}
