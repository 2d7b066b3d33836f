"""Tiny trained runs for the analysis tests, made by the real trainer on a PNG image-folder data set."""

from __future__ import annotations

from pathlib import Path

import pytest

from attncnn.cli import main

CLASSES = ("cat", "dog", "frog")
TINY = ["--set", "dim=16", "--set", "mlp_dim=16"]


@pytest.fixture(scope="session")
def tiny_data(make_tiny_data) -> Path:
    """3 classes, 10 train + 4 test PNGs each (tests/conftest.py)."""
    return make_tiny_data(10, 4)


def _train(root: Path, data: Path, name: str, preset: str, *options: str) -> Path:
    out = root / name
    status = main(["train", "--preset", preset, "--data", str(data), "--data-dir", str(root / "cache"),
                   "--epochs", "2", "--batch-size", "10", "--out", str(out), "--no-progress",
                   "--checkpoint-every", "1", *options])
    assert status == 0
    return out


@pytest.fixture(scope="session")
def runs(tmp_path_factory, tiny_data) -> dict[str, Path]:
    """Run folders: quadratic (demo, 4 heads, 8x8 grid), generalised quadratic, learned, learned + content."""
    root = tmp_path_factory.mktemp("runs")
    small = [*TINY, "--set", "num_layers=2", "--set", "num_heads=4", "--set", "pooling=4", "--set", "max_size=8"]
    return {
        "quadratic": _train(root, tiny_data, "quadratic", "demo", *TINY),
        "generalized": _train(root, tiny_data, "generalized", "demo", *TINY, "--set",
                              "attention=quadratic-generalized"),
        "learned": _train(root, tiny_data, "learned", "learned", *small),
        "content": _train(root, tiny_data, "content", "learned-content", *small),
    }
