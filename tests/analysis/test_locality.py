"""Mean attention distance and normalised entropy against hand computations; the model-level
measures against a plain loop over images and blocks; position-only layers without images."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attncnn.analysis import head_locality, model_locality, model_metrics
from attncnn.analysis.locality import Locality, grid_side
from attncnn.analysis.locality_figure import locality_figure
from attncnn.errors import InputError
from attncnn.models import build_model

SMALL = {"num_layers": 3, "num_heads": 4, "dim": 16, "mlp_dim": 16, "pooling": 4, "max_size": 8}


def shift_head(height, width, shift):
    """(N, N) one-hot map: each query attends to query + shift, the shift flipped on each axis where
    it would leave the grid, so that every query's key is exactly |shift| away."""
    n = height * width
    probs = torch.zeros(n, n)
    for q in range(n):
        r, c = divmod(q, width)
        kr = r + shift[0] if 0 <= r + shift[0] < height else r - shift[0]
        kc = c + shift[1] if 0 <= c + shift[1] < width else c - shift[1]
        probs[q, kr * width + kc] = 1.0
    return probs


def test_one_hot_head_at_shift_1_0_has_distance_1_token_and_entropy_0():
    probs = shift_head(4, 4, (1, 0))[None, None]                       # (1, 1, 16, 16)
    stats = head_locality(probs, 4, 4)
    assert stats["distance"].tolist() == pytest.approx([1.0])
    assert stats["normalized_distance"].tolist() == pytest.approx([1 / 4])
    assert stats["normalized_entropy"].tolist() == pytest.approx([0.0], abs=1e-7)
    # a one-hot head at (2, 1) is sqrt(5) tokens away from every query
    assert head_locality(shift_head(4, 4, (2, 1))[None], 4, 4)["distance"].tolist() == pytest.approx([math.sqrt(5)])


def test_uniform_head_has_entropy_1_and_the_mean_pair_distance():
    uniform = torch.full((1, 1, 4, 4), 1 / 4)                          # 2x2 grid
    stats = head_locality(uniform, 2, 2)
    assert stats["normalized_entropy"].tolist() == pytest.approx([1.0])
    # from each corner of a 2x2 grid: itself 0, two neighbours 1, the diagonal sqrt(2)
    assert stats["distance"].tolist() == pytest.approx([(2 + math.sqrt(2)) / 4])
    assert stats["normalized_distance"].tolist() == pytest.approx([(2 + math.sqrt(2)) / 8])


def test_half_on_itself_half_on_a_neighbour_and_the_averages_over_images_and_queries():
    n = 9
    half = 0.5 * (torch.eye(n) + shift_head(3, 3, (0, 1)))
    stats = head_locality(half[None], 3, 3)
    assert stats["distance"].tolist() == pytest.approx([0.5])
    assert stats["normalized_entropy"].tolist() == pytest.approx([math.log(2) / math.log(9)])
    # two images, two heads: the mean over images, per head
    batch = torch.stack([torch.stack([torch.eye(n), half]), torch.stack([shift_head(3, 3, (1, 1)), half])])
    stats = head_locality(batch, 3, 3)
    assert stats["distance"].tolist() == pytest.approx([math.sqrt(2) / 2, 0.5])
    # a subset of queries: the middle token only, looking at its right neighbour
    middle = shift_head(3, 3, (0, 1))[None, None, [4]]
    assert head_locality(middle, 3, 3, queries=[4])["distance"].tolist() == pytest.approx([1.0])


def test_shapes_are_checked():
    with pytest.raises(InputError, match="expected probabilities"):
        head_locality(torch.ones(1, 1, 4, 5), 2, 2)
    with pytest.raises(InputError, match="1x1"):
        head_locality(torch.ones(1, 1, 1, 1), 1, 1)
    with pytest.raises(InputError, match="queries"):
        head_locality(torch.ones(1, 1, 3, 4) / 4, 2, 2)


def _loop_locality(model, images):
    """Image by image and block by block, each layer's explicit probabilities on its own input."""
    per_image = []
    with torch.no_grad():
        for image in images:
            x = model.tokens(image[None])
            layers = []
            for block in model.blocks:
                probs = block.attention(x, return_attention=True)[1]
                layers.append(head_locality(probs, x.shape[1], x.shape[2]))
                x = block(x)
            per_image.append(layers)
    return [{key: sum(img[i][key] for img in per_image) / len(per_image) for key in per_image[0][i]}
            for i in range(len(per_image[0]))]


