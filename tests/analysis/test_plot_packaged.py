"""``attncnn plot`` of a model that comes with the package: what it skips is explained in words that fit
a shipped model, not with advice for a run of one's own."""

from __future__ import annotations

import logging

from attncnn.api import PACKAGED_MODELS
from attncnn.cli import main

PACKAGED = PACKAGED_MODELS / "mini-long" / "quadratic-mini" / "seed0"


def test_a_packaged_models_skipped_figures_say_why_in_its_terms(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="attncnn"):
        # nothing else asked: no figure is drawn, and the command ends with "no figure applies"
        assert main(["plot", str(PACKAGED), "--out", str(tmp_path), "--figures", "evolution,accuracy"]) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "quadratic-mini seed 0: skipping 'evolution': it draws a run's periodic checkpoints, and a model that comes "
        "with the package keeps only its final weights",
        "skipping 'accuracy': it draws each run's epoch records (metrics.jsonl), which the models that come with "
        "the package do not carry (a clone's results/ has them)"]
    assert not any("--checkpoint-every" in w for w in warnings)
