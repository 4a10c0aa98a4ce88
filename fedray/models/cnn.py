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
