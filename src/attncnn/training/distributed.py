"""Data-parallel training with PyTorch DDP when the process was started by ``torchrun``
(user guide: docs/distributed.md).

``torchrun`` gives each process ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; :func:`launch_from_env`
reads them; without them nothing here creates a process group and training is single-process.

The rules the training loop follows under DDP (see :mod:`attncnn.training.loop`):

* ``batch_size`` is the *global* batch (the paper's 100): each of the W processes trains on
  ``batch_size / W`` examples per step (:func:`per_process_batch`) and DDP averages the gradients,
  so one step is the same SGD step as one process with the whole batch.
* Only rank 0 writes files (:class:`~attncnn.runs.main_process_folder.MainProcessRunFolder`); each
  write is followed by a collective in which rank 0 reports success, so a failed write stops every
  process at the same point.
* Stop requests and NaN losses are agreed with a collective at points every process reaches in the
  same order (:meth:`Distributed.max_int`, :meth:`Distributed.all_gather`): a signal is honoured
  within ``loop.SYNC_EVERY`` steps (torchrun's ``--shutdown-timeout``, 30 s by default, must cover
  them).
* Each process draws its own dropout masks: ranks > 0 reseed torch's generator from ``(seed, rank)``
  after the (identical) weight initialisation;
  checkpoints carry every rank's generator state (:mod:`attncnn.training.rng`).

NCCL is used on CUDA (each process on ``cuda:LOCAL_RANK``), gloo on CPU. Limits: a process that
dies outside the agreement points leaves the others in a collective until torchrun stops them;
BatchNorm (ResNet18) normalises per process (no SyncBatchNorm), so its runs are not the one-process
computation (the attention models use LayerNorm only); every process keeps the training
split on its device and must see the run folder; every parameter must get a gradient each step (no
``find_unused_parameters``); a resume with another process count needs the same steps per epoch
(training images divisible by both counts), and ranks without a saved generator state start a fresh
dropout stream, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, TypeVar

import torch
import torch.distributed as torch_dist
from torch import nn

from ..errors import InputError
from ..runs.errors import RunFolderError

__all__ = ["Launch", "Distributed", "launch_from_env", "rank_device", "per_process_batch", "process_group",
           "processes", "is_main_process"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Launch:
    """Where ``torchrun`` placed this process."""

    rank: int          #: 0 ... world_size - 1 over all nodes
    local_rank: int    #: index on this node (selects the GPU)
    world_size: int    #: number of processes in the job


def _env_int(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name)
    if raw is None:
        raise InputError(f"WORLD_SIZE={environ['WORLD_SIZE']} is set but {name} is not; start distributed "
                         "training with torchrun (it sets WORLD_SIZE, RANK and LOCAL_RANK), or unset WORLD_SIZE "
                         "for a single-process run")
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {name}={raw!r} is not an integer; start distributed training "
                         "with torchrun, which sets it") from None


def launch_from_env(environ: Mapping[str, str] | None = None) -> Launch | None:
    """This process's :class:`Launch` from torchrun's variables, or ``None`` for a single process
    (``WORLD_SIZE`` unset or ``1``: no process group is created).

    Raises:
        InputError: ``WORLD_SIZE`` > 1 with ``RANK``/``LOCAL_RANK`` missing, not integers or out of
            range (the message names the variable).
    """
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:
        return None
    world_size = _env_int(environ, "WORLD_SIZE")
    if world_size < 1:
        raise InputError(f"WORLD_SIZE must be at least 1, got {world_size}")
    if world_size == 1:
        return None
    rank, local_rank = _env_int(environ, "RANK"), _env_int(environ, "LOCAL_RANK")
    if not 0 <= rank < world_size or local_rank < 0:
        raise InputError(f"RANK={rank} / LOCAL_RANK={local_rank} do not fit WORLD_SIZE={world_size}; "
                         "start distributed training with torchrun")
    return Launch(rank=rank, local_rank=local_rank, world_size=world_size)


def is_main_process(environ: Mapping[str, str] | None = None) -> bool:
    """True unless torchrun started this process with ``RANK`` > 0 (for the CLI's final prints)."""
    launch = launch_from_env(environ)
    return launch is None or launch.rank == 0


def rank_device(name: str, local_rank: int) -> torch.device:
    """The device of the process with ``local_rank`` for the ``--device`` value ``name``.

    ``"auto"`` and ``"cuda"`` give ``cuda:LOCAL_RANK`` (``"auto"`` falls back to CPU without
    CUDA); ``"cpu"`` gives CPU (every process on the CPU, gloo backend).

    Raises:
        InputError: a single GPU named (``cuda:1``), CUDA requested but missing, fewer visible GPUs
            than processes on the node, or a device type DDP is not set up for here.
    """
    if name == "cpu":
        return torch.device("cpu")
    if name in ("auto", "cuda"):
        if not torch.cuda.is_available():
            if name == "cuda":
                raise InputError("device 'cuda' requested but CUDA is not available; use --device cpu")
            return torch.device("cpu")
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise InputError(f"process LOCAL_RANK={local_rank} needs GPU {local_rank} but only {count} GPU(s) are "
                             f"visible; start at most {count} processes per node (torchrun --nproc_per_node {count})")
        return torch.device("cuda", local_rank)
    device = torch.device(name)
    if device.type == "cuda":
        raise InputError(f"--device {name} names one GPU, but under torchrun each process uses cuda:LOCAL_RANK; pass "
                         "--device cuda (or auto) and choose the GPUs with CUDA_VISIBLE_DEVICES")
    raise InputError(f"device {name!r} is not supported for distributed training; use cpu, cuda or auto")


def per_process_batch(global_batch: int, world_size: int) -> int:
    """``global_batch / world_size``: the examples each process trains on per step.

    Raises:
        InputError: ``global_batch`` not divisible by ``world_size`` (the message gives the nearest
            valid sizes).
    """
    if global_batch % world_size:
        lower = global_batch - global_batch % world_size
        valid = ", ".join(str(v) for v in (lower, lower + world_size) if v > 0)
        raise InputError(f"--batch-size {global_batch} is the global batch and must split evenly over the "
                         f"{world_size} processes; use a multiple of {world_size} (e.g. {valid}) or start a "
                         "number of processes that divides it")
    return global_batch // world_size


class Distributed:
    """This process's place in the job and the few collectives the training loop needs.

    With ``world_size == 1`` (no process group) every method is local and costs nothing, so the
    loop runs the same code with or without DDP. Collectives must be called by every process
    in the same order; their tensors live on ``device`` (NCCL needs CUDA tensors).

    Args:
        rank, world_size, local_rank: see :class:`Launch`.
        device: this process's training device.
    """

    def __init__(self, *, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 device: torch.device | str = "cpu") -> None:
        self.rank, self.world_size, self.local_rank = int(rank), int(world_size), int(local_rank)
        self.device = torch.device(device)

    @property
    def enabled(self) -> bool:
        """More than one process (a process group exists)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and shows progress."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"Distributed(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    # -- collectives (every process, same order) ----------------------------------------------

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over the processes (a new tensor on ``values``' device)."""
        if not self.enabled:
            return values.clone()
        out = values.detach().to(self.device, copy=True)
        torch_dist.all_reduce(out, op=torch_dist.ReduceOp.SUM)
        return out.to(values.device)

    def max_int(self, value: int) -> int:
        """The largest ``value`` over the processes (one host sync under DDP)."""
        if not self.enabled:
            return int(value)
        t = torch.tensor(int(value), dtype=torch.int64, device=self.device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return int(t.item())

    def all_gather(self, value: torch.Tensor) -> list[torch.Tensor]:
        """Every process's ``value`` (same shape and dtype everywhere), indexed by rank, on ``value``'s device."""
        if not self.enabled:
            return [value.clone()]
        local = value.detach().to(self.device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        torch_dist.all_gather(parts, local)
        return [p.to(value.device) for p in parts]

    def on_main(self, fn: Callable[[], T], what: str, error: type[Exception] = RunFolderError) -> T | None:
        """Run ``fn`` on rank 0 only; every process learns whether it failed.

        Returns ``fn()`` on rank 0 and ``None`` elsewhere. It is also a barrier: no process
        returns before rank 0 has finished ``fn``.

        Raises:
            Exception: on rank 0, whatever ``fn`` raised.
            error: on the other ranks, when ``fn`` failed on rank 0 (whose own message says why).
        """
        if not self.enabled:
            return fn()
        result, failure = None, None
        if self.is_main:
            try:
                result = fn()
            except Exception as err:     # reported to the others first, re-raised below
                failure = err
        if self.max_int(failure is not None):
            if failure is not None:
                raise failure
            raise error(f"rank 0 failed to {what} (its error message says why); rank {self.rank} stops with it")
        return result

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in :class:`~torch.nn.parallel.DistributedDataParallel` (a collective: it broadcasts
        rank 0's weights and buffers), or ``model`` itself for one process."""
        if not self.enabled:
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


@contextlib.contextmanager
def process_group(launch: Launch, device: torch.device) -> Iterator[Distributed]:
    """Create the default process group for ``launch`` (NCCL on CUDA, gloo on CPU), yield its
    :class:`Distributed`, and destroy the group on the way out, also after an error. An existing group
    is used as it is and left alone. While the block runs, ranks > 0 log only warnings and errors.

    Raises:
        InputError: an existing group whose size or rank differs from ``launch``.
    """
    owned = not torch_dist.is_initialized()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if owned:
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        torch_dist.init_process_group(backend=backend, rank=launch.rank, world_size=launch.world_size, **kwargs)
    elif (torch_dist.get_world_size(), torch_dist.get_rank()) != (launch.world_size, launch.rank):
        raise InputError(f"a process group of size {torch_dist.get_world_size()} (rank {torch_dist.get_rank()}) "
                         f"already exists, but the environment says WORLD_SIZE={launch.world_size}, "
                         f"RANK={launch.rank}")
    package_log = logging.getLogger("attncnn")
    level = package_log.level
    if launch.rank:
        package_log.setLevel(max(logging.WARNING, level))
    try:
        log.info("DDP: %d processes, backend %s, rank %d on %s", launch.world_size, torch_dist.get_backend(),
                 launch.rank, device)
        yield Distributed(rank=launch.rank, world_size=launch.world_size, local_rank=launch.local_rank,
                          device=device)
    finally:
        package_log.setLevel(level)
        if owned:
            torch_dist.destroy_process_group()


def processes(launch: Launch | None, device: torch.device) -> contextlib.AbstractContextManager[Distributed]:
    """:func:`process_group` under torchrun (``launch`` from :func:`launch_from_env`), or the
    single-process :class:`Distributed` on ``device`` (no group, every collective is local)."""
    if launch is None:
        return contextlib.nullcontext(Distributed(device=device))
    return process_group(launch, device)
