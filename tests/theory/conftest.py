"""Fixtures for the theory tests: a few real CIFAR-10 test images, loaded once, and a tiny trained ResNet."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attncnn.data import CIFAR_MEAN, CIFAR_STD, load_dataset


@pytest.fixture(autouse=True)
def _private_data_dir(monkeypatch, data_cache_dir):
    """Nothing here may write to ~/.cache: the default data folder is the session's cache folder."""
    monkeypatch.setenv("ATTNCNN_DATA_DIR", str(data_cache_dir))


@pytest.fixture(scope="session")
def cifar10(cifar10_path, data_cache_dir):
    """The real CIFAR-10 copy, decoded once per session (cached in ``data_cache_dir``)."""
    return load_dataset(cifar10_path, data_dir=data_cache_dir)


def normalise(raw: torch.Tensor) -> torch.Tensor:
    """uint8 ``(N, 3, H, W)`` -> float64, per-channel CIFAR normalisation."""
    x = raw.to(torch.float64) / 255.0
    mean = torch.tensor(CIFAR_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (x - mean) / std


@pytest.fixture(scope="session")
def test_images(cifar10) -> torch.Tensor:
    """The first 8 CIFAR-10 test images, normalised, float64 ``(8, 3, 32, 32)``."""
    return normalise(torch.as_tensor(cifar10.test.images[:8]))


@pytest.fixture(scope="session")
def resnet_checkpoint(cifar10, tmp_path_factory):
    """A tiny-width CIFAR ResNet trained for a few SGD steps on real images, saved as a checkpoint.

    No trained ResNet18 checkpoint ships with the tests; the construction only needs a conv layer
    whose weights came out of training, which this provides (its first layer is 3 -> 8, K = 3).
    """
    from attncnn.models import ResNet, ResNetConfig
    from attncnn.runs import save_checkpoint

    torch.manual_seed(0)
    model = ResNet(ResNetConfig(widths=(8, 16, 16, 16), blocks=(1, 1, 1, 1)))
    x = normalise(torch.as_tensor(cifar10.train.images[:32])).float()
    y = torch.as_tensor(cifar10.train.labels[:32]).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for step in range(4):
        batch = slice(step * 8, step * 8 + 8)
        loss = F.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("resnet") / "resnet.safetensors"
    save_checkpoint(path, model=model, metadata={"arch": "resnet", "model_config": dataclasses.asdict(model.config)})
    return path
