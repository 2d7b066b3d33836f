"""CutMix: the batched paste and label mix against a plain per-image computation, the boxes' draws,
the loader with CutMix on, and the recipe's checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attncnn.data import DeviceLoader, ImageSplit, apply_cutmix, draw_boxes
from attncnn.errors import InputError
from attncnn.runs import TrainConfig
from attncnn.training.state import RunningSums
from attncnn.training.step import training_step


def _plain_cutmix(images, labels, box, num_classes):
    """Per image, in Python: copy the partner's box, mix the labels by the area that is left."""
    y0, y1, x0, x1 = (int(v) for v in box)
    b, _, h, w = images.shape
    out = images.clone()
    targets = torch.zeros(b, num_classes)
    area = max(y1 - y0, 0) * max(x1 - x0, 0)
    lam = 1.0 - area / (h * w)
    for i in range(b):
        partner = b - 1 - i
        out[i, :, y0:y1, x0:x1] = images[partner, :, y0:y1, x0:x1]
        targets[i, int(labels[i])] += lam
        targets[i, int(labels[partner])] += 1.0 - lam
    return out, targets


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 6), h=st.integers(1, 9), w=st.integers(1, 9), data=st.data())
def test_the_batched_paste_equals_a_per_image_paste(b, h, w, data):
    y0 = data.draw(st.integers(0, h))
    y1 = data.draw(st.integers(y0, h))
    x0 = data.draw(st.integers(0, w))
    x1 = data.draw(st.integers(x0, w))
    g = torch.Generator().manual_seed(b * 100 + h * 10 + w)
    images = torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 5, (b,), generator=g)
    box = torch.tensor([y0, y1, x0, x1])
    mixed, targets = apply_cutmix(images, labels, box, 5)
    want_images, want_targets = _plain_cutmix(images, labels, box, 5)
    assert mixed.dtype == torch.uint8 and torch.equal(mixed, want_images)
    assert targets.dtype == torch.float32 and torch.allclose(targets, want_targets, atol=1e-6, rtol=0)
    assert torch.allclose(targets.sum(1), torch.ones(b))


def test_an_empty_box_changes_nothing_and_gives_one_hot_targets():
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.tensor([0, 3, 1, 2])
    mixed, targets = apply_cutmix(images, labels, torch.zeros(4, dtype=torch.long), 4)
    assert torch.equal(mixed, images)
    assert torch.equal(targets, F.one_hot(labels, 4).float())


def test_boxes_follow_the_papers_draw_and_are_a_pure_function_of_seed_and_epoch():
    boxes = draw_boxes(3, 7, 2000, 32, 32, 0.5, 1.0)
    assert boxes.shape == (2000, 4) and boxes.dtype == torch.int64
    assert torch.equal(boxes, draw_boxes(3, 7, 2000, 32, 32, 0.5, 1.0))
    assert not torch.equal(boxes, draw_boxes(3, 8, 2000, 32, 32, 0.5, 1.0))
    # the first rows do not depend on how many batches are asked for (a resumed epoch asks the same)
    assert torch.equal(draw_boxes(3, 7, 10, 32, 32, 0.5, 1.0), boxes[:10])
    y0, y1, x0, x1 = boxes.unbind(1)
    assert bool(((0 <= y0) & (y0 <= y1) & (y1 <= 32) & (0 <= x0) & (x0 <= x1) & (x1 <= 32)).all())
    mixed = (y1 > y0) & (x1 > x0)
    # about half the batches are mixed (p = 0.5; 2000 draws: 5 standard deviations is 0.056)
    assert abs(mixed.float().mean().item() - 0.5) < 0.056
    # lam ~ Beta(1, 1) is uniform, so the box's side is side * sqrt(1 - lam) before clipping: its mean
    # area fraction before clipping is E[1 - lam] = 1/2; clipping only shrinks boxes
    area = ((y1 - y0) * (x1 - x0))[mixed].float() / 1024
    assert 0.1 < area.mean().item() < 0.5
    assert torch.equal(draw_boxes(3, 7, 50, 32, 32, 0.0, 1.0), torch.zeros(50, 4, dtype=torch.long))


