"""One exception family for user errors (attncnn.errors): each class is an AttncnnError and still the
built-in its API documents; the CLI prints those as one line (status 2) and lets every other exception
keep its traceback (status 1 from the executable)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import attncnn
from attncnn import cli
from attncnn.analysis.runs import ImageIndexError
from attncnn.data import DataError
from attncnn.errors import AttncnnError, InputError, MissingFileError, OutputError
from attncnn.runs import CheckpointError, RunFolderError
from attncnn.training import NonFiniteLossError, TrainingError, TrainingInterrupted

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("cls, documented", [
    (InputError, ValueError), (ImageIndexError, ValueError), (MissingFileError, FileNotFoundError),
    (OutputError, OSError), (DataError, Exception), (RunFolderError, Exception), (CheckpointError, Exception),
    (TrainingError, RuntimeError), (NonFiniteLossError, RuntimeError), (TrainingInterrupted, RuntimeError),
])
def test_each_user_error_is_an_attncnn_error_and_what_its_api_documents(cls, documented):
    assert issubclass(cls, AttncnnError) and issubclass(cls, documented)


def test_the_family_is_exported_at_the_top_and_its_module_imports_nothing_of_attncnn():
    assert attncnn.AttncnnError is AttncnnError and "AttncnnError" in attncnn.__all__
    tree = ast.parse((SRC / "attncnn" / "errors.py").read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imported)


def test_a_missing_file_error_keeps_its_message_without_an_errno_prefix():
    assert str(MissingFileError("no checkpoint at x")) == "no checkpoint at x"
    assert isinstance(OutputError(13, "cannot write into x"), OSError)


def _break_presets(monkeypatch, error: BaseException) -> None:
    """``attncnn presets`` fails deep inside: ``attncnn.models.list_presets`` raises ``error``."""
    def broken():
        raise error
    monkeypatch.setattr("attncnn.models.list_presets", broken)


def test_a_user_error_is_one_line_and_status_2(monkeypatch, capsys):
    _break_presets(monkeypatch, InputError("a bad option; pass another"))
    assert cli.main(["presets"]) == 2
    assert capsys.readouterr().err == "attncnn presets: error: a bad option; pass another\n"


@pytest.mark.parametrize("error", [ValueError("internal"), KeyError("internal"), OSError(5, "internal"),
                                   FileNotFoundError("internal"), RuntimeError("internal")])
def test_a_bug_is_not_turned_into_a_user_error_line(monkeypatch, capsys, error):
    _break_presets(monkeypatch, error)
    with pytest.raises(type(error), match="internal"):
        cli.main(["presets"])
    assert "error:" not in capsys.readouterr().err


def test_the_executable_shows_a_bugs_traceback_and_exits_with_status_1(tmp_path):
    code = ("import sys, attncnn.models, attncnn.cli\n"
            "def broken():\n"
            "    raise ValueError('internal')\n"
            "attncnn.models.list_presets = broken\n"
            "sys.exit(attncnn.cli.console_main(['presets']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: internal" in done.stderr
    assert "attncnn presets: error" not in done.stderr


def test_a_missing_run_folder_is_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["evaluate", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attncnn evaluate: error: ") and "nowhere" in err and err.count("\n") == 1


def test_an_output_folder_that_cannot_be_made_is_an_output_error_naming_it(tmp_path):
    from attncnn._io import make_folders

    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match=r"cannot create the folder .*file.*choose a writable output folder"):
        make_folders(tmp_path / "file" / "figures")
    assert make_folders(tmp_path / "a" / "b").is_dir()
