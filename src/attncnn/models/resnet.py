"""CIFAR ResNet18, the paper's convolutional baseline (reference ``runs/resnet``; kuangliu/pytorch-cifar layout).

3x3 stem with 64 channels and stride 1, no max-pool; four stages of two basic blocks with
64/128/256/512 channels and strides 1/2/2/2 (1x1 conv + BN shortcut when the shape changes);
global average pooling; Linear 512 -> classes. 11,173,962 parameters for 10 classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError

__all__ = ["ResNetConfig", "BasicBlock", "ResNet"]


@dataclass
class ResNetConfig:
    """Shape of a CIFAR ResNet; defaults give ResNet18."""

    blocks: tuple[int, ...] = (2, 2, 2, 2)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    in_chans: int = 3
    num_classes: int = 10

    def __post_init__(self) -> None:
        self.blocks, self.widths = tuple(self.blocks), tuple(self.widths)
        if len(self.blocks) != len(self.widths):
            raise InputError(f"blocks {self.blocks} and widths {self.widths} must have the same length")


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection: ``(B, C_in, H, W) -> (B, C, H/s, W/s)``."""

    def __init__(self, in_chans: int, chans: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, chans, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(chans)
        self.conv2 = nn.Conv2d(chans, chans, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(chans)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_chans != chans:
            self.shortcut = nn.Sequential(nn.Conv2d(in_chans, chans, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(chans))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet: normalised images ``(B, C, H, W)`` -> logits ``(B, classes)``."""

    #: architecture name stored in checkpoints (key of ``attncnn.models.ARCHITECTURES``)
    arch = "resnet"

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.config = config
        first = config.widths[0]
        self.conv1 = nn.Conv2d(config.in_chans, first, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(first)
        stages, chans = [], first
        for i, (n, width) in enumerate(zip(config.blocks, config.widths)):
            layers = []
            for j in range(n):
                layers.append(BasicBlock(chans, width, stride=2 if (i > 0 and j == 0) else 1))
                chans = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(chans, config.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] != self.config.in_chans:
            raise InputError(f"expected normalised images of shape (B, {self.config.in_chans}, H, W), "
                             f"got {tuple(images.shape)}")
        x = F.relu(self.bn1(self.conv1(images)))
        x = self.stages(x)
        # The reference uses a 4x4 average pool on 32x32 inputs; a global mean is the same
        # there and also works for other image sizes.
        return self.head(x.mean(dim=(2, 3)))

    def no_weight_decay(self) -> set[str]:
        return set()
