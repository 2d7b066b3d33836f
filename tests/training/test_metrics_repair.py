"""A resume leaves metrics.jsonl valid JSON lines holding each epoch once, in order: a record torn by a
crash is restored from the checkpoint that holds it, never left mid-file; a record of an epoch the
checkpoint does not hold (a kill between logging it and saving it) is dropped and trained again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.perf import make_plan, resume_plan
from attncnn.runs import load_checkpoint, resolve_config
from attncnn.training import RunOptions, saver, train


def _train(data: Path, out: Path, die_after_saving: int | None = None, die_before_saving: int | None = None,
           monkeypatch=None) -> None:
    """A 3-epoch tiny run into ``out``, killed (SystemExit) right after ``last`` is saved at the end of
    epoch ``die_after_saving``, or right before it is saved at the end of ``die_before_saving``."""
    config = resolve_config("demo", data=str(data), epochs=3, batch_size=10, checkpoint_every=1,
                            model={"dim": 16, "mlp_dim": 16})
    options = RunOptions(data_dir=str(out.parent / "cache"), device="cpu", deterministic=True, precision="fp32")
    real = saver.write_checkpoint

    def write(path, checkpoint):
        at = (checkpoint.metadata["epoch"], checkpoint.metadata["step_in_epoch"])
        if path.name == "last.safetensors" and at == (die_before_saving, 0):
            raise SystemExit("killed")
        real(path, checkpoint)
        if path.name == "last.safetensors" and at == (die_after_saving, 0):
            raise SystemExit("killed")

    with monkeypatch.context() as m:
        m.setattr(saver, "write_checkpoint", write)
        with pytest.raises(SystemExit):
            train(config, out, make_plan(config, options), progress=False)


def _lines(run: Path) -> list[dict]:
    text = (run / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]       # every line a whole record


def test_a_torn_last_record_is_restored_from_its_checkpoint_on_resume(make_tiny_data, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _train(make_tiny_data(20, 6), out, die_after_saving=2, monkeypatch=monkeypatch)
    whole = _lines(out)
    assert [r["epoch"] for r in whole] == [1, 2]
    # the crash tore epoch 2's line: a fragment without its end or newline
    (out / "metrics.jsonl").write_text(json.dumps(whole[0]) + "\n" + json.dumps(whole[1])[:25])
    train(None, out, resume_plan(out), mode="resume", progress=False)
    records = _lines(out)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert records[:2] == whole                                      # epoch 2 as it was logged, from the checkpoint
    held = load_checkpoint(out / "checkpoints" / "epoch_0002.safetensors").metadata["metrics"]
    assert records[1] == held and "train_loss" in held


def test_a_torn_record_of_an_epoch_the_checkpoint_does_not_hold_is_trained_again(make_tiny_data, tmp_path,
                                                                                  monkeypatch):
    out = tmp_path / "run"
    _train(make_tiny_data(20, 6), out, die_before_saving=3, monkeypatch=monkeypatch)
    whole = _lines(out)
    assert [r["epoch"] for r in whole] == [1, 2, 3]                 # epoch 3 logged, its checkpoint never saved
    text = (out / "metrics.jsonl").read_text()
    (out / "metrics.jsonl").write_text(text[:-40])                   # and its line torn
    train(None, out, resume_plan(out), mode="resume", progress=False)
    assert [r["epoch"] for r in _lines(out)] == [1, 2, 3]
    assert _lines(out)[:2] == whole[:2]
