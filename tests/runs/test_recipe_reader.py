"""Every run folder shipped under results/ reads as a recipe, whatever machine fields it stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attncnn.runs.config import MACHINE_FIELDS, PATH_OPTIONS, recipe_from_dict

RESULTS = Path(__file__).resolve().parents[2] / "results"
SHIPPED = sorted(RESULTS.rglob("config.json"))


def test_there_are_shipped_runs_to_read():
    assert len(SHIPPED) >= 50


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_shipped_config_reads_as_a_recipe_without_machine_fields(path):
    stored = json.loads(path.read_text(encoding="utf-8"))
    recipe, machine = recipe_from_dict(stored, source=path)
    values = recipe.to_dict()
    assert not set(MACHINE_FIELDS) & set(values) and not set(PATH_OPTIONS) & set(values["model"])
    # what was taken out is exactly what the file stored beside the recipe, and nothing is lost
    assert machine == {k: v for k, v in {**stored, **stored.get("model", {})}.items()
                       if k in MACHINE_FIELDS or (k in PATH_OPTIONS and k in stored.get("model", {}))}
    assert {k: v for k, v in values.items() if k in stored} == {
        k: ({m: o for m, o in v.items() if m not in PATH_OPTIONS} if k == "model" else v)
        for k, v in stored.items() if k not in MACHINE_FIELDS}
