"""Tests write only under temporary folders: decoded data goes to the session's cache, even from
fixtures wider than one test (they used to leave tiny-*.safetensors in ~/.cache/attncnn/decoded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attncnn.data import default_data_dir, load_dataset


@pytest.fixture(scope="module")
def decoded_by_a_module_fixture(make_tiny_data) -> tuple[Path, Path]:
    """What a module-scoped fixture sees as the default data folder, and a data set it decodes there."""
    data = make_tiny_data(2, 1)
    load_dataset(data)                       # no data_dir: the default folder, as the trainer's fixtures use
    return default_data_dir(), data


def test_a_module_fixture_decodes_into_the_sessions_cache(decoded_by_a_module_fixture, data_cache_dir):
    seen, data = decoded_by_a_module_fixture
    assert seen == data_cache_dir
    assert seen != Path.home() / ".cache" / "attncnn"
    assert any(p.name.startswith(data.name) for p in (data_cache_dir / "decoded").iterdir())
