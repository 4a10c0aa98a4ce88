"""Multi-layer perceptron over the flattened input."""

from __future__ import annotations

import math
from typing import Literal

from torch import nn

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def mlp(input_shape: tuple[int, ...], num_classes: int, *, hidden: tuple[int, ...] = (256,),
        activation: Literal["relu", "tanh"] = "relu") -> nn.Module:
    """Fully connected network: flatten, one Linear + activation per hidden width, classifier."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"mlp activation must be one of {sorted(_ACTIVATIONS)}, "
                         f"got {activation!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for size in hidden:
        layers += [nn.Linear(width, size), _ACTIVATIONS[activation]()]
        width = size
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
