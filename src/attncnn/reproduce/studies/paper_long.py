"""``paper-long``: the paper's own networks (width 400) with ``mini-long``'s length and analysis, so
that widths 64 and 400 compare at equal epochs; trained on a GPU, a run per short job
(``tools/gpu_job.py`` in the repository)."""

from __future__ import annotations

from .shapes import Suite
from .table1 import PAPER_ROWS, TABLE1_CLAIMS

__all__ = ["PAPER_LONG"]

PAPER_LONG = Suite(
    "paper-long",
    "Table 1 at the paper's width (400) for 60 epochs: the paper's presets and recipe (SGD "
    "0.1/0.9/1e-4, 5 % warm-up + cosine, batch 100), mini-long's length; for a GPU",
    presets=PAPER_ROWS,
    paper_names={name: name for name in PAPER_ROWS},
    evolution_preset="quadratic",
    evolution_from="metrics",
    overrides=(("epochs", 60),),
    # The preset's own schedule is the reference's MultiStepLR at epochs 80/150/250 of 300: cut at
    # 60 epochs it never decays. mini-long trains its ResNet with the attention models' cosine.
    preset_overrides={"resnet18": (("schedule", "cosine"),)},
    last=("learned-content",),
    settle_epochs=(6, 20, 40, 60),
    claims=TABLE1_CLAIMS,
)
