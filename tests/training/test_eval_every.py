"""``eval_every``: the test set is evaluated every N epochs and after the last one, the other
epochs' records carry no test metrics, and the best checkpoint is chosen among evaluated epochs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.perf import make_plan
from attncnn.runs import load_checkpoint, resolve_config
from attncnn.training import RunOptions, count_test_passes, evaluates, train


@pytest.fixture(scope="module")
def tiny(make_tiny_data, tmp_path_factory) -> tuple[Path, Path]:
    """(data folder, cache): 3 classes, 10 train + 4 test PNGs each."""
    return make_tiny_data(10, 4), tmp_path_factory.mktemp("cache")


def _run(tiny, out: Path, **overrides) -> list[dict]:
    data, cache = tiny
    config = resolve_config("demo", data=str(data), batch_size=10, checkpoint_every=0,
                            model={"dim": 16, "mlp_dim": 16}, **overrides)
    train(config, out, make_plan(config, RunOptions(data_dir=str(cache), device="cpu", precision="fp32")),
          progress=False)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_evaluates_every_n_epochs_and_the_last(tiny, tmp_path):
    records = _run(tiny, tmp_path / "run", epochs=5, eval_every=2)
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert ["test_accuracy" in r for r in records] == [False, True, False, True, True]
    # the rule the loop follows, as the planners (path timing, time estimates) count it
    assert [evaluates(e, 5, 2) for e in range(1, 6)] == [False, True, False, True, True]
    assert count_test_passes(5, 2) == 3 and count_test_passes(6, 2) == 3 and count_test_passes(1, 5) == 1
    assert all("train_loss" in r for r in records)
    finished = json.loads((tmp_path / "run" / "finished.json").read_text())
    assert finished["final"]["test_accuracy"] == records[-1]["test_accuracy"]
    evaluated = {r["epoch"]: r["test_accuracy"] for r in records if "test_accuracy" in r}
    best_epoch = max(evaluated, key=lambda e: (evaluated[e], -e))       # the first of equal bests
    assert finished["best"] == {"accuracy": evaluated[best_epoch], "epoch": best_epoch}
    best = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.safetensors")
    assert best.metadata["epoch"] == best_epoch


def test_eval_every_must_be_positive():
    with pytest.raises(ValueError, match="eval_every"):
        resolve_config("demo", eval_every=0)
