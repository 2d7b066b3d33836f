"""A run's ``machine.json`` that is malformed (a list, ``"segments"`` as text) or unreadable (not
JSON) does not stop the report: one warning names the file and the fix, and the run's machine is
taken from its epoch records, else shown as unknown."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from attncnn.cli import main
from attncnn.reproduce.reporting.results import RunResult
from attncnn.reproduce.reporting.table1 import run_costs, seed_lines

EPYC = {"cpu": "AMD EPYC", "threads": 2, "torch": "2.13.0+cpu", "device": "cpu"}
RECORDS = [{"epoch": e, "machine": EPYC, "seconds": 10.0, "eval_seconds": 1.0, "images_per_second": 50.0,
            "test_accuracy": 0.5} for e in (1, 2)]
GOOD = {"cpu": "Intel Xeon", "torch_threads": 4, "torch": "2.13.0+cpu", "device": "cpu",
        "segments": [{"epochs": [1, 2], "machine": EPYC, "precision": "fp32"}]}

MALFORMED = {
    "a list": ("[1, 2]", "holds a JSON list, not an object"),
    "segments as text": (json.dumps({**GOOD, "segments": "epochs 1-2"}), "its 'segments' is not a list"),
    "a segment without epochs": (json.dumps({**GOOD, "segments": [{"machine": EPYC}]}), "its 'segments' are not all"),
    "a segment machine as text": (json.dumps({**GOOD, "segments": [{"epochs": [1, 2], "machine": "x"}]}),
                                    "names no machine object"),
    "threads as text": (json.dumps({**GOOD, "torch_threads": "4"}), "'torch_threads' is not a whole number"),
    "empty": ("", "is not JSON (Expecting value: line 1 column 1 (char 0))"),
    "cut short": (json.dumps(GOOD)[:40], "is not JSON"),
}


def _result(tmp_path, text=None, records=RECORDS, seed=0):
    folder = tmp_path / "resnet18-mini" / f"seed{seed}"
    folder.mkdir(parents=True)
    if text is not None:
        (folder / "machine.json").write_text(text)
    return RunResult(SimpleNamespace(preset="resnet18-mini", seed=seed, folder=folder), SimpleNamespace(
        metrics=records, metadata={}))


def test_a_well_formed_file_is_read_and_an_absent_one_is_none(tmp_path):
    from attncnn.reproduce.running.machines import read_machine_file

    assert read_machine_file(_result(tmp_path, json.dumps(GOOD)).job.folder) == GOOD
    assert read_machine_file(tmp_path / "nowhere") is None


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_file_is_one_warning_naming_it_and_the_fix(case, tmp_path, caplog):
    text, problem = MALFORMED[case]
    result = _result(tmp_path, text)
    path = result.job.folder / "machine.json"
    with caplog.at_level(logging.WARNING):
        (line,) = seed_lines({"resnet18-mini": [result]})[2:]         # the report's row, from the records
        (cost,) = run_costs({"resnet18-mini": [result]})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings                               # once per file, not once per reader
    assert warnings[0].startswith(f"warning: {path}: ") and problem in warnings[0] and "\n" not in warnings[0]
    assert "Restore the file" in warnings[0] and "or delete it" in warnings[0]
    assert line.endswith("| AMD EPYC, 2 threads, torch 2.13.0+cpu (epochs 1-2) |")
    assert cost["machines"] == [{"epochs": [1, 2], "machine": EPYC, "precision": None}]
    from attncnn.reproduce.running.machines import read_machine_file
    assert read_machine_file(result.job.folder) == {}                  # a record that knows nothing


def test_without_records_of_the_machine_the_cell_says_unknown(tmp_path, caplog):
    result = _result(tmp_path, "[]", records=[{**r, "machine": None} for r in RECORDS])
    with caplog.at_level(logging.WARNING):
        (line,) = seed_lines({"resnet18-mini": [result]})[2:]
    assert line.endswith("| unknown (machine.json unreadable) |")
    assert "machine.json: holds a JSON list" in caplog.text


@pytest.mark.slow
def test_report_only_writes_the_report_despite_a_malformed_machine_file(make_tiny_data, tmp_path, capsys, caplog):
    data = make_tiny_data(40, 10, size=16)
    out = tmp_path / "mini"
    args = ["reproduce", "mini", "--data", str(data), "--out", str(out), "--epochs", "1", "--seeds", "0",
            "--only", "resnet18-mini", "--no-progress", "--no-viewer"]
    assert main([*args, "--no-compile"]) == 0
    machine = out / "resnet18-mini" / "seed0" / "machine.json"
    assert machine.is_file()
    capsys.readouterr()
    for text in ("[1, 2]", json.dumps({"segments": "epochs 1-1"}), "not json"):
        machine.write_text(text)
        (out / "report.md").unlink()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert main([*args, "--report-only"]) == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert sum(w.startswith(f"warning: {machine}: ") for w in warnings) == 1, warnings
        assert "error" not in capsys.readouterr().err and (out / "report.md").is_file()


def test_the_reports_join_a_runs_segments_on_one_machine_and_skip_those_that_trained_no_epoch():
    from attncnn.reproduce.running.machines import report_segments

    cpu = {"cpu": "AMD EPYC", "threads": 2, "torch": "2.13.0", "device": "cpu"}
    gpu = {**cpu, "device": "cuda", "gpu": "NVIDIA H200"}
    written = [{"epochs": [1, 2], "machine": cpu, "precision": "fp32", "compiled": False, "ended": "interrupted"},
               {"epochs": [3, 2], "machine": cpu, "precision": "fp32", "compiled": False, "ended": "interrupted"},
               {"epochs": [3, 5], "machine": cpu, "precision": "fp32", "compiled": False, "ended": "interrupted"},
               {"epochs": [6, 9], "machine": gpu, "precision": "bf16", "compiled": True, "ended": "finished"}]
    assert report_segments(written) == [
        {"epochs": [1, 5], "machine": cpu, "precision": "fp32", "compiled": False},
        {"epochs": [6, 9], "machine": gpu, "precision": "bf16", "compiled": True}]
    shipped = [{"epochs": [1, 60], "machine": gpu}]                    # a file the runner wrote: as it was
    assert report_segments(shipped) == [{"epochs": [1, 60], "machine": gpu, "precision": None}]
