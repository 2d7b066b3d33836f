"""Each layer class says what its kinds imply; the registry builds the same layer by name and from a model config."""


import pytest

from attncnn.layers import ATTENTION_KINDS, ATTENTION_LAYERS, build_attention
from attncnn.layers.base import positional_kinds
from attncnn.models import ImageTransformerConfig


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_build_attention_and_a_model_configuration_give_the_same_layer(kind):
    config = ImageTransformerConfig(attention=kind, dim=18, num_heads=9)
    cls = ATTENTION_LAYERS[kind]
    by_name = build_attention(kind, 18, 9, **config.attention_kwargs())
    assert by_name.kind == kind
    assert cls(18, 9, **cls.config_kwargs(kind, config)).kind == kind


def test_error_messages_name_every_kind_with_a_positional_term():
    expected = tuple(k for k in ATTENTION_KINDS if ATTENTION_LAYERS[k].has_positional_term)
    assert set(positional_kinds()) == set(expected) and "quadratic-generalized" in expected
    with pytest.raises(ValueError) as err:
        build_attention("content", 18, 9).local_init_(None, 1.0)
    assert all(k in str(err.value) for k in expected)
