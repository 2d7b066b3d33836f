"""Shared fixtures, and the ``needs_fast_bf16`` marker.

Tests that need real CIFAR-10 images read the path in ``ATTNCNN_TEST_CIFAR10`` (set by
.ci/run to ../shared/data/cifar10-jpeg.zip); outside CI they fall back to that shared copy
beside the repository when it exists.

A test marked ``needs_fast_bf16`` times or trains real bf16 work (a 2048^3 bf16 product takes
minutes on a CPU without bf16 units): on such a CPU it is skipped with a reason that names the CPU
(:func:`attncnn.perf.precision.slow_bf16_reason`); on one with AVX512-BF16 or AMX it runs.

The layer and model tests compute on the device named by ``ATTNCNN_TEST_DEVICE`` (``cpu``, the
default, ``cuda`` or ``cuda:N``), through the session fixture ``device``: a GPU job runs
``ATTNCNN_TEST_DEVICE=cuda python -m pytest tests/layers tests/models``. A device that is asked
for and missing stops the session before any test runs (never a silent fall-back to the CPU).
Tests whose facts belong to the CPU (pinned CPU numbers, bit-identity with old CPU formulas) carry
the marker ``cpu_only("why")`` and compute on the CPU whatever the variable says; such a test may
not ask for ``device``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from PIL import Image

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]


def _cifar10_copy() -> Path | None:
    env = os.environ.get("ATTNCNN_TEST_CIFAR10")
    if env:
        return Path(env)
    guess = REPO.parent / "shared" / "data" / "cifar10-jpeg.zip"
    return guess if guess.exists() else None


@pytest.fixture(scope="session")
def cifar10_path() -> Path:
    """Path to a real CIFAR-10 copy (zip or folder); fails in CI when missing."""
    path = _cifar10_copy()
    if path is None or not path.exists():
        if os.environ.get("CI"):
            pytest.fail("ATTNCNN_TEST_CIFAR10 must point at a CIFAR-10 copy in CI")
        pytest.skip("no CIFAR-10 copy: set ATTNCNN_TEST_CIFAR10")
    return path


def pytest_collection_modifyitems(config, items):
    """Skip the ``needs_fast_bf16`` tests where the CPU has no fast bf16, saying why; refuse a
    ``cpu_only`` test without a reason or that asks for ``device``."""
    import torch

    from attncnn.perf import precision as run_precision

    marked = [item for item in items if item.get_closest_marker("needs_fast_bf16")]
    reason = run_precision.slow_bf16_reason(torch.device("cpu")) if marked else None
    for item in marked if reason else ():
        item.add_marker(pytest.mark.skip(reason=f"needs fast bf16: {reason}"))
    _check_cpu_only(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _slow_modules_first(items)


def _slow_modules_first(items) -> None:
    """Hand the modules with slow tests to the workers first (a stable sort: each module keeps its
    order, and every worker collects the same list, as pytest-xdist requires), so that the suite
    does not end on one worker training a module's fixture while the other cores wait."""
    def module(item) -> str:
        return item.nodeid.split("::", 1)[0]

    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in slow)


# -- the device of the layer and model tests ($ATTNCNN_TEST_DEVICE) -------------------------------

DEVICE_VARIABLE = "ATTNCNN_TEST_DEVICE"
_DEVICE_KEY = pytest.StashKey["torch.device"]()


def requested_device(value: str | None = None) -> "torch.device":
    """The device ``ATTNCNN_TEST_DEVICE`` names (or ``value``, when given): ``cpu`` when unset or
    empty, else ``cpu``, ``cuda`` or ``cuda:N`` (case and surrounding blanks ignored).

    Raises:
        ValueError: any other value (``meta``, ``mps``, a typo), or a CUDA device this torch cannot
            reach (a CPU-only build, no GPU, or an index past the last GPU); the message names the
            variable. Never falls back to the CPU.
    """
    import torch

    raw = os.environ.get(DEVICE_VARIABLE) if value is None else value
    text = (raw or "").strip().lower() or "cpu"
    kind, colon, index = text.partition(":")
    if text != "cpu" and not (kind == "cuda" and (not colon or index.isdigit())):
        raise ValueError(f"{DEVICE_VARIABLE}={raw!r} is not a device the layer and model tests run on; "
                         f"use cpu (the default), cuda or cuda:N")
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{DEVICE_VARIABLE}={raw!r} asks for CUDA, but torch {torch.__version__} sees no "
                             f"CUDA device (torch.cuda.is_available() is False); run on a GPU machine with a "
                             f"CUDA build of torch, or unset {DEVICE_VARIABLE} to test on the CPU")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{DEVICE_VARIABLE}={raw!r} asks for CUDA device {device.index}, but there "
                             f"{'is' if count == 1 else 'are'} only {count}; use cuda:0 to cuda:{count - 1}")
        if device.index is None:         # "cuda:0", as tensors report it, so that devices compare equal
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _share_the_cores_between_workers() -> None:
    """In a pytest-xdist worker, give torch (and the processes a test starts) its share of the
    cores: with two workers on two cores, each worker's torch would otherwise start one thread per
    core, and four threads on two cores wait on each other at every parallel region's barrier."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = str(max(1, cores // workers))
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = threads
    import torch

    torch.set_num_threads(int(threads))


def pytest_configure(config):
    """Register ``cpu_only``; read ``ATTNCNN_TEST_DEVICE`` once, stopping the session (a usage
    error, before collection) when it names a device that is not there; in a parallel worker,
    hold torch to the worker's share of the cores."""
    _share_the_cores_between_workers()
    config.addinivalue_line("markers", "cpu_only(reason): computes on the CPU whatever ATTNCNN_TEST_DEVICE "
                                       "says (pinned CPU numbers, CPU kernels); the reason says why")
    try:
        device = requested_device()
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    config.stash[_DEVICE_KEY] = device
    if device.type == "cuda":
        import torch

        # The tests compare two float32 paths (or float32 with float64) at float32 tolerances, and
        # bound bf16 errors assuming float32 accumulation. On CUDA, TF32 (10-bit mantissa) matmuls
        # and cuDNN convolutions, and cuBLAS's reduced-precision bf16 reductions, would move
        # results by far more than that: all off for the whole session, as on the CPU (which has
        # no TF32). Nothing in src/ turns them back on.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


