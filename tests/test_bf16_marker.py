"""The ``needs_fast_bf16`` marker (tests/conftest.py): on a CPU without bf16 units its tests are
skipped with a reason that names the CPU; on one with them they run. The CPU is simulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from attncnn.perf import precision as run_precision
from attncnn.perf.machine import cpu_name

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.mark.parametrize("fast", [False, True], ids=["no-bf16-units", "bf16-units"])
def test_a_needs_fast_bf16_test_runs_only_where_bf16_is_fast_and_says_why_not(fast, pytester, monkeypatch):
    pytester.makeconftest(CONFTEST.read_text())          # the suite's own hook
    pytester.makeini("[pytest]\nmarkers =\n    needs_fast_bf16: bf16 speed\n")
    pytester.makepyfile(test_probe="""
        import pytest

        @pytest.mark.needs_fast_bf16
        def test_bf16_part():
            pass

        def test_other_part():
            pass
    """)
    monkeypatch.setattr(run_precision, "fast_bf16", lambda device: fast)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)     # the simulated CPU has no units at all
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider")
    if fast:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines([f"SKIPPED*needs fast bf16: CPU {cpu_name()} has no bfloat16 matrix units*"])
