"""Where a trained run's precision comes from, said as it is: an unknown value in machine.json is
named as unknown, not reported as missing."""

from __future__ import annotations

import json

import pytest
import torch

from attncnn.api.evaluation import _chosen_precision
from attncnn.runs.loading import precision_source
from attncnn.runs.machine_file import MACHINE_FILE

MACHINE = {"cpu": "Some CPU", "torch": "2.13.0", "device": "cpu"}


def _run(tmp_path, precision):
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    segment = {"epochs": [1, 2], "machine": MACHINE, **({} if precision is None else {"precision": precision})}
    (folder / MACHINE_FILE).write_text(json.dumps({"segments": [segment]}))
    return folder, folder / "checkpoints" / "last.safetensors"


@pytest.mark.parametrize("value", ["fp64", "fp8"])
def test_an_unknown_precision_in_machine_json_is_named_with_what_is_used(tmp_path, value):
    folder, checkpoint = _run(tmp_path, value)
    unknown = f"{folder / MACHINE_FILE} records precision {value!r}, which attncnn does not know"
    assert precision_source(checkpoint, {}) == (None, unknown)
    assert _chosen_precision(checkpoint, {}, torch.device("cpu"), None, str(folder)) == (
        "fp32", f"{unknown}: fp32 (give --precision bf16 for a run that trained in bf16)")


def test_a_known_or_missing_precision_reads_as_before(tmp_path):
    folder, checkpoint = _run(tmp_path / "a", "bf16")
    assert precision_source(checkpoint, {}) == ("bf16", "the run's machine.json")
    folder, checkpoint = _run(tmp_path / "b", None)
    assert precision_source(checkpoint, {}) == (None, f"{folder} records none")
