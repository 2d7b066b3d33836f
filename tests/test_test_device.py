"""``ATTNCNN_TEST_DEVICE`` (tests/conftest.py): the device of the layer and model tests, CPU by
default; a bogus or missing device stops the session with a message that names the variable,
never a silent fall-back to the CPU. CUDA is simulated: nothing here needs a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent / "conftest.py"
VARIABLE = "ATTNCNN_TEST_DEVICE"


def _conftest():
    """The suite's conftest as a plain module (pytest's own copy is not importable by name)."""
    spec = importlib.util.spec_from_file_location("attncnn_tests_conftest", CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def requested_device(monkeypatch):
    """``requested_device`` of the conftest, reading a patched environment and a patched CUDA
    (``cuda(available, count)``); no GPU is ever touched."""
    module = _conftest()

    def cuda(available: bool, count: int = 0) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    module.simulate_cuda = cuda
    cuda(False)
    return module


def test_unset_or_empty_means_the_cpu(requested_device, monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    assert requested_device.requested_device() == torch.device("cpu")
    monkeypatch.setenv(VARIABLE, "")
    assert requested_device.requested_device() == torch.device("cpu")


@pytest.mark.parametrize("value", ["cpu", "CPU", " cpu\n"])
def test_cpu_in_any_case_is_the_cpu(requested_device, monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    assert requested_device.requested_device() == torch.device("cpu")


@pytest.mark.parametrize("value", ["meta", "mps", "gpu", "cuda:x", "cuda:", "cpu:0", "bogus"])
def test_any_other_device_is_an_error_naming_the_variable_and_the_choices(requested_device, monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ValueError) as err:
        requested_device.requested_device()
    message = str(err.value)
    assert f"{VARIABLE}={value!r}" in message and "use cpu (the default), cuda or cuda:N" in message


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "CUDA"])
def test_cuda_without_a_gpu_is_an_error_not_the_cpu(requested_device, monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ValueError, match=f"{VARIABLE}={value!r} asks for CUDA, but torch .* sees no CUDA device"):
        requested_device.requested_device()


def test_cuda_with_a_gpu_is_that_gpu_and_an_index_past_the_last_is_an_error(requested_device, monkeypatch):
    requested_device.simulate_cuda(True, count=2)
    for value, expected in [("cuda", "cuda:0"), ("cuda:1", "cuda:1"), (" Cuda:0 ", "cuda:0")]:
        monkeypatch.setenv(VARIABLE, value)
        assert requested_device.requested_device() == torch.device(expected)
    monkeypatch.setenv(VARIABLE, "cuda:2")
    with pytest.raises(ValueError, match=f"{VARIABLE}='cuda:2' asks for CUDA device 2, but there are only 2"):
        requested_device.requested_device()


def test_an_explicit_value_wins_over_the_environment(requested_device, monkeypatch):
    monkeypatch.setenv(VARIABLE, "bogus")
    assert requested_device.requested_device("cpu") == torch.device("cpu")


# -- the whole session, through the suite's own conftest ------------------------------------------

PROBE = """
    import pytest
    import torch

    def test_on_the_device(device):
        assert isinstance(device, torch.device)
        print("DEVICE", device)

    @pytest.mark.cpu_only("pinned CPU numbers")
    def test_pinned():
        pass
"""


def _session(pytester, monkeypatch, value: str | None, probe: str = PROBE):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_probe=probe)
    if value is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, value)
    return pytester.runpytest_inprocess("-s", "-p", "no:cacheprovider")


def test_a_default_session_runs_on_the_cpu_and_says_so(pytester, monkeypatch):
    result = _session(pytester, monkeypatch, None)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"layer and model tests on: cpu (${VARIABLE}*", "*DEVICE cpu*"])


@pytest.mark.parametrize("value,message", [
    ("bogus", f"ERROR: {VARIABLE}='bogus' is not a device the layer and model tests run on*"),
    ("meta", f"ERROR: {VARIABLE}='meta' is not a device*"),
    ("cuda", f"ERROR: {VARIABLE}='cuda' asks for CUDA, but torch * sees no CUDA device*"),
])
def test_a_bogus_or_missing_device_stops_the_session_before_any_test(pytester, monkeypatch, value, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = _session(pytester, monkeypatch, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "passed" not in result.stdout.str() and "DEVICE" not in result.stdout.str()


@pytest.mark.parametrize("marker,problem", [
    ('@pytest.mark.cpu_only("why")\n    def test_bad(device):', "marked cpu_only but asks for the device fixture"),
    ("@pytest.mark.cpu_only\n    def test_bad():", 'cpu_only needs a reason, cpu_only("why")'),
])
def test_a_cpu_only_test_must_say_why_and_may_not_ask_for_the_device(pytester, monkeypatch, marker, problem):
    probe = f"""
    import pytest

    {marker}
        pass
"""
    result = _session(pytester, monkeypatch, None, probe)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: *test_probe.py::test_bad: {problem}"])
