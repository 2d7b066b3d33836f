"""Making attncnn fast on the machine at hand, in one place.

``plan`` (:func:`make_plan`, :func:`resume_plan`: the :class:`attncnn.training.RunPlan` a run takes
here: device, precision and deterministic decided at once, without data or a network; the paths
and compile left to its :class:`~attncnn.perf.plan.RunChooser`, which the training loop calls
on its real objects) from ``precision`` (fp32 / bf16 for this device) and ``rule`` (the one
written rule for attention paths and compile: a pure function of device type, attention kind,
grid, precision and run length; nothing measured by default, nothing persisted between runs);
``measure`` (the in-process timing of paths and compile that ``--impl measure`` and
``--measure-compile`` ask for, forgotten at exit); ``timing`` (the one timing primitive);
``bench`` (the benchmark harness and ``attncnn bench``); ``machine`` (the one description of this
machine: machine.json, epoch records, benchmark files); ``host_memory`` (the CPU allocator policy
the commands set). The training package never imports this one: it calls the chooser it is handed.
"""

from .machine import cpu_name, device_name, machine_info, resolve_device
from .plan import make_plan, plan_device, resume_plan
from .precision import PRECISIONS, fast_bf16, machine_precision, resolve_precision, running_at, slow_bf16_reason
from .rule import Choice, choose, device_kind

__all__ = ["make_plan", "resume_plan", "plan_device", "resolve_device", "cpu_name", "device_name", "machine_info",
           "PRECISIONS", "fast_bf16", "slow_bf16_reason", "resolve_precision",
           "machine_precision", "running_at", "choose", "Choice", "device_kind"]
