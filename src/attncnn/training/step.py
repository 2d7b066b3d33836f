"""One training step as ``attncnn train`` takes it: forward under the run's autocast, the loss in
float32, gradients cleared, backward, optimizer step. The loop, ``--measure-compile``
(:mod:`attncnn.perf.measure`) and ``attncnn bench`` call this one function, so what is timed is
what trains.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..layers.autocast_rules import autocast

__all__ = ["training_step"]


def training_step(net: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
                  images: torch.Tensor, labels: torch.Tensor, precision: str, *,
                  label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Take one step; returns ``(loss, logits)`` (float32 scalar; ``(B, classes)`` as computed).

    Args:
        net: the network (or its compiled or DDP wrapper) in training mode. optimizer: over its parameters.
        images: ``(B, C, H, W)`` float32 on the network's device. labels: ``(B,)`` class indices, or
            ``(B, classes)`` float32 targets (CutMix's labels mixed by area).
        precision: ``"fp32"`` or ``"bf16"`` (resolved).
        label_smoothing: the recipe's label smoothing (0: none).
    """
    with autocast(precision, images.device):
        logits = net(images)
    loss = F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)    # the loss in float32
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss, logits
