"""Which shipped run a preset's name means: its longest finished run, whatever suite holds it; a
path under results/ names one run exactly."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import attncnn
from attncnn.api import pretrained_path

RESULTS = Path(__file__).resolve().parents[2] / "results"
SHORT = RESULTS / "mini" / "resnet18-mini" / "seed0"
pytestmark = pytest.mark.skipif(not SHORT.is_dir(), reason="no committed results/mini")


def _run(root: Path, suite: str, epochs: int, finished: bool = True) -> Path:
    """A copy of the shipped 6-epoch resnet18-mini run under ``root/suite``, said to have trained
    ``epochs`` epochs."""
    folder = root / suite / "resnet18-mini" / "seed0"
    shutil.copytree(SHORT, folder)
    summary = json.loads((folder / "finished.json").read_text())
    (folder / "finished.json").write_text(json.dumps({**summary, "epochs": epochs}))
    if not finished:
        (folder / "finished.json").unlink()
    return folder


def test_a_presets_name_means_its_longest_finished_run_and_says_so(tmp_path, caplog):
    short, long = _run(tmp_path, "a-short", 6), _run(tmp_path, "b-long", 60)
    _run(tmp_path, "c-unfinished", 300, finished=False)          # never offered: it is still training
    with caplog.at_level(logging.INFO, logger="attncnn.api.pretrained"):
        assert pretrained_path("resnet18-mini", root=tmp_path) == long
    assert "60-epoch run" in caplog.text and str(short) in caplog.text
    assert pretrained_path("a-short/resnet18-mini", root=tmp_path) == short
    assert attncnn.list_pretrained(tmp_path) == [("resnet18-mini", 0), ("a-short/resnet18-mini", 0)]
    # on a tie the first suite in name order wins, so the choice does not depend on the file system
    _run(tmp_path / "tie", "x", 6), _run(tmp_path / "tie", "y", 6)
    assert pretrained_path("resnet18-mini", root=tmp_path / "tie").parent.parent.name == "x"


@pytest.mark.skipif(not (RESULTS / "paper-long" / "quadratic" / "seed0").is_dir(),
                    reason="no committed results/paper-long")
def test_the_papers_preset_names_load_the_paper_width_model():
    model = attncnn.pretrained("quadratic")
    assert model.source.is_relative_to(RESULTS / "paper-long")
    assert sum(p.numel() for p in model.network.parameters()) == 12_086_844     # PAPER.md 5.2, width 400
    assert pretrained_path("quadratic-mini") == RESULTS / "mini-long" / "quadratic-mini" / "seed0"
    if (RESULTS / "paper-long" / "learned" / "seed0" / "finished.json").is_file():
        learned = attncnn.pretrained("learned")
        assert learned.source.is_relative_to(RESULTS / "paper-long")
        assert sum(p.numel() for p in learned.network.parameters()) == 12_278_682     # PAPER.md 5.2
