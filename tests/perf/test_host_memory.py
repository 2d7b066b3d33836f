"""attncnn.perf.host_memory: freed memory is reused instead of page-faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from attncnn.perf import host_memory

# After three warm-up allocations, allocates and frees a 64 MiB tensor five times (torch.ones touches every
# page) and prints the policy's result and the minor page faults the five allocations cost.
_SCRIPT = """
import resource, torch
from attncnn.perf.host_memory import reuse_freed_memory
result = reuse_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):     # the heap grows to its working size (measured: the first two allocations fault)
    torch.ones(16 * 2**20)
before = faults()
for _ in range(5):
    t = torch.ones(16 * 2**20)
    del t
print(result, faults() - before)
"""

# Allocates 2.25 GiB with the C library's malloc, touches every page and frees it, twice, and prints
# the policy's result and the minor page faults of the second time. Straight from C, so that no
# other allocation lands above the block: freed, it joins the free top of the heap, as the last of
# a layer's large tensors does.
_LARGE_SCRIPT = """
import ctypes, ctypes.util, resource
from attncnn.perf.host_memory import reuse_freed_memory
result = reuse_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(2304 * 2**20)
    ctypes.memset(block, 1, 2304 * 2**20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(result, faults[1])
"""

PAGES_PER_TENSOR = 64 * 2**20 // 4096
glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the policy is glibc's mallopt")


def _run(policy: str, script: str = _SCRIPT) -> tuple[str, int]:
    env = {**os.environ, host_memory.ENV_VAR: policy}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    result, faults = out.stdout.split()
    return result, int(faults)


@glibc
def test_heap_policy_reuses_freed_pages_that_the_system_policy_faults_in_again():
    system, system_faults = _run("system")
    # up to three tries: now and then (1 run in 3 on a busy 2-core machine) the heap still grows by
    # two tensors after the warm-up; the property is that freed pages *can* be reused, which one run
    # shows (so the first run that shows it ends the tries)
    for _ in range(3):
        heap, heap_faults = _run("heap")
        if heap_faults < PAGES_PER_TENSOR / 4:
            break
    assert (system, heap) == ("system", "heap")
    # glibc maps blocks above 32 MiB afresh on every allocation: each one faults in all its pages
    assert system_faults >= 5 * PAGES_PER_TENSOR * 0.9
    # kept for reuse: the five allocations touch pages that are already there
    assert heap_faults < PAGES_PER_TENSOR / 4


@glibc
def test_heap_policy_keeps_a_free_top_larger_than_any_trim_threshold():
    # 2.25 GiB freed at once (a test batch of 500 through content attention frees more per layer): a
    # finite trim threshold is at most 2 GiB (mallopt takes an int), and crossing it gave the whole top
    # of the heap back, so the next allocation faulted all its pages in again
    pages = 2304 * 2**20 // 4096
    system, system_faults = _run("system", _LARGE_SCRIPT)
    heap, heap_faults = _run("heap", _LARGE_SCRIPT)
    assert (system, heap) == ("system", "heap")
    assert system_faults >= pages * 0.9           # the check sees the faults where the memory is given back
    assert heap_faults < pages / 20


def test_an_unknown_policy_is_refused_with_the_valid_ones(monkeypatch):
    monkeypatch.setattr(host_memory, "_state", {})
    monkeypatch.setenv(host_memory.ENV_VAR, "jemalloc")
    with pytest.raises(ValueError, match="expected 'heap'.*or 'system'"):
        host_memory.reuse_freed_memory()


def test_system_policy_changes_nothing(monkeypatch):
    monkeypatch.setattr(host_memory, "_state", {})
    monkeypatch.setattr(host_memory, "_set_heap_policy", lambda: pytest.fail("the system policy must not call mallopt"))
    monkeypatch.setenv(host_memory.ENV_VAR, " System ")          # as the variable is read: trimmed, any case
    assert host_memory.reuse_freed_memory() == "system"
