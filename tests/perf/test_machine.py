"""The machine a speed measurement belongs to: one marketing name covers several CPU generations."""

from __future__ import annotations

import torch

from attncnn.perf import machine as machine_cache
from attncnn.perf.machine import cpu_name, machine_info, machine_record

CPU = torch.device("cpu")
# the fields that matter of two 2-core cloud machines sold as "AMD EPYC" (Zen 2 and Zen 4)
ZEN2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\nmodel name\t: AMD EPYC\n" \
       "stepping\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n"
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n" \
       "stepping\t: 1\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 fma\n"


def test_cpus_sold_under_one_name_get_their_own_key(tmp_path, monkeypatch):
    keys = {}
    for name, text in (("zen2", ZEN2), ("zen4", ZEN4)):
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(machine_cache, "CPUINFO", tmp_path / name, raising=False)
        assert cpu_name() == "AMD EPYC" and machine_info(CPU)["cpu"] == "AMD EPYC"    # the name alone, as before
        keys[name] = machine_record(CPU)
    assert keys["zen2"] == {"cpu": "AMD EPYC", "cpu_signature": "family 23 model 49 stepping 0 isa=avx2", "gpu": None,
                            "threads": torch.get_num_threads(), "torch": torch.__version__, "device": "cpu"}
    zen4 = "family 25 model 17 stepping 1 isa=avx2,avx512f,avx512_bf16"
    assert keys["zen4"] == {**keys["zen2"], "cpu_signature": zen4}
    (tmp_path / "old").write_text(ZEN2.replace(" avx avx2 fma", ""))
    monkeypatch.setattr(machine_cache, "CPUINFO", tmp_path / "old")
    assert machine_record(CPU)["cpu_signature"] == "family 23 model 49 stepping 0 isa=none"


def test_without_proc_cpuinfo_the_key_falls_back_to_what_platform_knows(tmp_path, monkeypatch):
    monkeypatch.setattr(machine_cache, "CPUINFO", tmp_path / "missing", raising=False)
    monkeypatch.setattr(machine_cache.platform, "processor", lambda: "arm")
    assert cpu_name() == "arm"
    assert machine_record(CPU)["cpu"] == "arm" and machine_record(CPU)["cpu_signature"] == ""
