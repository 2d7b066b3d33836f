"""Making attncnn fast on the machine at hand, in one place.

``plan`` (:func:`make_plan`, :func:`resume_plan`: the :class:`attncnn.training.RunPlan` a run takes
here: device, precision and deterministic decided at once, without data or a network) from
``precision`` (fp32 / bf16 for this device); ``choosing`` (:class:`~attncnn.perf.choosing.RunChooser`,
which the plan hands to the training loop: what is measured is measured there, on the run's real
model, optimizer and batch shapes, with their state put back) from ``paths`` (the fastest attention
path) and ``compiling`` (whether ``torch.compile`` pays back); ``cache`` (the typed records of
measured choices, one JSON file in the user's cache folder); ``machine`` (the one description of
this machine: cache records, epoch records, benchmark files); ``host_memory`` (the CPU allocator
policy); ``timing`` (the one timing primitive every measurement uses); ``bench`` (the benchmark
harness and ``attncnn bench``). The training package never imports this one: it calls the chooser
it is handed.
"""

from .machine import cpu_name, device_name, epoch_machine, machine_info, machine_record, resolve_device
from .plan import make_plan, plan_device, resume_plan
from .precision import PRECISIONS, fast_bf16, machine_precision, resolve_precision, running_at, slow_bf16_reason

__all__ = ["make_plan", "resume_plan", "plan_device", "resolve_device", "cpu_name", "device_name", "machine_record",
           "machine_info", "epoch_machine", "PRECISIONS", "fast_bf16", "slow_bf16_reason", "resolve_precision",
           "machine_precision", "running_at"]
