"""The shape of the source tree that docs/development.md describes ("Layout"): the import arrow, one
writer of checkpoints, and small functions and files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attncnn"
PY_FILES = sorted(SRC.rglob("*.py"))

# cli -> api/reproduce -> analysis/theory -> perf -> training -> runs -> models -> layers: what each
# package may import from attncnn. The command line (cli) sits at the top: it may import every package
# and none imports it. api, the way in from Python, sits just below it: only cli imports it. perf sits
# above training because it times the real training step to make the plan the loop takes; training
# imports nothing from perf. Reading a run goes through runs, never training: analysis trains only to
# fine-tune a pruned run (ANALYSIS_USES_OF_TRAINING).
ALLOWED = {
    "layers": set(),
    "models": {"layers"},
    "data": set(),
    "runs": {"models", "layers"},
    "training": {"runs", "models", "layers", "data"},
    "perf": {"training", "runs", "models", "layers", "data"},
    "theory": {"perf", "runs", "layers", "models", "data"},
    "analysis": {"perf", "training", "runs", "layers", "models", "data", "theory"},
    "reproduce": {"training", "perf", "runs", "layers", "models", "data", "theory", "analysis"},
    "api": {"perf", "training", "runs", "layers", "models", "data", "analysis"},
    "reference": {"runs", "models", "layers"},
    "cli": {"api", "reference", "reproduce", "analysis", "theory", "perf", "training", "runs", "models", "layers",
            "data"},
}
#: the one module outside the packages that may import the command line: ``python -m attncnn``
RUNS_THE_COMMAND_LINE = {"__main__.py"}
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 450
# declarative argparse registration may be longer (one line per flag)
REGISTRATION = {"register", "build_parser"}


def _package_imports(path: Path) -> set[str]:
    """Top-level attncnn packages imported anywhere in ``path``, lazy imports inside functions included."""
    parts = path.relative_to(SRC).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = parts[:len(parts) - node.level]                   # the package the dots lead to
            target = [*base, *(node.module.split(".") if node.module else [])]
            names = [a.name for a in node.names] if not node.module and not base else []
            for name in ([target[0]] if target else names):
                found.add(name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attncnn."):
            found.add(node.module.split(".")[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_arrow(package):
    for path in sorted((SRC / package).rglob("*.py")):
        wrong = {p for p in _package_imports(path) if (SRC / p).is_dir() and p != package} - ALLOWED[package]
        assert not wrong, f"{path.relative_to(SRC)} imports {sorted(wrong)}"


def test_only_the_command_line_parses_arguments():
    # the library takes plain values: argument parsing (argparse, sys.argv) lives in attncnn/cli alone
    found = []
    for path in PY_FILES:
        if path.relative_to(SRC).parts[0] == "cli":
            continue
        found += [f"{path.relative_to(SRC)}:{line}" for line in _argument_parsing(path.read_text())]
    assert not found


def _argument_parsing(source: str) -> list[str]:
    """``"<line> imports argparse"`` / ``"<line> reads sys.argv"`` for each in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names) or (
                isinstance(node, ast.ImportFrom) and node.module == "argparse"):
            found.append(f"{node.lineno} imports argparse")
        if isinstance(node, ast.Attribute) and node.attr == "argv" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            found.append(f"{node.lineno} reads sys.argv")
    return found


def test_nothing_in_the_library_imports_the_command_line():
    importers = [str(path.relative_to(SRC)) for path in PY_FILES
                 if path.relative_to(SRC).parts[0] != "cli" and "cli" in _package_imports(path)]
    assert set(importers) == RUNS_THE_COMMAND_LINE


def test_the_parsing_checker_sees_argparse_and_argv():
    # guards the two tests above against passing because their checkers found nothing
    assert _argument_parsing("import argparse\nimport sys\nx = sys.argv[1:]\n") == ["1 imports argparse",
                                                                                     "3 reads sys.argv"]
    assert _argument_parsing("from argparse import Namespace\n") == ["1 imports argparse"]
    assert _argument_parsing((SRC / "cli" / "_parsing.py").read_text())
    assert "cli" in _package_imports(SRC / "__main__.py")


#: what the studies may take from training: running a training or an evaluation, its stop signal, and
#: how many test passes a run makes (for time estimates; they read runs through attncnn.runs and make
#: plans through attncnn.perf)
REPRODUCE_USES_OF_TRAINING = {"train", "evaluate", "TrainingInterrupted", "TrainingError", "count_test_passes",
                              "RunOptions"}      # the run-time options a training is given, beside its recipe


def _names_from(path: Path, package: str) -> set[str]:
    """Names ``path`` imports from the attncnn package ``package`` (relative or absolute imports)."""
    parts = path.relative_to(SRC).parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = list(parts[:len(parts) - node.level]) + (node.module.split(".") if node.module else [])
        else:
            base = node.module.split(".")[1:] if node.module and node.module.startswith("attncnn.") else []
        if base and base[0] == package:
            names |= {".".join(base[1:] + [a.name]) if len(base) > 1 else a.name for a in node.names}
    return names