@pytest.mark.parametrize("preset,options", [("learned-content", SMALL),
                                            ("gpsa-mini", {"num_layers": 2, "dim": 18, "mlp_dim": 16, "pooling": 4})])
def test_content_models_equal_a_plain_loop_over_images(preset, options):
    torch.manual_seed(0)
    model = build_model(preset, **options).eval()
    images = torch.randn(5, 3, 32, 32)
    locality = model_locality(model, images, batch_size=2)
    assert locality.images == 5 and locality.grid == (8, 8) and locality.side == 8
    assert len(locality.layers) == options["num_layers"]
    for layer, expected in zip(locality.layers, _loop_locality(model, images)):
        assert not layer.position_only
        for key in ("distance", "normalized_distance", "normalized_entropy"):
            torch.testing.assert_close(getattr(layer, key), expected[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("preset", ["quadratic", "learned"])
def test_position_only_without_images_equals_the_image_average(preset):
    torch.manual_seed(1)
    model = build_model(preset, **SMALL).eval()
    without = model_locality(model, grid_size=(8, 8))
    assert without.images == 0
    averaged = _loop_locality(model, torch.randn(3, 3, 32, 32))        # through each layer's forward pass
    for layer, expected in zip(without.layers, averaged):
        assert layer.position_only
        for key in ("distance", "normalized_distance", "normalized_entropy"):
            torch.testing.assert_close(getattr(layer, key), expected[key], rtol=1e-5, atol=1e-6)
    with_images = model_locality(model, torch.randn(2, 3, 32, 32))
    for a, b in zip(with_images.layers, without.layers):
        torch.testing.assert_close(a.distance, b.distance)


def test_the_same_numbers_as_inspects_metrics_and_the_summaries():
    torch.manual_seed(2)
    model = build_model("learned-content", **SMALL).eval()
    images = torch.randn(4, 3, 32, 32)
    locality, metrics = model_locality(model, images), model_metrics(model, images)
    for layer, report in zip(locality.layers, metrics["layers"]):
        assert [h["distance"] for h in report["heads"]] == pytest.approx(layer.distance.tolist(), rel=1e-5)
        assert [h["normalized_entropy"] for h in report["heads"]] == pytest.approx(
            layer.normalized_entropy.tolist(), rel=1e-5)
        assert [h["normalized_distance"] for h in report["heads"]] == pytest.approx(
            (layer.distance / 8).tolist(), rel=1e-5)
    best = locality.min_distance()
    flat = [(float(d), lay.layer + 1, h + 1) for lay in locality.layers for h, d in enumerate(lay.distance)]
    assert (best["distance"], best["layer"], best["head"]) == min(flat)
    assert best["normalized_distance"] == pytest.approx(best["distance"] / 8)
    data = locality.to_dict()
    assert data["images"] == 4 and data["side"] == 8 and len(data["layers"]) == 3
    assert data["layers"][0]["layer"] == 1 and len(data["layers"][0]["heads"]) == 4
    assert data["layers"][0]["local_heads"] == int((locality.layers[0].distance <= 1.5).sum())
    back = Locality.from_dict(json.loads(json.dumps(data)))
    assert back.to_dict() == data and back.grid == (8, 8)


def test_errors_and_the_grid_side():
    with pytest.raises(InputError, match="needs test images"):
        model_locality(build_model("learned-content", **SMALL))
    with pytest.raises(InputError, match="non-empty"):
        model_locality(build_model("learned-content", **SMALL), torch.zeros(0, 3, 32, 32))
    with pytest.raises(InputError, match="no self-attention"):
        model_locality(build_model("resnet18"))
    assert grid_side(16, 16) == 16 and grid_side(4, 9) == 6


def test_figure_has_one_dot_per_head_and_run():
    torch.manual_seed(3)
    model = build_model("quadratic", **SMALL)
    runs = {"seed 0": model_locality(model), "seed 1": model_locality(build_model("quadratic", **SMALL))}
    fig = locality_figure(runs, title="quadratic")
    distance_axes, entropy_axes = fig.axes[:2]
    for ax in (distance_axes, entropy_axes):
        assert sum(len(c.get_offsets()) for c in ax.collections) == 2 * 3 * 4
    ys = sorted(float(y) for y in distance_axes.collections[0].get_offsets()[:, 1])
    assert ys == pytest.approx(sorted(v for lay in runs["seed 0"].layers for v in lay.distance.tolist()))
    with pytest.raises(InputError):
        locality_figure({})
