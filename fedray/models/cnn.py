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