def test_the_studies_only_train_and_evaluate_through_training():
    found = {}
    for path in sorted((SRC / "reproduce").rglob("*.py")):
        extra = {n.rsplit(".", 1)[-1] for n in _names_from(path, "training")} - REPRODUCE_USES_OF_TRAINING
        if extra:
            found[str(path.relative_to(SRC))] = sorted(extra)
    assert not found


#: what analysis may take from training, and where: the fine-tune of a pruned run (``attncnn prune``) is a
#: training run from the pruned weights
ANALYSIS_USES_OF_TRAINING = {"analysis/pruned_run.py": {"train", "RunOptions"}}


def test_analysis_trains_only_to_fine_tune_a_pruned_run():
    found = {}
    for path in sorted((SRC / "analysis").rglob("*.py")):
        where = str(path.relative_to(SRC))
        allowed = ANALYSIS_USES_OF_TRAINING.get(where, set())
        extra = {n.rsplit(".", 1)[-1] for n in _names_from(path, "training")} - allowed
        if extra:
            found[where] = sorted(extra)
    assert not found


#: modules that call the low-level writers of tensor files: run storage, and the decoded-image cache
#: of the data sets (not a checkpoint)
TENSOR_WRITERS = {"runs", "data/cache.py"}


def _tensor_writes(source: str) -> list[str]:
    """``"<line> imports a safetensors writer"`` / ``"<line> calls torch.save"`` for each in ``source``."""
    writes = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("safetensors") and any(
                a.name.startswith("save") for a in node.names):
            writes.append(f"{node.lineno} imports a safetensors writer")
        if isinstance(node, ast.Attribute) and node.attr == "save" and isinstance(node.value, ast.Name) \
                and node.value.id == "torch":
            writes.append(f"{node.lineno} calls torch.save")
    return writes


def test_nothing_outside_runs_writes_a_checkpoint():
    writers = []
    for path in PY_FILES:
        rel = path.relative_to(SRC)
        if rel.parts[0] in TENSOR_WRITERS or str(rel) in TENSOR_WRITERS:
            continue
        writers += [f"{rel}:{write}" for write in _tensor_writes(path.read_text())]
    assert not writers


def test_the_checkpoint_checker_sees_writers():
    # guards the two tests above against passing because their checkers found nothing: the same
    # functions, on the module that does write checkpoints and on a torch.save
    assert _names_from(SRC / "reproduce" / "running" / "runner.py", "training") >= {"train"}
    assert any(w.endswith("imports a safetensors writer") for w in _tensor_writes((SRC / "runs" / "checkpoint.py")
                                                                                  .read_text()))
    assert _tensor_writes("import torch\n\ntorch.save({}, 'x.pt')\n") == ["3 calls torch.save"]


def _sys_path_uses(source: str) -> list[int]:
    """Lines of ``source`` that name ``sys.path``."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
            and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"]


def test_the_package_leaves_sys_path_alone():
    # a pip user has the package and nothing beside it: a module that reached into the repository
    # through sys.path (as the benchmark harness once reached benchmarks/) works only in a checkout
    found = [f"{path.relative_to(SRC)}:{line}" for path in PY_FILES for line in _sys_path_uses(path.read_text())]
    assert not found
    assert _sys_path_uses("import sys\nsys.path.insert(0, 'x')\n") == [2]      # the checker sees one


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in PY_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in REGISTRATION:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} "
                                f"({node.end_lineno - start + 1} lines)")
    assert not long


def test_no_file_is_too_long():
    files = [p for p in SRC.rglob("*") if p.is_file() and p.suffix in (".py", ".html", ".js", ".css")]
    long = [f"{p.relative_to(SRC)} ({n} lines)" for p in files
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long


def test_the_checker_sees_relative_imports():
    # guards the test above against passing because it found nothing
    assert _package_imports(SRC / "training" / "state.py") >= {"models", "data", "runs"}
    assert "runs" in _package_imports(SRC / "analysis" / "runs.py")


def _attention_class_names() -> set[str]:
    import attncnn.layers as layers
    return {name for name in layers.__all__
            if isinstance(getattr(layers, name), type) and issubclass(getattr(layers, name), layers.GridAttention)}


def _isinstance_targets(node: ast.Call) -> set[str]:
    """Names in the class argument of an ``isinstance``/``issubclass`` call."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
        return set()
    found = set()
    for sub in ast.walk(node.args[1]):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def test_only_layers_and_theory_ask_an_attention_layer_for_its_class():
    # analysis, reports and figures ask the layer for its kind and capabilities (position_only,
    # has_centers, has_gates, ...); the theory is about QuadraticAttention itself
    classes = _attention_class_names()
    assert {"GridAttention", "QuadraticAttention", "GatedPositionalAttention"} <= classes
    found = []
    for path in PY_FILES:
        if path.relative_to(SRC).parts[0] in ("layers", "theory"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _isinstance_targets(node) & classes:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found


def test_the_isinstance_checker_sees_attention_classes():
    # guards the test above against passing because it found nothing
    call = ast.parse("isinstance(m, (nn.Linear, layers.QuadraticAttention))").body[0].value
    assert "QuadraticAttention" in _isinstance_targets(call)
