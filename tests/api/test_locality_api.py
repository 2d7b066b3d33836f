"""``attncnn.locality`` and ``attncnn.attention_rollout``: the analysis functions behind them, on the
stated images, with the model's own input normalisation."""

from __future__ import annotations

import pytest
import torch

import attncnn
from attncnn.analysis import attention_rollout as rollout_of_maps
from attncnn.analysis import model_locality
from attncnn.analysis.locality import Locality
from attncnn.data import CIFAR_MEAN, CIFAR_STD

SMALL = {"num_layers": 2, "num_heads": 4, "dim": 16, "mlp_dim": 16, "pooling": 4, "max_size": 8}


def test_a_shipped_position_only_model_needs_no_images_and_gives_the_same_with_them():
    model = attncnn.pretrained("learned-mini")
    without = attncnn.locality(model)
    assert isinstance(without, Locality) and without.images == 0 and without.grid == (16, 16)
    assert len(without.layers) == 6 and without.layers[0].distance.shape == (9,)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    with_images = attncnn.locality(model, images)
    assert with_images.images == 0                    # nothing depended on them
    for a, b in zip(without.layers, with_images.layers):
        torch.testing.assert_close(a.distance, b.distance)
    rolled = attncnn.attention_rollout(model)
    assert [r.probs.shape for r in rolled] == [(1, 1, 256, 256)] * 6
    expected = rollout_of_maps(attncnn.attention_maps(model, scores=False))[-1][0]
    torch.testing.assert_close(rolled[-1].probs[0, 0], expected)


def test_a_content_model_is_averaged_over_the_first_n_images_normalised_as_it_was_trained():
    torch.manual_seed(0)
    network = attncnn.build_model("learned-content", **SMALL).eval()
    classifier = attncnn.Classifier(network, mean=CIFAR_MEAN, std=CIFAR_STD, image_size=(32, 32))
    images = torch.rand(5, 3, 32, 32)
    got = attncnn.locality(classifier, images, n_images=3, batch_size=2)
    normalised = (images[:3] - torch.tensor(CIFAR_MEAN)[:, None, None]) / torch.tensor(CIFAR_STD)[:, None, None]
    expected = model_locality(network, normalised)
    assert got.images == 3
    for a, b in zip(got.layers, expected.layers):
        torch.testing.assert_close(a.normalized_entropy, b.normalized_entropy)
    rolled = attncnn.attention_rollout(classifier, images[:2], average=True)
    assert rolled[-1].probs.shape == (1, 1, 64, 64)
    with pytest.raises(attncnn.AttncnnError, match="pass test images"):
        attncnn.locality(network)
    with pytest.raises(attncnn.AttncnnError, match="pass test images"):
        attncnn.attention_rollout(network)
    with pytest.raises(attncnn.AttncnnError, match="n_images"):
        attncnn.locality(network, images, n_images=0)
