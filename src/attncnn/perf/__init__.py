"""Making attncnn fast on the machine at hand, in one place.

``plan`` (:func:`make_plan`, :func:`resume_plan`: the :class:`attncnn.training.RunPlan` a run takes
here) from ``precision`` (fp32 / bf16 for this device), ``paths`` (the fastest attention path,
measured and cached) and ``compiling`` (whether ``torch.compile`` pays back, measured and cached);
``machine`` (the one description of this machine: cache keys, epoch records, benchmark files) and
``cache`` (the JSON files of measured choices); ``host_memory`` (the CPU allocator policy);
``timing`` (the one timing primitive every measurement uses); ``bench`` (the benchmark harness and
``attncnn bench``). The training loop takes a finished plan and measures nothing itself.
"""

from .machine import cpu_name, device_name, epoch_machine, machine_info, machine_key, resolve_device
from .plan import make_plan, plan_device, resume_plan
from .precision import PRECISIONS, fast_bf16, machine_precision, resolve_precision, running_at, slow_bf16_reason

__all__ = ["make_plan", "resume_plan", "plan_device", "resolve_device", "cpu_name", "device_name", "machine_key",
           "machine_info", "epoch_machine", "PRECISIONS", "fast_bf16", "slow_bf16_reason", "resolve_precision",
           "machine_precision", "running_at"]
