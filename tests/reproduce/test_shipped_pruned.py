"""The committed start of the paper's pruning fine-tune at width 64 (PAPER.md 3.8, the reference's
``quadratic-generalized-pruned`` run; docs/study-mini.md): ``results/mini-long/quadratic-generalized-mini-pruned``
holds the first epochs of ``attncnn prune results/mini-long/quadratic-generalized-mini/seed0
--finetune-epochs 100``, stopped with its resumable checkpoint. Its starting weights must be exactly the
shipped 60-epoch model with its degenerate heads removed, its learning rate the paper's 100-epoch
schedule, and the folder a run that ``attncnn train --resume RUN --data <the JPEG mirror>`` continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attncnn.analysis.pruning import prune_degenerate_heads
from attncnn.runs import load_checkpoint, load_model, resumable_config
from attncnn.training import LRSchedule

SUITE = Path(__file__).resolve().parents[2] / "results" / "mini-long"
SOURCE = SUITE / "quadratic-generalized-mini" / "seed0"
PRUNED = SUITE / "quadratic-generalized-mini-pruned" / "seed0"

pytestmark = pytest.mark.skipif(not (PRUNED / "config.json").is_file(),
                                reason="no committed results/mini-long/quadratic-generalized-mini-pruned")


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _metrics() -> list[dict]:
    return [json.loads(line) for line in (PRUNED / "metrics.jsonl").read_text().splitlines()]


def test_the_starting_weights_are_the_shipped_model_without_its_degenerate_heads():
    expected, _ = load_model(SOURCE / "checkpoints" / "last.safetensors")
    result = prune_degenerate_heads(expected, condition_number=1000.0, min_eigenvalue=1e-5)  # the defaults
    assert [len(heads) for heads in result.pruned] == [4, 4, 5, 0, 6, 0]      # 19 of 54 (docs/study-mini.md)
    start, meta = load_model(PRUNED / "checkpoints" / "pruned.safetensors")
    assert start.config.layer_heads == result.heads_after == [5, 5, 4, 9, 3, 9]
    want, got = _state(expected), _state(start)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_the_run_follows_the_papers_fine_tune_schedule_and_resumes():
    config = json.loads((PRUNED / "config.json").read_text())
    assert (config["epochs"], config["lr"], config["schedule"], config["warmup_ratio"]) == (100, 0.01, "cosine", 0.05)
    assert config["model"]["layer_heads"] == [5, 5, 4, 9, 3, 9] and config["batch_size"] == 100
    assert config["init_from"] == "pruned.safetensors" and not (PRUNED / "finished.json").exists()
    # the learning rate each logged epoch ended at: the 100-epoch warm-up + cosine, not a shortened one
    schedule = LRSchedule(base_lr=0.01, epochs=100, steps_per_epoch=500)
    rows = _metrics()
    assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 1
    assert [r["lr"] for r in rows] == pytest.approx([schedule.lr_at(r["epoch"] - 1, 499) for r in rows])
    # what `attncnn train --resume` reads: the last checkpoint, past the logged epochs, with its optimiser
    checkpoint = load_checkpoint(PRUNED / "checkpoints" / "last.safetensors")
    assert checkpoint.optimizer_state is not None
    assert (checkpoint.metadata["epoch"], checkpoint.metadata["step_in_epoch"]) >= (len(rows), 0)
    assert resumable_config(PRUNED).epochs == 100
