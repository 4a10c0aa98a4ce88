"""Classifier heads for fine-tuning from a shared base (FLITE §3.5): the last ``nn.Linear``
initialised orthogonally and frozen (the paper's choice: a fixed, well-conditioned set of
class prototypes that costs no communication), Kaiming-initialised and frozen (ablation),
or left trainable."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fedray.core.seeding import derive_seed

HeadMode = Literal["orthogonal", "kaiming", "trainable"]


def classifier(model: nn.Module) -> nn.Linear:
    """The model's classifier: its last ``nn.Linear``."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear classifier")
    return linears[-1]


def configure_head(model: nn.Module, mode: HeadMode, seed: int) -> nn.Module:
    """Initialise (seeded) and freeze the classifier for ``orthogonal``/``kaiming``;
    ``trainable`` leaves it as built. Returns the model."""
    if mode == "trainable":
        return model
    head = classifier(model)
    g = torch.Generator().manual_seed(derive_seed(seed, -1, -1, f"head-{mode}"))
    with torch.no_grad():
        if mode == "orthogonal":
            nn.init.orthogonal_(head.weight, generator=g)
        else:
            nn.init.kaiming_uniform_(head.weight, a=5 ** 0.5, generator=g)
        if head.bias is not None:
            head.bias.zero_()
    head.requires_grad_(False)
    return model


def head_parameter_names(model: nn.Module) -> list[str]:
    """Names of the classifier's parameters in ``model.state_dict()``."""
    head = classifier(model)
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for p in head.parameters()]
