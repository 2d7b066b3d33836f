"""A device string that names no device (``--device gpu``, a run's stored ``"device"``) is one line
naming where it came from and the values to use, from every command that takes one; not torch's
``Expected one of cpu, cuda, ...`` traceback."""

from __future__ import annotations

import json

import pytest
import torch

from attncnn.cli import main
from attncnn.perf import resolve_device
from attncnn.perf.plan import plan_device

FIX = "use --device auto, cpu, cuda or cuda:N"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("name", ["gpu", "tpu", "GPU", "cuda:x", "meta", ""])
def test_resolve_device_names_the_option_and_the_fix(name):
    with pytest.raises(ValueError) as err:
        resolve_device(name)
    assert str(err.value).startswith(f"--device {name!r}: not a device this program runs on; ")
    assert FIX in str(err.value)
    with pytest.raises(ValueError, match="^run r: config.json's device 'gpu': not a device"):
        resolve_device("gpu", source="run r: config.json's device 'gpu'")
    with pytest.raises(ValueError, match="not a device"):
        resolve_device(1)                      # a stored number: torch.device(1) would be cuda:1
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@no_cuda
def test_cuda_on_a_machine_without_it_says_so():
    for name in ("cuda", "cuda:0", "cuda:7"):
        with pytest.raises(ValueError, match=f"^--device '{name}': CUDA is not available on this machine; use "
                                             "--device cpu$"):
            resolve_device(name)


def test_under_torchrun_a_bad_device_is_named_too(monkeypatch):
    for key, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=f"--device 'gpu': not a device this program runs on; {FIX}"):
        plan_device("gpu")


@pytest.mark.parametrize("argv", [
    ["train", "--preset", "demo", "--device", "gpu", "--out", "{tmp}/run"],
    ["evaluate", "{tmp}/nothing", "--device", "tpu"],
    ["reproduce", "mini", "--device", "gpu", "--out", "{tmp}/suite"],
    ["reproduce", "mini", "--device", "gpu", "--out", "{tmp}/suite", "--dry-run"],
    ["bench", "--presets", "demo", "--device", "gpu"],
])
def test_every_command_refuses_a_device_typo_in_one_line(argv, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert err.startswith(f"attncnn {argv[0]}: error: --device ") and "not a device" in err and FIX in err
    assert not any(tmp_path.iterdir())           # refused before anything was written


@no_cuda
def test_train_on_cuda_without_it_is_one_line(tmp_path, capsys):
    assert main(["train", "--preset", "demo", "--device", "cuda", "--out", str(tmp_path / "run")]) == 2
    err = _one_line_error(capsys)
    assert "--device 'cuda': CUDA is not available on this machine; use --device cpu" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_an_older_runs_stored_device_is_not_used_on_resume_this_commands_is(make_tiny_data, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--preset", "demo", "--data", str(make_tiny_data(20, 6)), "--epochs", "1",
                 "--batch-size", "10", "--out", str(run), "--no-progress", "--checkpoint-every", "1",
                 "--no-compile"]) == 0
    for name in ("finished.json", "checkpoints/last.safetensors"):
        (run / name).unlink()                        # as if stopped at the end of epoch 1 (epoch_0001 stays)
    config = json.loads((run / "config.json").read_text())
    old = {**config, "device": "gpu"}              # an older config.json's device, and a typo at that
    (run / "config.json").write_text(json.dumps(old))
    capsys.readouterr()
    # --device names this machine's device: a typo there is one line naming the flag
    assert main(["train", "--resume", str(run), "--device", "tpu", "--no-progress"]) == 2
    assert "--device 'tpu': not a device" in _one_line_error(capsys)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0        # auto: the stored one is not read
    assert json.loads((run / "config.json").read_text()) == old


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_index_past_this_machines_is_named():
    count = torch.cuda.device_count()
    assert resolve_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)
    with pytest.raises(ValueError, match=rf"^--device 'cuda:{count}': this machine has {count} GPU\(s\), cuda:0 to "):
        resolve_device(f"cuda:{count}")