def _split(n=40):
    g = torch.Generator().manual_seed(0)
    return ImageSplit(torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8), torch.arange(n) % 4)


def test_the_loader_mixes_after_crop_and_flip_and_leaves_them_as_they_were():
    split = _split()
    plain = DeviceLoader(split, batch_size=8, train=True, seed=5, crop_padding=2)
    mixing = DeviceLoader(split, batch_size=8, train=True, seed=5, crop_padding=2, cutmix=1.0, num_classes=4)
    boxes = draw_boxes(5, 0, len(mixing), 8, 8, 1.0, 1.0)
    mean, std = mixing._mean, mixing._std
    for i, ((x, y), (xm, targets)) in enumerate(zip(plain, mixing)):
        u8 = torch.round((x * std + mean) * 255).to(torch.uint8)       # the crop and flip, as uint8
        want_x, want_t = _plain_cutmix(u8, y, boxes[i], 4)
        assert torch.equal(xm, mixing._normalise(want_x))
        assert torch.allclose(targets, want_t, atol=1e-6, rtol=0)
    # a resumed epoch (from batch 3) mixes its batches as the uninterrupted one did
    whole = list(mixing.batches(0))
    for (step, (x, t)), (_, (xw, tw)) in zip(mixing.batches(0, start=3), whole[3:]):
        assert torch.equal(x, xw) and torch.equal(t, tw)
    # evaluation never mixes
    test = DeviceLoader(split, batch_size=8, train=False, cutmix=1.0, num_classes=4)
    assert next(iter(test))[1].dim() == 1


def test_a_step_and_the_running_sums_take_mixed_targets():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    images = torch.randn(4, 3, 2, 2)
    targets = torch.tensor([[0.75, 0.25, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.25, 0.75, 0.0]])
    logits = net(images).detach()
    want = -(targets * logits.log_softmax(-1)).sum(-1).mean()
    loss, _ = training_step(net, opt, images, targets, "fp32")
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-6)
    sums = RunningSums.zeros(torch.device("cpu"))
    sums.add(0, loss.detach(), torch.tensor([[2.0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 3, 0]]), targets)
    # the class to predict is the target's largest weight (ties: the first): classes 0, 1, 0, 1
    # against predictions 0, 2, 1, 1
    assert sums.count == 4 and int(sums.correct) == 2


def test_label_smoothing_is_torchs():
    torch.manual_seed(1)
    net = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    loss, logits = training_step(net, opt, x, y, "fp32", label_smoothing=0.2)
    smooth = 0.2 / 3 + 0.8 * F.one_hot(y, 3).float()
    want = -(smooth * logits.detach().log_softmax(-1)).sum(-1).mean()
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-6)


@pytest.mark.parametrize("bad, words", [({"cutmix": 1.5}, "--cutmix"), ({"cutmix": -0.1}, "--cutmix"),
                                        ({"cutmix_alpha": 0.0}, "--cutmix-alpha"),
                                        ({"cutmix_alpha": float("nan")}, "--cutmix-alpha"),
                                        ({"label_smoothing": 1.0}, "--label-smoothing")])
def test_the_recipe_refuses_bad_cutmix_and_smoothing(bad, words):
    with pytest.raises(InputError, match=words):
        TrainConfig(preset="demo", **bad)


def test_the_loader_refuses_cutmix_without_classes():
    with pytest.raises(InputError, match="num_classes"):
        DeviceLoader(_split(), batch_size=8, train=True, cutmix=0.5)


def test_every_preset_trains_without_cutmix_or_smoothing():
    from attncnn.models.presets import PRESETS
    for name in PRESETS:
        config = TrainConfig(preset=name)
        assert config.cutmix == 0.0 and config.label_smoothing == 0.0, name
    assert np.isclose(TrainConfig(preset="demo").cutmix_alpha, 1.0)
