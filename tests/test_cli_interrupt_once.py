"""Ctrl-C during ``attncnn train``, in a real process: the interrupt line (with the ``--resume``
command) is printed once, not once by the library's log and again by the command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")


def _environment() -> dict:
    # the child imports the attncnn this test imported (a PYTHONPATH worktree wins over the editable install)
    import attncnn

    env = dict(os.environ)
    src = str(Path(attncnn.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_ctrl_c_during_training_prints_the_interrupt_line_once(make_tiny_data, tmp_path):
    data = make_tiny_data(20, 6)
    out = tmp_path / "run"
    # many epochs of a few steps: SIGINT arrives while it trains, whatever the machine's speed
    command = [sys.executable, "-m", "attncnn", "train", "--preset", "demo", "--data", str(data), "--epochs", "1000",
               "--batch-size", "10", "--out", str(out), "--no-progress", "--no-compile",
               "--checkpoint-every", "1000"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_environment())
    lines: list[str] = []
    trained = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("epoch "):          # the loop's line after each epoch: it is stepping
                trained.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert trained.wait(timeout=240), "".join(lines)
        proc.send_signal(signal.SIGINT)
        # wait, not communicate(): communicate would read stderr too, taking lines from the reader thread
        # (stdout's few lines fit in the pipe's buffer)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.count("interrupted by SIGINT") == 1, err
    assert err.count(f"Resume with: attncnn train --resume {out}") == 1, err
    assert "Traceback" not in err and "attncnn: interrupted" not in err
    assert (out / "checkpoints" / "last.safetensors").is_file()
