"""The run the plan hands to the timing functions, built from one preset's options in a test (shared
by tests/perf/test_compiling.py and test_paths.py; pytest puts this folder on the import path)."""

from __future__ import annotations

from attncnn.perf.plan import PlannedRun
from attncnn.runs import resolve_config


def planned(preset: str, **values) -> PlannedRun:
    """The run of ``preset`` with these recipe options and run-time choices (``precision``,
    ``compile``, ``deterministic``, ``measure_paths``, ``data_dir``; ``impl`` / ``eval_impl`` among
    ``model``), as :class:`attncnn.perf.plan.PlannedRun` carries them."""
    run = {k: values.pop(k) for k in ("precision", "compile", "deterministic", "measure_paths", "data_dir")
           if k in values}
    model = dict(values.pop("model", {}))
    paths = {k: model.pop(k) for k in ("impl", "eval_impl") if k in model}
    recipe = resolve_config(preset, model=model, **values)
    return PlannedRun(recipe, recipe.model | paths, **run)
