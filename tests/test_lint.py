"""The tree passes its lint: ruff with the rules of pyproject.toml's ``[tool.ruff]`` (pyflakes'
unused and undefined names, pycodestyle's errors and warnings, lines of at most 120 characters),
over everything git would ship: ``src/``, ``tests/``, ``benchmarks/`` and the notebook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_tree_passes_ruff():
    done = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, f"ruff found problems (fix them, or run `ruff check --fix .`):\n{done.stdout}"


def test_the_lint_catches_what_it_is_meant_to(tmp_path):
    # the same configuration, on a file with one unused import, one undefined name and one long line
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\nx = undefined_name\ny = '" + "a" * 130 + "'\n")
    done = _ruff("check", "--no-cache", "--output-format", "concise", "bad.py", cwd=tmp_path)
    assert done.returncode == 1
    assert {code for code in ("F401", "F821", "E501") if code in done.stdout} == {"F401", "F821", "E501"}