def pytest_report_header(config):
    device = config.stash.get(_DEVICE_KEY, None)
    if device is None:
        return None
    where = f"{device}"
    if device.type == "cuda":
        import torch

        where += f" ({torch.cuda.get_device_name(device)}; TF32 and reduced-precision reductions off)"
    return f"layer and model tests on: {where} (${DEVICE_VARIABLE}; cpu_only tests on the CPU)"


@pytest.fixture(scope="session")
def device(pytestconfig) -> "torch.device":
    """The device of the layer and model tests (``ATTNCNN_TEST_DEVICE``, default CPU): build
    layers, models and inputs there (make random inputs on the CPU, then move them, so that each
    device sees the same numbers)."""
    return pytestconfig.stash[_DEVICE_KEY]


def _check_cpu_only(items) -> None:
    wrong = []
    for item in items:
        marker = item.get_closest_marker("cpu_only")
        if marker is None:
            continue
        reason = marker.kwargs.get("reason", marker.args[0] if marker.args else "")
        if not (isinstance(reason, str) and reason.strip()):
            wrong.append(f"{item.nodeid}: cpu_only needs a reason, cpu_only(\"why\")")
        if "device" in getattr(item, "fixturenames", ()):
            wrong.append(f"{item.nodeid}: marked cpu_only but asks for the device fixture")
    if wrong:
        raise pytest.UsageError("\n".join(wrong))


TINY_CLASSES = ("cat", "dog", "frog")


@pytest.fixture(scope="session")
def make_tiny_data(tmp_path_factory):
    """``make_tiny_data(train, test, size=32)``: an image-folder data set of 3 classes with ``train``
    and ``test`` PNGs of ``size x size`` pixels each, where class c has a brighter channel c (so a
    few epochs learn it). Made once per shape for the whole session. Tests of study commands take
    16x16 images: an 8x8 token grid trains two to three times as fast as 16x16 (a new run builds a
    learned absolute position embedding, such as ``deit-mini``'s, for its images)."""
    made: dict[tuple[int, int, int], Path] = {}

    def make(train: int, test: int, size: int = 32) -> Path:
        if (train, test, size) not in made:
            root = tmp_path_factory.mktemp(f"tiny-{train}-{test}" + ("" if size == 32 else f"-{size}px"))
            rng = np.random.default_rng(0)
            for split, n in (("train", train), ("test", test)):
                for c, name in enumerate(TINY_CLASSES):
                    folder = root / split / name
                    folder.mkdir(parents=True)
                    for i in range(n):
                        img = rng.integers(0, 120, size=(size, size, 3), dtype=np.uint8)
                        img[..., c] += 120
                        Image.fromarray(img).save(folder / f"{i:03d}.png")
            made[(train, test, size)] = root
        return made[(train, test, size)]

    return make


@pytest.fixture(scope="session")
def data_cache_dir(tmp_path_factory) -> Path:
    """One decoded-data cache for the whole session ($ATTNCNN_DATA_DIR in CI), so the 60,000 JPEGs
    of the real copy are decoded once, not once per test."""
    env = os.environ.get("ATTNCNN_DATA_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="session", autouse=True)
def _never_the_user_cache(data_cache_dir, tmp_path_factory):
    """Tests never touch ~/.cache: the default data folder is the session's, and so is the user
    cache (``$ATTNCNN_CACHE_DIR``, :func:`attncnn._cache_dir.user_cache_dir`) of downloaded models: a
    fresh folder per session, so no test takes a model the user downloaded.

    Session-scoped, so that it is in force before any fixture of any scope runs: a module-scoped
    fixture that trains a tiny run (tests/test_cli.py, tests/reproduce/) is set up before the
    function-scoped fixtures of its first test, and used to decode into ~/.cache/attncnn."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNCNN_DATA_DIR", str(data_cache_dir))
        patch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path_factory.mktemp("user-cache")))
        yield


# the GPU benchmarks' and the GPU job tool's tests: a stopped child's workers must end too
@pytest.fixture
def assert_process_ends():
    """A check that the process ``pid`` has ended within a few seconds: gone, or a zombie waiting
    for whoever adopted it to reap it (a stopped job's worker is killed, not waited for)."""
    def check(pid: int, what: str, seconds: float = 5.0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            status = Path(f"/proc/{pid}/status")
            if not status.exists() or "\tZ" in status.read_text():
                return
            time.sleep(0.1)
        pytest.fail(f"{what} {pid} still runs")
    return check
