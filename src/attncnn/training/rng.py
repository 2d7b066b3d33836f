"""Random-number state of every process: seeding, and capture/restore through checkpoints.

* dropout draws from torch's default generators: their states are saved in every checkpoint, for
  every process, as ``rng.rank{r}.torch_cpu`` and ``rng.rank{r}.torch_cuda``;
* the batch order and the augmentation come from a generator rebuilt from ``(seed, epoch)``
  (:func:`attncnn.data.epoch_generator`): nothing to save;
* Python's ``random`` and NumPy's global generator are used by nothing in attncnn: code that draws
  from them must add them here, or a resumed run will differ from an uninterrupted one.

Every process starts from ``seed`` (the same initial weights); after the model is built, ranks > 0
switch to a stream of their own (:func:`rank_seed`) so that their dropout masks differ, while rank 0
keeps the single-process stream.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Mapping

import torch

from .distributed import Distributed

__all__ = ["rank_seed", "seed_rank_stream", "capture_rng", "restore_rng"]

log = logging.getLogger(__name__)


def rank_seed(seed: int, rank: int, *position: int) -> int:
    """A 63-bit seed for rank ``rank``'s dropout stream, a pure function of its arguments
    (``position``, e.g. ``(epoch, step)``, starts a fresh stream at a resume point)."""
    text = "\0".join(str(int(v)) for v in (seed, rank, *position))
    digest = hashlib.sha256(f"attncnn-rank\0{text}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_rank_stream(seed: int, dist: Distributed) -> None:
    """After the (identical) weight initialisation: ranks > 0 draw their own dropout masks from
    here on; rank 0 keeps the single-process stream, so one process is unaffected."""
    if dist.rank:
        torch.manual_seed(rank_seed(seed, dist.rank))


def _own_states(dist: Distributed) -> dict[str, torch.Tensor]:
    states = {"torch_cpu": torch.get_rng_state()}
    if dist.device.type == "cuda":
        states["torch_cuda"] = torch.cuda.get_rng_state(dist.device)
    return states


def capture_rng(dist: Distributed) -> dict[str, torch.Tensor]:
    """Collective: every process's generator states as checkpoint tensors (uint8, CPU) keyed
    ``rng.rank{r}.<generator>``; every process returns all of them."""
    out = {}
    for name, state in _own_states(dist).items():
        for rank, value in enumerate(dist.all_gather(state)):
            out[f"rng.rank{rank}.{name}"] = value.cpu()
    return out


def restore_rng(dist: Distributed, tensors: Mapping[str, torch.Tensor], seed: int, epoch: int, step: int) -> None:
    """Restore this process's generator states from a checkpoint's tensors. Where the checkpoint has
    none for this rank (written by fewer processes), this rank starts a fresh stream from
    ``(seed, rank, epoch, step)`` and says so: the run is then no longer bit-identical."""
    keys = {name: f"rng.rank{dist.rank}.{name}" for name in _own_states(dist)}
    if all(key in tensors for key in keys.values()):
        torch.set_rng_state(tensors[keys["torch_cpu"]].cpu())
        if "torch_cuda" in keys:
            torch.cuda.set_rng_state(tensors[keys["torch_cuda"]].cpu(), dist.device)
        return
    log.warning("the checkpoint holds no random-generator state for rank %d (written by fewer processes or an "
                "older version): its dropout masks start a new stream", dist.rank)
    torch.manual_seed(rank_seed(seed, dist.rank, epoch, step))
