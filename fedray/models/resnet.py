"""CIFAR-style ResNet-18/34 with GroupNorm, for federated training without batch statistics.

GroupNorm replaces BatchNorm because running batch statistics do not average well across
clients with different data. The stem is a 3x3 stride-1 conv without max-pool (CIFAR variant).
"""

from __future__ import annotations

import torch
from torch import nn

from fedray.models.cnn import image_shape, unflatten_if_flat
from fedray.models.geometry import RESNET_BLOCKS


def group_norm(channels: int, groups: int = 8) -> nn.GroupNorm:
    """GroupNorm with ``groups`` groups, halved until it divides ``channels`` (the DROD rule)."""
    while channels % groups:
        groups //= 2
    return nn.GroupNorm(groups, channels)


class BasicBlock(nn.Module):
    """Two 3x3 convs with GroupNorm and a residual; 1x1 conv + GN shortcut when shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, groups: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.norm1 = group_norm(out_channels, groups)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.norm2 = group_norm(out_channels, groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                group_norm(out_channels, groups),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def _resnet(input_shape: tuple[int, ...], num_classes: int, blocks: tuple[int, ...], width: int,
            groups: int, name: str) -> nn.Module:
    """Stem, four stages of BasicBlocks at widths ``width * (1, 2, 4, 8)``, pool, classifier."""
    c, h, w = image_shape(input_shape, name)
    layers = unflatten_if_flat(input_shape, (c, h, w))
    layers += [nn.Conv2d(c, width, 3, 1, padding=1, bias=False), group_norm(width, groups),
               nn.ReLU()]
    in_channels = width
    for stage, count in enumerate(blocks):
        out_channels = width * 2**stage
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(BasicBlock(in_channels, out_channels, stride, groups))
            in_channels = out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes)]
    return nn.Sequential(*layers)


def resnet18(input_shape: tuple[int, ...], num_classes: int, *, width: int = 64,
             groups: int = 8) -> nn.Module:
    """ResNet-18 (CIFAR stem, GroupNorm): BasicBlocks [2, 2, 2, 2]."""
    return _resnet(input_shape, num_classes, RESNET_BLOCKS["resnet18"], width, groups, "resnet18")


def resnet34(input_shape: tuple[int, ...], num_classes: int, *, width: int = 64,
             groups: int = 8) -> nn.Module:
    """ResNet-34 (CIFAR stem, GroupNorm): BasicBlocks [3, 4, 6, 3]."""
    return _resnet(input_shape, num_classes, RESNET_BLOCKS["resnet34"], width, groups, "resnet34")
