"""The precision a trained or resumed run uses on the machine at hand: the run's own, fp32 for a bf16
run where the device has no fast bf16, an explicit ``--precision`` obeyed; and a resumed run's epochs
record the precision each ran at. The "no fast bf16" machine is simulated (``fast_bf16`` patched)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal

import pytest
import torch

from attncnn.perf import make_plan, resume_plan
from attncnn.perf import precision as run_precision
from attncnn.perf.machine import cpu_name
from attncnn.runs import resolve_config
from attncnn.runs.machine_file import MACHINE_FILE
from attncnn.runs.machine_file import run_precision as run_precision_of
from attncnn.training import RunOptions, TrainingInterrupted, train

CPU = torch.device("cpu")


@pytest.fixture
def slow_bf16(monkeypatch):
    """This CPU as one without bfloat16 units."""
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)     # the simulated CPU has no units at all


@pytest.fixture
def fast_bf16(monkeypatch):
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: True)


def test_the_reason_names_the_cpu_and_is_none_where_bf16_is_fast(monkeypatch):
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)     # the simulated CPU has no units at all
    reason = run_precision.slow_bf16_reason(CPU)
    assert cpu_name() in reason and "AVX512-BF16 or AMX" in reason
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: True)
    assert run_precision.slow_bf16_reason(CPU) is None


def test_a_bf16_run_uses_fp32_where_bf16_is_slow_and_says_so(slow_bf16, caplog):
    with caplog.at_level(logging.INFO, logger=run_precision.__name__):
        assert run_precision.machine_precision("bf16", CPU, what="run x") == "fp32"
    assert "run x trained in bf16; running it in fp32 here" in caplog.text and cpu_name() in caplog.text
    assert "--precision bf16" in caplog.text                          # how to keep bf16
    assert run_precision.machine_precision("fp32", CPU) == "fp32"
    assert run_precision.machine_precision(None, CPU) == "fp32"        # runs from before --precision existed


def test_an_explicit_precision_is_obeyed_on_any_machine(slow_bf16):
    assert run_precision.machine_precision("fp32", CPU, "bf16") == "bf16"
    assert run_precision.machine_precision("bf16", CPU, "fp32") == "fp32"
    assert run_precision.machine_precision("bf16", CPU, "auto") == "fp32"     # auto: the machine's choice


def test_a_bf16_run_keeps_bf16_where_bf16_is_fast(fast_bf16):
    assert run_precision.machine_precision("bf16", CPU) == "bf16"
    assert run_precision.machine_precision("fp32", CPU, "auto") == "bf16"


def test_a_stored_precision_that_is_none_of_them_is_refused():
    with pytest.raises(ValueError, match="stores precision 'fp16'.*pass --precision fp32 or bf16"):
        run_precision.machine_precision("fp16", CPU)


# -- a resumed run ----------------------------------------------------------------------------------

def _stop_after_first_epoch(model) -> dict:
    os.kill(os.getpid(), signal.SIGINT)          # as Ctrl-C: the epoch's checkpoint is saved, then it stops
    return {}


@pytest.fixture
def interrupted_bf16_run(make_tiny_data, tmp_path):
    """A 2-epoch bf16 run stopped after epoch 1 (tiny: 30 images, width 16)."""
    config = resolve_config("demo", data=str(make_tiny_data(10, 4)), epochs=2, batch_size=10,
                            model={"dim": 16, "mlp_dim": 16})
    options = RunOptions(data_dir=str(tmp_path / "cache"), device="cpu", precision="bf16")
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(config, out, make_plan(config, options), progress=False, epoch_metrics=_stop_after_first_epoch)
    return out


def _precisions(run) -> list[str]:
    return [json.loads(line)["precision"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_bf16_run_resumes_in_fp32_where_bf16_is_slow_and_records_it(interrupted_bf16_run, slow_bf16):
    train(None, interrupted_bf16_run, resume_plan(interrupted_bf16_run), mode="resume", progress=False)
    assert _precisions(interrupted_bf16_run) == ["bf16", "fp32"]
    segments = json.loads((interrupted_bf16_run / MACHINE_FILE).read_text())["segments"]
    assert [(s["precision"], s["epochs"]) for s in segments] == [("bf16", [1, 1]), ("fp32", [2, 2])]
    assert "precision" not in json.loads((interrupted_bf16_run / "config.json").read_text())
    assert run_precision_of(interrupted_bf16_run) == "bf16"        # the run's own: its first segment's


def test_a_resume_obeys_an_explicit_precision(interrupted_bf16_run, tmp_path, slow_bf16, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(interrupted_bf16_run, copy)
    plan = resume_plan(interrupted_bf16_run, RunOptions(precision="bf16"))
    train(None, interrupted_bf16_run, plan, mode="resume", progress=False)
    assert _precisions(interrupted_bf16_run) == ["bf16", "bf16"]
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: True)
    train(None, copy, resume_plan(copy, RunOptions(precision="fp32")), mode="resume", progress=False)
    assert _precisions(copy) == ["bf16", "fp32"]


def test_a_new_run_records_the_precision_its_plan_resolved(make_tiny_data, tmp_path, monkeypatch):
    config = resolve_config("demo", data=str(make_tiny_data(10, 4)), epochs=1, batch_size=10,
                            model={"dim": 16, "mlp_dim": 16})
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)     # the simulated CPU has no units at all
    plan = make_plan(config, RunOptions(precision="auto"))
    assert plan.precision == "fp32"                          # "auto" resolved for this machine, once
    train(config, tmp_path / "run", plan, progress=False)
    assert json.loads((tmp_path / "run" / MACHINE_FILE).read_text())["segments"][0]["precision"] == "fp32"
    assert _precisions(tmp_path / "run") == ["fp32"]


@pytest.mark.parametrize("limit, fast", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True),
                                         ("AVX512_CORE_AMX", True), ("ALL", True)])
def test_an_instruction_set_limit_below_bf16_makes_bf16_slow(monkeypatch, limit, fast):
    # oneDNN kept off its bf16 kernels runs bf16 products as slowly as a CPU without bf16 units does
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    cpu = torch.device("cpu")
    assert run_precision.fast_bf16(cpu) is fast
    assert (run_precision.slow_bf16_reason(cpu) is None) is fast
    if not fast:
        assert "ONEDNN_MAX_CPU_ISA" in run_precision.slow_bf16_reason(cpu)
    assert run_precision.resolve_precision("auto", cpu) == ("bf16" if fast else "fp32")
