"""Test-set loss and accuracy of a model, summed over every process under DDP."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..data import DeviceLoader
from ..errors import InputError
from ..layers.autocast_rules import autocast
from .distributed import Distributed
from .progress import Progress

__all__ = ["EvalResult", "evaluate"]


@dataclass
class EvalResult:
    loss: float        #: mean cross-entropy (nats)
    accuracy: float    #: fraction of correct top-1 predictions
    examples: int
    seconds: float
    #: top-1 class of each example in the loader's order, ``(examples,)`` int64 on the CPU (only
    #: when asked for: ``evaluate(..., keep_predictions=True)``)
    predictions: torch.Tensor | None = None


@torch.no_grad()
def evaluate(model: nn.Module, loader: DeviceLoader, *, dist: Distributed | None = None,
             precision: str = "fp32", keep_predictions: bool = False, progress: bool = False) -> EvalResult:
    """Mean cross-entropy and top-1 accuracy over every example of ``loader`` (model in eval mode).

    Args:
        precision: ``"fp32"`` or ``"bf16"`` (autocast of the forward pass; the loss and the sums
            are float32/float64 either way). Resolve ``"auto"`` with :func:`resolve_precision`.
        model: the plain module (not the DDP wrapper: evaluation needs no gradient sync, and the
            shards may differ by one batch).
        dist: under DDP, the processes whose loaders together hold the test set (each example in
            exactly one shard); the sums are added over them, so every process gets the result over
            the whole set. ``EvalResult.seconds`` is this process's time.
        keep_predictions: also return each example's top-1 class (``EvalResult.predictions``);
            one process only.
        progress: show the pass's progress (:class:`~attncnn.training.progress.Progress`); off for
            the test passes inside training.

    Raises:
        InputError: ``loader`` sharded over a different number of processes than ``dist``, or
            ``keep_predictions`` under DDP (each process sees only its shard).
    """
    world = 1 if dist is None else dist.world_size
    if loader.world_size != world:
        raise InputError(f"the loader is sharded over {loader.world_size} process(es) but dist describes {world}; "
                         "pass the Distributed object of the process group the loader was made for")
    dist = dist or Distributed()
    if keep_predictions and dist.enabled:
        raise InputError("keep_predictions needs the whole test set in one process; evaluate without torchrun")
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    count = 0
    kept = []
    total = len(loader)
    with Progress(total, desc="test", enabled=progress and dist.is_main) as shown:
        for batch, (x, y) in enumerate(loader, start=1):
            with autocast(precision, device):
                logits = model(x)
            loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").double()
            predicted = logits.argmax(dim=-1)
            correct += (predicted == y).sum()
            count += y.numel()
            if keep_predictions:
                kept.append(predicted.to("cpu", torch.int64))
            shown.show(batch, lambda seconds: {"img_s": f"{count / seconds:.0f}"},
                       lambda seconds: f"test  batch {batch}/{total} ({100 * batch // total} %)  {count:,} images  "
                                       f"accuracy so far {correct.item() / count:.4f}  {count / seconds:.0f} img/s")
    model.train(was_training)
    if dist.enabled:
        total = dist.sum(torch.stack([loss_sum, correct.double(), loss_sum.new_tensor(float(count))]))
        loss_sum, correct, count = total[0], total[1], int(total[2].item())
    return EvalResult(loss=loss_sum.item() / max(count, 1), accuracy=correct.item() / max(count, 1),
                      examples=count, seconds=time.perf_counter() - start,
                      predictions=(torch.cat(kept) if kept else torch.zeros(0, dtype=torch.int64))
                      if keep_predictions else None)
