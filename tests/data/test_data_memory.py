"""The decoded data set kept in memory between loads is the caller's to let go."""

from __future__ import annotations

import gc
import weakref

import torch

from attncnn.data import forget_cached_dataset, load_dataset


def test_forgetting_the_cached_dataset_frees_it_and_a_reload_still_works(make_tiny_data, tmp_path):
    data, cache = make_tiny_data(4, 2, size=16), tmp_path / "cache"
    load_dataset(str(data), data_dir=cache)                 # decodes and writes the cache file
    dataset = load_dataset(str(data), data_dir=cache)       # reads it: the copy kept in memory
    assert load_dataset(str(data), data_dir=cache).train.images is dataset.train.images   # kept: not read again
    expected = dataset.train.images.clone()
    kept = weakref.ref(dataset.train.images)
    del dataset
    gc.collect()
    assert kept() is not None                               # the module still holds it after the caller let go
    forget_cached_dataset()
    gc.collect()
    assert kept() is None
    again = load_dataset(str(data), data_dir=cache)
    assert torch.equal(again.train.images, expected) and again.classes == ("cat", "dog", "frog")
