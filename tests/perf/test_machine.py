"""The machine as reports and machine.json name it: the CPU's model name from /proc/cpuinfo."""

from __future__ import annotations

import torch

from attncnn.perf import machine
from attncnn.perf.machine import cpu_name, machine_info

CPU = torch.device("cpu")
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n" \
       "stepping\t: 1\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 fma\n\nprocessor\t: 1\nmodel name\t: Other\n"


def test_the_cpu_is_named_by_the_first_model_name_of_proc_cpuinfo(tmp_path, monkeypatch):
    (tmp_path / "cpuinfo").write_text(ZEN4)
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "cpuinfo")
    assert cpu_name() == "AMD EPYC" and machine_info(CPU)["cpu"] == "AMD EPYC"


def test_without_proc_cpuinfo_the_name_falls_back_to_what_platform_knows(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(machine.platform, "processor", lambda: "arm")
    assert cpu_name() == "arm"
