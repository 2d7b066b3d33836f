"""Ctrl-C in ``attncnn.cli.main`` reaches an in-process caller as KeyboardInterrupt (a test suite
calling it stops instead of recording one failure and going on); the executable turns it into one
line and exit status 130."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attncnn import cli
from attncnn.cli import presets as presets_command
from attncnn.training import TrainingInterrupted


def _presets_raising(exc):
    def handler(args):
        raise exc
    return handler


def test_main_lets_ctrl_c_through(monkeypatch, capsys):
    monkeypatch.setattr(presets_command, "handle", _presets_raising(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        cli.main(["presets"])


def test_console_turns_ctrl_c_into_one_line_and_130(monkeypatch, capsys):
    monkeypatch.setattr(presets_command, "handle", _presets_raising(KeyboardInterrupt()))
    assert cli.console_main(["presets"]) == 130
    assert capsys.readouterr().err == "attncnn: interrupted\n"


def _stopped_training(signum, tmp_path):
    return TrainingInterrupted(f"interrupted by {signal.Signals(signum).name}; saved a resumable checkpoint. "
                               f"Resume with: attncnn train --resume {tmp_path}", signum=signum,
                               checkpoint=tmp_path / "checkpoints" / "last.safetensors")


def test_ctrl_c_saved_by_training_still_stops_an_in_process_caller(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(presets_command, "handle", _presets_raising(_stopped_training(signal.SIGINT, tmp_path)))
    with pytest.raises(KeyboardInterrupt):
        cli.main(["presets"])
    assert f"Resume with: attncnn train --resume {tmp_path}" in capsys.readouterr().err
    # the executable: the resume line once, no second "interrupted" line, status 130
    assert cli.console_main(["presets"]) == 130
    err = capsys.readouterr().err
    assert err.count("Resume with:") == 1 and "attncnn: interrupted" not in err


def test_sigterm_saved_by_training_is_status_143(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(presets_command, "handle", _presets_raising(_stopped_training(signal.SIGTERM, tmp_path)))
    assert cli.main(["presets"]) == 143
    assert "Resume with:" in capsys.readouterr().err


def test_the_executable_is_console_main():
    import tomllib
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["scripts"]["attncnn"] == "attncnn.cli:console_main"
    main_module = (Path(cli.__file__).parents[1] / "__main__.py").read_text(encoding="utf-8")
    assert "sys.exit(console_main())" in main_module


def test_ctrl_c_in_main_stops_a_pytest_run(tmp_path):
    suite = tmp_path / "test_suite.py"
    suite.write_text(textwrap.dedent("""
        from attncnn import cli
        from attncnn.cli import presets as presets_command

        def test_first(monkeypatch):
            def handler(args):
                raise KeyboardInterrupt       # what Ctrl-C does during the command
            monkeypatch.setattr(presets_command, "handle", handler)
            assert cli.main(["presets"]) == 0

        def test_second():
            open(__file__ + ".ran", "w").close()
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr          # pytest's "interrupted" status
    assert not Path(str(suite) + ".ran").exists()                   # the suite stopped at the first test
