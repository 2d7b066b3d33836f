"""The real CIFAR-10 copy (the shared JPEG mirror zip): counts, order, shapes, and the cache."""

from __future__ import annotations

import time

import pytest
import torch

import attncnn.data as data
from attncnn.data import CIFAR10_CLASSES, DeviceLoader, load_dataset
from attncnn.data.cache import cache_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cold(cifar10_path, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("real-cifar10-cache")
    start = time.perf_counter()
    ds = load_dataset(cifar10_path, data_dir=data_dir)
    return ds, data_dir, time.perf_counter() - start


def test_real_cifar10_contents(cold):
    ds, _, _ = cold
    assert ds.classes == CIFAR10_CLASSES == ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                             "horse", "ship", "truck")
    assert ds.num_classes == 10
    assert ds.train.images.shape == (50_000, 3, 32, 32) and ds.test.images.shape == (10_000, 3, 32, 32)
    assert ds.train.images.dtype == torch.uint8 and ds.train.labels.dtype == torch.int64
    assert torch.bincount(ds.train.labels).tolist() == [5_000] * 10
    assert torch.bincount(ds.test.labels).tolist() == [1_000] * 10
    assert "CIFAR-10" in ds.source
    # Real photographs: plausible per-channel statistics, close to the reference constants.
    mean = ds.train.images[::50].float().mean(dim=(0, 2, 3)) / 255
    assert torch.allclose(mean, torch.tensor(data.CIFAR_MEAN), atol=0.02)


def test_real_cifar10_second_load_uses_cache(cold, cifar10_path, monkeypatch):
    ds, data_dir, cold_seconds = cold
    assert cache_file(data_dir, cifar10_path).is_file()

    def fail(*args, **kwargs):
        raise AssertionError("decoded again instead of using the cache")

    monkeypatch.setattr(data, "read_image_folder", fail)
    start = time.perf_counter()
    again = load_dataset(cifar10_path, data_dir=data_dir)
    warm_seconds = time.perf_counter() - start
    assert warm_seconds < cold_seconds / 5, (warm_seconds, cold_seconds)
    assert torch.equal(again.train.images, ds.train.images) and torch.equal(again.test.labels, ds.test.labels)


def test_real_cifar10_through_loader(cold):
    ds, _, _ = cold
    loader = DeviceLoader(ds.test, batch_size=1000, train=False)
    x, y = next(iter(loader))
    assert x.shape == (1000, 3, 32, 32) and abs(float(x.mean())) < 0.5 and 0.6 < float(x.std()) < 1.4
    assert len(loader) == 10


def test_peeking_at_the_real_copy_gives_its_decoded_sizes(cold, cifar10_path):
    ds, data_dir, _ = cold
    assert data.peek_dataset(cifar10_path, data_dir=data_dir) == ds.shape
    assert ds.shape.describe() == f"{ds.name}: 50,000 training and 10,000 test images of 32x32, 10 classes"
