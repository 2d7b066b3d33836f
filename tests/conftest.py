"""Shared fixtures, and the ``needs_fast_bf16`` marker.

Tests that need real CIFAR-10 images read the path in ``ATTNCNN_TEST_CIFAR10`` (set by
.ci/run to ../shared/data/cifar10-jpeg.zip); outside CI they fall back to that shared copy
beside the repository when it exists.

A test marked ``needs_fast_bf16`` times or trains real bf16 work (a 2048^3 bf16 product takes
minutes on a CPU without bf16 units): on such a CPU it is skipped with a reason that names the CPU
(:func:`attncnn.training.run_precision.slow_bf16_reason`); on one with AVX512-BF16 or AMX it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def _cifar10_copy() -> Path | None:
    env = os.environ.get("ATTNCNN_TEST_CIFAR10")
    if env:
        return Path(env)
    guess = REPO.parent / "shared" / "data" / "cifar10-jpeg.zip"
    return guess if guess.exists() else None


@pytest.fixture(scope="session")
def cifar10_path() -> Path:
    """Path to a real CIFAR-10 copy (zip or folder); fails in CI when missing."""
    path = _cifar10_copy()
    if path is None or not path.exists():
        if os.environ.get("CI"):
            pytest.fail("ATTNCNN_TEST_CIFAR10 must point at a CIFAR-10 copy in CI")
        pytest.skip("no CIFAR-10 copy: set ATTNCNN_TEST_CIFAR10")
    return path


def pytest_collection_modifyitems(config, items):
    """Skip the ``needs_fast_bf16`` tests where the CPU has no fast bf16, saying why."""
    import torch

    from attncnn.training import run_precision

    marked = [item for item in items if item.get_closest_marker("needs_fast_bf16")]
    reason = run_precision.slow_bf16_reason(torch.device("cpu")) if marked else None
    for item in marked if reason else ():
        item.add_marker(pytest.mark.skip(reason=f"needs fast bf16: {reason}"))


TINY_CLASSES = ("cat", "dog", "frog")


@pytest.fixture(scope="session")
def make_tiny_data(tmp_path_factory):
    """``make_tiny_data(train, test)``: an image-folder data set of 3 classes with ``train`` and
    ``test`` 32x32 PNGs each, where class c has a brighter channel c (so a few epochs learn it).
    Made once per size for the whole session."""
    made: dict[tuple[int, int], Path] = {}

    def make(train: int, test: int) -> Path:
        if (train, test) not in made:
            root = tmp_path_factory.mktemp(f"tiny-{train}-{test}")
            rng = np.random.default_rng(0)
            for split, n in (("train", train), ("test", test)):
                for c, name in enumerate(TINY_CLASSES):
                    folder = root / split / name
                    folder.mkdir(parents=True)
                    for i in range(n):
                        img = rng.integers(0, 120, size=(32, 32, 3), dtype=np.uint8)
                        img[..., c] += 120
                        Image.fromarray(img).save(folder / f"{i:03d}.png")
            made[(train, test)] = root
        return made[(train, test)]

    return make


@pytest.fixture(scope="session")
def data_cache_dir(tmp_path_factory) -> Path:
    """One decoded-data cache for the whole session ($ATTNCNN_DATA_DIR in CI), so the 60,000 JPEGs
    of the real copy are decoded once, not once per test."""
    env = os.environ.get("ATTNCNN_DATA_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="session", autouse=True)
def _never_the_user_cache(data_cache_dir):
    """Tests never write decoded data into ~/.cache: the default data folder is the session's.

    Session-scoped, so that it is in force before any fixture of any scope runs: a module-scoped
    fixture that trains a tiny run (tests/test_cli.py, tests/reproduce/) is set up before the
    function-scoped fixtures of its first test, and used to decode into ~/.cache/attncnn."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNCNN_DATA_DIR", str(data_cache_dir))
        yield
