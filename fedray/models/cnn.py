"""Small convolutional network, plus the shape rule shared by the image models."""

from __future__ import annotations

from torch import nn

from fedray.models.geometry import image_shape


def unflatten_if_flat(input_shape: tuple[int, ...], image: tuple[int, int, int]) -> list[nn.Module]:
    """A layer reshaping flat ``(B, D)`` batches to ``(B, C, H, W)``, or nothing for images."""
    return [nn.Unflatten(1, image)] if len(input_shape) == 1 else []


def cnn(input_shape: tuple[int, ...], num_classes: int, *, channels: tuple[int, ...] = (32, 64),
        hidden: int = 128) -> nn.Module:
    """Small CNN: per channel count a 3x3 conv + ReLU + 2x2 max-pool, then a 2-layer classifier.

    The pool is skipped once it would shrink the feature map below 2x2, so small inputs work.
    """
    c, h, w = image_shape(input_shape, "cnn")
    layers = unflatten_if_flat(input_shape, (c, h, w))
    for out in channels:
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU()]
        if min(h, w) // 2 >= 2:
            layers.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
        c = out
    layers += [nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(),
               nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)


def leaf_cnn(input_shape: tuple[int, ...], num_classes: int, *, dense: int = 2048
             ) -> nn.Module:
    """LEAF's FEMNIST CNN (Caldas et al. 2018; ``models/femnist/cnn.py`` of the LEAF
    repository): two 5×5 'same' convolutions of 32 and 64 channels, each with ReLU and a 2×2
    max-pool, a dense layer of ``dense`` units with ReLU, and the classifier. On 28×28 grey
    images with 62 classes: 6,603,710 parameters."""
    c, h, w = image_shape(input_shape, "leaf_cnn")
    layers = unflatten_if_flat(input_shape, (c, h, w))
    for out in (32, 64):
        layers += [nn.Conv2d(c, out, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2)]
        c, h, w = out, h // 2, w // 2
    layers += [nn.Flatten(), nn.Linear(c * h * w, dense), nn.ReLU(),
               nn.Linear(dense, num_classes)]
    return nn.Sequential(*layers)


def pfl_cnn(input_shape: tuple[int, ...], num_classes: int, *, dense: int = 128) -> nn.Module:
    """pfl-research's CIFAR-10 CNN (``benchmarks/model/pytorch/cnn.py: simple_cnn`` of
    apple/pfl-research): two 3×3 'valid' convolutions of 32 and 64 channels with ReLU, one
    2×2 max-pool, dropout 0.25, a dense layer of ``dense`` units with ReLU, dropout 0.5 and
    the classifier; weights Glorot-uniform (biases PyTorch's default), as pfl does to match
    its TF2 model. Inputs are channels-first here (pfl transposes HWC batches). On 32×32×3
    images with 10 classes: 1,626,442 parameters."""
    c, h, w = image_shape(input_shape, "pfl_cnn")
    if min(h, w) < 6:
        raise ValueError(f"pfl_cnn needs images of at least 6x6 (two 3x3 convolutions and a "
                         f"2x2 pool), got {h}x{w}")
    layers = unflatten_if_flat(input_shape, (c, h, w))
    layers += [nn.Conv2d(c, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
               nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
               nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), dense), nn.ReLU(),
               nn.Dropout(0.5), nn.Linear(dense, num_classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.xavier_uniform_(m.weight)
    return model
