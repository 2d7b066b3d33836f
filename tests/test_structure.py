"""The shape of the source tree that DESIGN.md promises: the import arrow, and small functions and files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attncnn"
PY_FILES = sorted(SRC.rglob("*.py"))

# cli -> api/reproduce -> analysis -> training/theory/bench -> models -> layers: what each package may import
# from attncnn (api, the way in from Python, sits beside the command line: nothing imports it)
ALLOWED = {
    "layers": set(),
    "models": {"layers"},
    "data": set(),
    "training": {"models", "layers", "data"},
    "theory": {"layers", "models", "training", "data"},
    "analysis": {"layers", "models", "training", "data", "theory", "bench"},
    "bench": {"layers", "models", "training", "data"},
    "reproduce": {"layers", "models", "training", "data", "theory", "bench", "analysis"},
    "api": {"layers", "models", "training", "data", "analysis"},
}
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
    long = [f"{p.relative_to(SRC)} ({n} lines)" for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long


def test_the_checker_sees_relative_imports():
    # guards the test above against passing because it found nothing
    assert _package_imports(SRC / "training" / "state.py") >= {"models", "data"}
    assert "training" in _package_imports(SRC / "analysis" / "runs.py")


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
