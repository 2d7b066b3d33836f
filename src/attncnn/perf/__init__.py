"""Making attncnn fast on the machine at hand, in one place.

``plan`` (:func:`make_plan`, :func:`resume_plan`: the :class:`attncnn.training.RunPlan` a run takes
here, with a :class:`~attncnn.perf.plan.RunChooser` for the paths and compile) from ``precision``
(fp32 / bf16 for this device) and ``rule`` (the one written rule for attention paths and compile);
``measure`` (the timings ``--impl measure`` and ``--measure-compile`` ask for); ``timing`` (the one
timing primitive); ``bench`` (``attncnn bench``); ``machine`` (the one description of this
machine); ``host_memory`` (the CPU allocator policy the commands set). The training package never
imports this one: it calls the chooser it is handed.
"""

from .machine import cpu_name, device_name, machine_info, resolve_device
from .plan import make_plan, plan_device, resume_plan
from .precision import PRECISIONS, fast_bf16, machine_precision, resolve_precision, running_at, slow_bf16_reason
from .rule import Choice, choose, device_kind

__all__ = ["make_plan", "resume_plan", "plan_device", "resolve_device", "cpu_name", "device_name", "machine_info",
           "PRECISIONS", "fast_bf16", "slow_bf16_reason", "resolve_precision",
           "machine_precision", "running_at", "choose", "Choice", "device_kind"]
