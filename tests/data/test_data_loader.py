"""DeviceLoader, the batched crop/flip, and class-balanced subsets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attncnn.data import (CIFAR_MEAN, CIFAR_STD, DeviceLoader, ImageSplit, class_balanced_subset, held_out_indices,
                          random_crop_flip)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _split(n=20, c=3, h=8, w=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)
    return ImageSplit(images, torch.arange(n))  # label = index: every batch says which examples it holds


def _normalise(u8, mean=CIFAR_MEAN, std=CIFAR_STD):
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (u8.float() / 255 - m) / s


def _epoch(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [(x.cpu(), y.cpu()) for x, y in loader]


def _naive_crop_flip(images, offsets, flips, padding):
    """Per-image reference: zero-pad, slice, mirror."""
    imgs = images.numpy()
    n, c, h, w = imgs.shape
    out = np.empty_like(imgs)
    for b in range(n):
        padded = np.zeros((c, h + 2 * padding, w + 2 * padding), imgs.dtype)
        padded[:, padding:padding + h, padding:padding + w] = imgs[b]
        dy, dx = (int(v) for v in offsets[b])
        crop = padded[:, dy:dy + h, dx:dx + w]
        out[b] = crop[:, :, ::-1] if bool(flips[b]) else crop
    return torch.from_numpy(out)


# ----------------------------------------------------------------------------------- random_crop_flip

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", [0, 1, 4])
def test_crop_flip_matches_naive_loop(padding, device):
    g = torch.Generator().manual_seed(padding)
    images = torch.randint(0, 256, (40, 3, 7, 5), generator=g, dtype=torch.uint8)
    offsets = torch.randint(0, 2 * padding + 1, (40, 2), generator=g)
    flips = torch.rand(40, generator=g) < 0.5
    got = random_crop_flip(images.to(device), offsets.to(device), flips.to(device), padding)
    assert got.dtype == torch.uint8 and got.device.type == device
    assert torch.equal(got.cpu(), _naive_crop_flip(images, offsets, flips, padding))


def test_crop_is_translation_with_black_border_and_flip_is_mirror():
    images = torch.arange(1, 1 + 2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)  # no zeros inside
    center = torch.tensor([[2, 2], [2, 2]])
    none = torch.tensor([False, False])
    assert torch.equal(random_crop_flip(images, center, none, 2), images)
    assert torch.equal(random_crop_flip(images, center, torch.tensor([True, True]), 2), images.flip(-1))
    # Offset (0, 0) shifts the image right and down by the padding; the uncovered border is black.
    out = random_crop_flip(images, torch.tensor([[0, 0], [1, 3]]), none, 2)
    assert torch.equal(out[0, :, 2:, 2:], images[0, :, :2, :2])
    assert (out[0, :, :2, :] == 0).all() and (out[0, :, :, :2] == 0).all()
    assert torch.equal(out[1, :, 1:, :3], images[1, :, :3, 1:])
    assert (out[1, :, :1, :] == 0).all() and (out[1, :, :, 3:] == 0).all()


# ---------------------------------------------------------------------------------------- DeviceLoader

@pytest.mark.parametrize("device", DEVICES)
def test_eval_yields_everything_in_order_normalised(device):
    split = _split(n=23)
    loader = DeviceLoader(split, batch_size=5, device=device, train=False)
    assert len(loader) == 5 and loader.num_examples == 23
    batches = _epoch(loader)
    assert [len(y) for _, y in batches] == [5, 5, 5, 5, 3]  # final partial batch kept
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(y, torch.arange(23))
    torch.testing.assert_close(x, _normalise(split.images), rtol=1e-6, atol=1e-6)


def test_custom_mean_std_and_dtype():
    split = _split(n=4, c=1)
    loader = DeviceLoader(split, batch_size=4, train=False, mean=(0.5,), std=(0.25,), dtype=torch.float64)
    x, _ = next(iter(loader))
    assert x.dtype == torch.float64
    torch.testing.assert_close(x, (split.images.double() / 255 - 0.5) / 0.25)


def test_drop_last():
    loader = DeviceLoader(_split(n=23), batch_size=5, train=True, drop_last=True)
    assert len(loader) == 4
    assert [len(y) for _, y in loader] == [5, 5, 5, 5]


@pytest.mark.parametrize("device", DEVICES)
def test_train_epoch_covers_each_example_once(device):
    split = _split(n=37)
    loader = DeviceLoader(split, batch_size=8, device=device, train=True, crop_padding=0, flip=False, seed=3)
    batches = _epoch(loader, 0)
    y = torch.cat([b[1] for b in batches])
    assert sorted(y.tolist()) == list(range(37)) and not torch.equal(y, torch.arange(37))
    x = torch.cat([b[0] for b in batches])
    torch.testing.assert_close(x, _normalise(split.images[y]), rtol=1e-6, atol=1e-6)  # no augmentation


def test_order_and_augmentation_are_a_function_of_seed_and_epoch():
    split = _split(n=30)
    a = DeviceLoader(split, batch_size=7, train=True, seed=5)
    b = DeviceLoader(split, batch_size=7, train=True, seed=5)
    e1a, e1b = _epoch(a, 1), _epoch(b, 1)
    for (xa, ya), (xb, yb) in zip(e1a, e1b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    again = _epoch(a, 1)  # iterating twice without set_epoch repeats the epoch
    assert all(torch.equal(p[0], q[0]) for p, q in zip(e1a, again))
    order = lambda batches: torch.cat([y for _, y in batches]).tolist()  # noqa: E731
    assert order(_epoch(a, 2)) != order(e1a)
    c = DeviceLoader(split, batch_size=7, train=True, seed=6)
    assert order(_epoch(c, 1)) != order(e1a)


def test_train_augmentation_is_a_padded_crop_or_its_mirror():
    padding = 2
    split = _split(n=64, h=6, w=6)
    loader = DeviceLoader(split, batch_size=16, train=True, crop_padding=padding, seed=1)
    seen_offsets, seen_flips = set(), set()
    for x, y in loader:
        u8 = torch.round((x * torch.tensor(CIFAR_STD).view(1, -1, 1, 1)
                          + torch.tensor(CIFAR_MEAN).view(1, -1, 1, 1)) * 255).to(torch.uint8)
        for img, k in zip(u8, y.tolist()):
            matches = [(dy, dx, f) for dy, dx in itertools.product(range(2 * padding + 1), repeat=2)
                       for f in (False, True)
                       if torch.equal(img, _naive_crop_flip(split.images[k:k + 1], [(dy, dx)], [f], padding)[0])]
            assert matches, f"example {k} is not a crop/flip of its image"
            seen_offsets.update((dy, dx) for dy, dx, _ in matches)
            seen_flips.update(f for _, _, f in matches)
    assert seen_flips == {False, True} and len(seen_offsets) > 10


def test_eval_has_no_augmentation_even_with_options():
    split = _split(n=10)
    loader = DeviceLoader(split, batch_size=10, train=False, crop_padding=4, flip=True)
    x, _ = next(iter(loader))
    torch.testing.assert_close(x, _normalise(split.images), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [36, 38])
def test_sharding_partitions_the_epoch(n):
    split = _split(n=n)
    world = 3
    single = DeviceLoader(split, batch_size=4, train=True, seed=2)
    single.set_epoch(4)
    shards = []
    for rank in range(world):
        loader = DeviceLoader(split, batch_size=4, train=True, seed=2, rank=rank, world_size=world)
        loader.set_epoch(4)
        assert loader.num_examples == n // world and len(loader) == -(-(n // world) // 4)
        shards.append(torch.cat([y for _, y in loader]).tolist())
    union = [i for s in shards for i in s]
    assert len(union) == len(set(union)) == n - n % world  # disjoint; truncated to a multiple of world
    full = torch.cat([y for _, y in single]).tolist()
    assert set(union) == set(full[: n - n % world])
    if n % world == 0:
        assert set(union) == set(range(n))


def test_eval_sharding_keeps_everything():
    split = _split(n=10)
    shards = [torch.cat([y for _, y in DeviceLoader(split, batch_size=3, train=False, rank=r, world_size=3)])
              for r in range(3)]
    assert sorted(torch.cat(shards).tolist()) == list(range(10))


def test_bad_arguments():
    split = _split(n=4)
    with pytest.raises(ValueError, match="rank"):
        DeviceLoader(split, batch_size=2, train=True, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        DeviceLoader(split, batch_size=0, train=True)
    with pytest.raises(ValueError, match="one per channel"):
        DeviceLoader(split, batch_size=2, train=True, mean=(0.5,), std=(0.5,))
    with pytest.raises(ValueError, match="uint8"):
        ImageSplit(torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long))


# ----------------------------------------------------------------------------------- balanced subsets

def test_balanced_subset_counts_and_determinism():
    labels = torch.arange(10).repeat_interleave(100)[torch.randperm(1000, generator=torch.Generator().manual_seed(0))]
    idx = class_balanced_subset(labels, 25, seed=1)
    assert idx.dtype == torch.int64 and len(idx) == 25 and len(set(idx.tolist())) == 25
    assert torch.equal(idx, torch.sort(idx).values)
    counts = torch.bincount(labels[idx], minlength=10).tolist()
    assert counts == [3] * 5 + [2] * 5
    assert torch.equal(idx, class_balanced_subset(labels, 25, seed=1))
    assert not torch.equal(idx, class_balanced_subset(labels, 25, seed=2))
    assert torch.bincount(labels[class_balanced_subset(labels, 1000, seed=0)]).tolist() == [100] * 10


def test_balanced_subset_small_class_and_errors():
    labels = torch.tensor([0] * 10 + [1] * 1 + [2] * 10)
    idx = class_balanced_subset(labels, 12, seed=0)
    assert torch.bincount(labels[idx]).tolist() == [6, 1, 5]
    for bad in (0, -1, 22):
        with pytest.raises(ValueError):
            class_balanced_subset(labels, bad, seed=0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.data())
def test_balanced_subset_properties(raw, data):
    labels = torch.tensor(raw)
    n = data.draw(st.integers(1, len(raw)))
    idx = class_balanced_subset(labels, n, seed=data.draw(st.integers(0, 10)))
    assert len(idx) == n and len(set(idx.tolist())) == n and torch.equal(idx, torch.sort(idx).values)
    got = torch.bincount(labels[idx], minlength=6)
    have = torch.bincount(labels, minlength=6)
    unsaturated = [int(got[c]) for c in range(6) if have[c] > 0 and got[c] < have[c]]
    if unsaturated:  # classes that still had examples left differ by at most one, and none got more
        assert max(unsaturated) - min(unsaturated) <= 1
        assert all(int(got[c]) <= min(unsaturated) + 1 for c in range(6))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=60), st.data())
def test_held_out_images_are_outside_the_training_subset_and_balanced(raw, data):
    labels = torch.tensor(raw)
    subset = data.draw(st.integers(1, len(raw) - 1))
    seed, n = data.draw(st.integers(0, 10)), data.draw(st.integers(1, len(raw)))
    held = held_out_indices(labels, subset, seed, n)
    rest = sorted(set(range(len(raw))) - set(class_balanced_subset(labels, subset, seed).tolist()))
    assert len(held) == min(n, len(rest)) and set(held.tolist()) <= set(rest)     # never a training image
    assert torch.equal(held, torch.sort(held).values) and torch.equal(held, held_out_indices(labels, subset, seed, n))
    got = torch.bincount(labels[held], minlength=6)
    have = torch.bincount(labels[rest], minlength=6)
    unsaturated = [int(got[c]) for c in range(6) if have[c] > 0 and got[c] < have[c]]
    if unsaturated:
        assert max(unsaturated) - min(unsaturated) <= 1


def test_held_out_images_of_a_cifar_sized_cell_and_errors():
    labels = torch.arange(10).repeat_interleave(5000)
    held = held_out_indices(labels, 5000, seed=0, n=10_000)
    assert torch.bincount(labels[held]).tolist() == [1000] * 10
    assert not set(held.tolist()) & set(class_balanced_subset(labels, 5000, seed=0).tolist())
    with pytest.raises(ValueError, match="leaves none out"):
        held_out_indices(labels, 50_000, seed=0, n=10)
    with pytest.raises(ValueError, match="n >= 1"):
        held_out_indices(labels, 5000, seed=0, n=0)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("start", [0, 1, 3, 5])
def test_iter_from_yields_the_epochs_batches_from_that_step(train, start):
    """A resumed run starts in the middle of an epoch: the batches from ``start`` on are exactly those
    of a whole pass, and the skipped batches are never gathered or augmented."""
    loader = DeviceLoader(_split(n=23), batch_size=5, train=train, seed=4)
    loader.set_epoch(2)
    whole = _epoch(loader)
    part = [(x.cpu(), y.cpu()) for x, y in loader.iter_from(start)]
    assert len(part) == len(whole) - start
    for (xa, ya), (xb, yb) in zip(whole[start:], part):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_iter_from_skips_without_augmenting(monkeypatch):
    from attncnn.data import loader as loader_module
    calls = []
    real = loader_module.random_crop_flip
    monkeypatch.setattr(loader_module, "random_crop_flip", lambda *a: calls.append(1) or real(*a))
    loader = DeviceLoader(_split(n=23), batch_size=5, train=True, seed=4)
    assert len(list(loader.iter_from(4))) == 1 and len(calls) == 1


def test_iter_from_rejects_steps_outside_the_epoch():
    loader = DeviceLoader(_split(n=23), batch_size=5, train=True)
    assert list(loader.iter_from(5)) == []
    for bad in (-1, 6):
        with pytest.raises(ValueError, match=r"start_step must be in \[0, 5\]"):
            loader.iter_from(bad)


def test_the_dataset_digest_depends_on_the_pixels_not_the_path(tmp_path):
    from attncnn.data import Dataset, ImageSplit

    def dataset(name, pixel):
        images = torch.zeros(4, 3, 2, 2, dtype=torch.uint8)
        images[0, 0, 0, 0] = pixel
        split = ImageSplit(images, torch.tensor([0, 1, 0, 1]))
        return Dataset(name=name, source=f"image folder /somewhere/{name}", classes=("a", "b"), train=split,
                       test=split)

    a, b, c = dataset("x", 1), dataset("y", 1), dataset("x", 2)
    assert a.digest == b.digest != c.digest and a.digest.startswith("sha256:") and len(a.digest) == 19
    assert a.shareable_name == f"x ({a.digest})" and "/somewhere" not in a.shareable_name
