"""Shared by the tests that evaluate shipped runs: how far ``attncnn evaluate`` may land from the
accuracy a run recorded while it trained."""

from __future__ import annotations

import pytest

from attncnn.runs.checkpoint import read_metadata
from attncnn.runs.loading import checkpoint_of

#: at the precision the run trained at: bf16 kernels of another CPU or GPU round differently (and
#: paper-long's weights were rounded to bfloat16 for shipping): 10 of the 10,000 test images
SAME_PRECISION = 1e-3
#: fp32 for a bf16-trained run, what ``evaluate`` picks on a CPU without bf16 units: measured up to
#: 12 of the 10,000 images (efficiency-geometry/dilated-conv/10pct/seed0: 51.25 % against 51.13 %)
OTHER_PRECISION = 3e-3


@pytest.fixture(scope="session")
def accuracy_tolerance():
    """``accuracy_tolerance(path, evaluated)``: the allowed |accuracy difference| (a fraction) for
    ``evaluated``, the JSON of ``attncnn evaluate path --json``, against the run's recorded accuracy."""
    def tolerance(path, evaluated: dict) -> float:
        trained = read_metadata(checkpoint_of(path)).get("config", {}).get("precision", "fp32")
        return SAME_PRECISION if evaluated["precision"] == trained else OTHER_PRECISION

    return tolerance
