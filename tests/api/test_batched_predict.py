"""``Classifier.predict`` / ``probabilities`` / ``logits`` run many images ``batch_size`` at a time
(one forward pass of 10,000 images allocated gigabytes at once), with the answers of one big batch,
the resizing done per batch too, and the batch size checked by the one helper that
``attncnn.attention_maps`` also uses. Small random-weight models: no committed results needed."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import attncnn

N = 17          # images: batches of 7 leave a remainder of 3


def _model(**overrides) -> attncnn.Classifier:
    torch.manual_seed(0)
    return attncnn.Classifier(attncnn.build_model("demo", num_classes=10, **overrides), image_size=32).eval()


def _images(n: int = N, side: int = 32) -> torch.Tensor:
    return torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(1))


def _batches_seen(model: attncnn.Classifier) -> list[int]:
    """The number of images of every forward pass of ``model.network`` from now on."""
    seen: list[int] = []
    model.network.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    return seen


def test_batched_answers_equal_one_big_batch_of_the_plain_network():
    model = _model()
    images = _images()
    with torch.no_grad():
        reference = model.network(model.preprocess(images))          # all images in one pass
    # the labels below are compared exactly: make sure no image's top two logits are within rounding
    top2 = reference.topk(2, dim=1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-4
    labels = [model.classes[i] for i in reference.argmax(dim=1).tolist()]
    probs = torch.softmax(reference, dim=1)
    for batch_size in (1, 7, N, 50):
        assert model.predict(images, batch_size=batch_size) == labels
        # not bit-exact: a matrix product over 1 or 7 rows may sum in another order than over 17
        # (another BLAS kernel), which moves float32 logits by a few ulps
        torch.testing.assert_close(model.logits(images, batch_size=batch_size), reference, rtol=1e-5, atol=1e-6)
        batched = model.probabilities(images, batch_size=batch_size)
        assert batched.shape == (N, 10) and batched.dtype == torch.float32
        torch.testing.assert_close(batched, probs, rtol=1e-5, atol=1e-7)
    assert model.predict(images) == labels                            # the default batch size
    assert model.logits(images[:0]).shape == (0, 10) and model.predict(images[:0]) == []


def test_no_forward_pass_sees_more_than_batch_size_images():
    model = _model()
    seen = _batches_seen(model)
    model.predict(_images(), batch_size=7)
    assert seen == [7, 7, 3]
    seen.clear()
    model.probabilities(_images(), batch_size=7)
    model.logits(_images(), batch_size=16)
    assert seen == [7, 7, 3, 16, 1]
    seen.clear()
    model.predict(_images(120))                                       # the default: 50, as attention_maps
    assert seen == [50, 50, 20]
    default = inspect.signature(attncnn.attention_maps).parameters["batch_size"].default
    assert default == inspect.signature(attncnn.Classifier.predict).parameters["batch_size"].default == 50


def test_resizing_is_done_per_batch(monkeypatch):
    model = _model()
    large = _images(side=64)
    with torch.no_grad():
        expected = model.network(model.preprocess(large, resize=True))    # resized all at once
    resized: list[int] = []
    interpolate = F.interpolate

    def counting(x, *args, **kwargs):
        resized.append(x.shape[0])
        return interpolate(x, *args, **kwargs)

    monkeypatch.setattr(F, "interpolate", counting)
    assert model.predict(large, resize=True, batch_size=7) == [model.classes[i] for i in expected.argmax(1).tolist()]
    assert resized == [7, 7, 3]
    torch.testing.assert_close(model.logits(large, resize=True, batch_size=7), expected, rtol=1e-5, atol=1e-6)


def test_every_image_is_checked_before_the_first_pass():
    model = _model()
    images = _images()
    images[-1, 0, 0, 0] = float("nan")                               # in the last batch
    seen = _batches_seen(model)
    with pytest.raises(ValueError, match="images must be finite: 1 values are NaN"):
        model.predict(images, batch_size=7)
    assert seen == []


def test_the_network_runs_in_eval_mode_and_gets_its_mode_back():
    model = _model(dropout=0.5)
    images = _images()
    with torch.no_grad():
        reference = model.network(model.preprocess(images))          # eval mode: no dropout
    model.network.train()
    with torch.no_grad():                                             # dropout on: another answer
        assert not torch.allclose(model.network(model.preprocess(images)), reference, atol=1e-3)
    torch.testing.assert_close(model.logits(images, batch_size=7), reference, rtol=1e-5, atol=1e-6)
    assert model.network.training


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8"])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused_by_every_batched_call(batch_size):
    model = _model()
    images = _images(2)
    for call in (model.predict, model.probabilities, model.logits,
                 lambda x, batch_size: attncnn.attention_maps(model, x, batch_size=batch_size)):
        with pytest.raises(ValueError, match=rf"batch_size must be a positive integer .*got {batch_size!r}"):
            call(images, batch_size=batch_size)
