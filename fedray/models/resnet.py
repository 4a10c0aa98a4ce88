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


IMAGENET_MEAN = (0.485, 0.456, 0.406)  # pfl-research's FLAIR default channel statistics
IMAGENET_STD = (0.229, 0.224, 0.225)


class _Normalized(nn.Module):
    """Inputs in [0, 1] normalised per channel by fixed constants (no parameters, no
    buffers: nothing to average or ship) before ``body``."""

    def __init__(self, body: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.body, self.mean, self.std = body, mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return self.body((x - mean) / std)


def flair_resnet18(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """pfl-research's FLAIR model (``benchmarks/model/pytorch/cnn.py``'s ``multi_label_cnn``
    without ImageNet weights): torchvision's ResNet-18 (ImageNet stem: 7×7 stride-2 conv and
    max-pool) with ``num_classes`` logits, every BatchNorm replaced by GroupNorm(min(32,
    C), C) as its ``convert_batchnorm_modules`` does, inputs normalised by ImageNet's
    channel mean and std (its default ``channel_mean``). 11,185,233 parameters at FLAIR's
    17 labels. pfl's random 224-pixel crops and flips are not applied (the forward pass
    stays deterministic, so a cohort of clients can be batched). Its start is drawn as every
    fedray model's is (each layer's ``reset_parameters`` under the run's seed: PyTorch's
    Kaiming-uniform defaults, not torchvision's Kaiming-normal fan-out draw)."""
    import torchvision

    c, h, w = image_shape(input_shape, "flair_resnet18")
    if c != 3:
        raise ValueError(f"flair_resnet18 takes RGB images (3 channels), got {input_shape}")
    body = torchvision.models.resnet18(num_classes=num_classes)
    for name, m in list(body.named_modules()):
        if isinstance(m, nn.BatchNorm2d):
            parent = body.get_submodule(name.rpartition(".")[0]) if "." in name else body
            setattr(parent, name.rpartition(".")[2],
                    nn.GroupNorm(min(32, m.num_features), m.num_features, affine=True))
    layers = unflatten_if_flat(input_shape, (c, h, w))
    model = _Normalized(body, IMAGENET_MEAN, IMAGENET_STD)
    return nn.Sequential(*layers, model) if layers else model


flair_resnet18.channels = 3  # RGB only (its normalisation has three channel statistics)
