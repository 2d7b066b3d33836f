"""Reproducible by default: the same ``attncnn train`` command twice on one machine takes the same
attention paths and compile setting (the written rule) and gives the same metrics, whatever an
earlier version left in the user cache folder, and writes nothing there."""

from __future__ import annotations

import json

import torch

from attncnn.cli import main
from attncnn.perf import choose, device_kind, resolve_precision

#: metrics.jsonl fields that time the run (seconds, speeds, the date and the machine's load)
TIMING_WORDS = ("seconds", "per_s", "time", "date", "load")

#: a speed-measurement cache as the previous version wrote it (format 1), naming choices the rule
#: does not make for this run: a run that read it would train on another path, compiled
STALE = {"format": 1, "records": [
    {"choice": "attention-path", "machine": {"cpu": "AMD EPYC", "cpu_signature": "family 25 model 17 stepping 1 "
                                             "isa=avx2,avx512f,avx512_bf16", "gpu": None, "threads": 2,
                                             "torch": "2.13.0", "device": "cpu"},
     "run": {"kind": "quadratic", "dim": 64, "heads": 4, "head_dim": 64, "attn_dropout": 0.0, "grid": [8, 8],
             "batch": 10, "precision": "bf16", "mode": "train", "paths": ["dense", "separable", "folded"]},
     "value": "PLANTED", "measured": "2026-11-29"},
    {"choice": "compile", "machine": {"cpu": "AMD EPYC", "cpu_signature": "", "gpu": None, "threads": 2,
                                      "torch": "2.13.0", "device": "cpu"},
     "run": {"preset": "demo", "model": {}, "optimizer": "sgd", "image": [32, 32], "batch": 10,
             "precision": "bf16"},
     "value": {"eager": 1.0, "compiled": 0.01, "warmup": 0.01}, "measured": "2026-11-29"}]}


def _untimed(run) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(word in k for word in TIMING_WORDS)} for r in records]


def test_the_same_command_twice_gives_the_same_metrics_and_ignores_a_stale_speed_cache(make_tiny_data, tmp_path,
                                                                                      monkeypatch):
    cache = tmp_path / "user-cache"
    cache.mkdir()
    rule = choose(device_kind("cpu"), "quadratic", (8, 8), resolve_precision("auto", torch.device("cpu")), 12, batch=10)
    planted = {**STALE, "records": [{**STALE["records"][0], "value": next(
        p for p in ("dense", "separable", "folded") if p != rule.train_impl)}, STALE["records"][1]]}
    text = json.dumps(planted, indent=1)
    (cache / "speed-choices.json").write_text(text)
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(cache))
    data = make_tiny_data(20, 6)
    runs = [tmp_path / "first", tmp_path / "second"]
    for out in runs:
        assert main(["train", "--preset", "demo", "--data", str(data), "--epochs", "2", "--batch-size", "10",
                     "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    first, second = (_untimed(run) for run in runs)
    assert len(first) == 2 and first == second
    assert first[-1]["test_accuracy"] == second[-1]["test_accuracy"]
    for run in runs:
        (segment,) = json.loads((run / "machine.json").read_text())["segments"]
        assert segment["attention_paths"] == {"train": [rule.train_impl] * 2, "test": [rule.eval_impl] * 2}
        assert segment["compiled"] is False and segment["deterministic"] is False
    # the planted file was neither taken nor rewritten, and nothing else was written beside it
    assert [p.name for p in cache.iterdir()] == ["speed-choices.json"]
    assert (cache / "speed-choices.json").read_text() == text
