"""Data-parallel training with PyTorch's own engine (DistributedDataParallel under torchrun).

``torchrun --nproc_per_node=N -m attncnn train ...`` starts N processes with the environment
variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; multi-node runs use
torchrun's rendezvous options. Each rank holds the whole dataset on its device and takes its
shard of every global batch (see :class:`attncnn.data.DeviceLoader`), so ``--batch-size`` is the
global batch and the learning rate is the one for that global batch: the run follows the same
trajectory as one process with the same global batch (up to floating-point summation order and
per-rank dropout masks). Only rank 0 writes the run folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistContext", "init_distributed", "all_reduce_sum", "shutdown_distributed"]


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that writes files and logs."""
        return self.rank == 0


def init_distributed(device: torch.device) -> tuple[DistContext, torch.device]:
    """Join the process group described by torchrun's environment, if there is one.

    Uses NCCL on CUDA and gloo on CPU. On CUDA each process takes ``cuda:LOCAL_RANK``.

    Returns:
        ``(context, device)`` with the device this rank must use.

    Raises:
        ValueError: WORLD_SIZE set without RANK (not started by torchrun).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(), device
    if "RANK" not in os.environ:
        raise ValueError("WORLD_SIZE is set but RANK is not: start distributed runs with torchrun")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank), device


def all_reduce_sum(*tensors: torch.Tensor) -> None:
    """Sum tensors over all ranks in place (no-op without a process group)."""
    if dist.is_available() and dist.is_initialized():
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
