"""Model registry: builders by name, their typed keyword arguments, and model profiling.

Every builder is ``builder(input_shape, num_classes, **kwargs) -> nn.Module`` with annotated
keyword-only arguments; the config system validates ``model.*`` keys against them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from fedray import registry
from fedray.models.cnn import cnn
from fedray.models.lstm import lstm
from fedray.models.mlp import mlp
from fedray.models.profile import count_flops, profile_model
from fedray.models.resnet import resnet18, resnet34
from fedray.models.sliceable import sliceable_resnet18, sliceable_resnet34

for _name, _builder in {
    "mlp": mlp,
    "cnn": cnn,
    "lstm": lstm,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "sliceable_resnet18": sliceable_resnet18,
    "sliceable_resnet34": sliceable_resnet34,
}.items():
    registry.register_model(_name)(_builder)
MODELS: dict[str, Callable[..., nn.Module]] = registry.MODELS

__all__ = ["MODELS", "build_model", "count_flops", "get_model_builder", "list_models",
           "profile_model"]


def get_model_builder(name: str, path: str = "model.name") -> Callable[..., nn.Module]:
    """The builder registered as ``name``; a :class:`ConfigError` at ``path`` if unknown."""
    return registry.model_builder(name, path)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                **kwargs: Any) -> nn.Module:
    """Build the registered model ``name`` for inputs of ``input_shape`` (without batch)."""
    return get_model_builder(name)(tuple(input_shape), num_classes, **kwargs)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def list_models() -> list[dict[str, Any]]:
    """Name, one-line description and keyword defaults of every registered model."""
    out = []
    for name, builder in sorted(MODELS.items()):
        params = inspect.signature(builder).parameters.values()
        out.append({
            "name": name,
            "description": (inspect.getdoc(builder) or "").partition("\n")[0],
            "kwargs": {p.name: _jsonable(p.default) for p in params
                       if p.kind is p.KEYWORD_ONLY},
        })
    return out
