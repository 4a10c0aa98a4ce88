"""A fedray model plugin: a small Transformer encoder over feature tokens (each input feature
one token), registered as ``model.name=feature_transformer``. Installed, the
``fedray.plugins`` entry point imports this module and ``@register_model`` makes the name
known to every fedray command, its keyword arguments ``model.*`` keys checked when a config
loads.

fedray draws a model's start from the run's seed by running each module's own initialiser
on emptied storage, and refuses a parameter none writes. ``nn.Linear``, ``nn.LayerNorm``
and ``nn.MultiheadAttention`` (whose initialiser is the private ``_reset_parameters``)
bring theirs; the learned positional table here is this module's own parameter, so the
module writes it in its ``reset_parameters``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedray.core.registry import register_model


class FeatureTransformer(nn.Module):
    """Embed each feature as a token, add a learned position, encode, average, classify."""

    def __init__(self, features: int, num_classes: int, width: int, heads: int, layers: int):
        super().__init__()
        self.embed = nn.Linear(1, width)
        self.position = nn.Parameter(torch.empty(features, width))
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.position, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.flatten(1)[..., None]) + self.position
        return self.head(self.encoder(tokens).mean(1))


@register_model("feature_transformer")
def feature_transformer(input_shape: tuple[int, ...], num_classes: int, *, width: int = 16,
                        heads: int = 2, layers: int = 2) -> nn.Module:
    """A Transformer encoder over feature tokens (one token per input feature)."""
    return FeatureTransformer(math.prod(input_shape), num_classes, width, heads, layers)
