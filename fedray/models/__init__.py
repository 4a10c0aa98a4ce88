"""Model registry: builders by name, their typed keyword arguments, and model profiling.

Every builder is ``builder(input_shape, num_classes, **kwargs) -> nn.Module`` with annotated
keyword-only arguments; the config system validates ``model.*`` keys against them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fedray.core import registry

# name -> "module:builder": imported when first looked up, so importing fedray.models (and
# its torch-free geometry) does not load torch
for _name, _target in {
    "mlp": "fedray.models.mlp:mlp",
    "cnn": "fedray.models.cnn:cnn",
    "leaf_cnn": "fedray.models.cnn:leaf_cnn",
    "pfl_cnn": "fedray.models.cnn:pfl_cnn",
    "lstm": "fedray.models.lstm:lstm",
    "char_lstm": "fedray.models.lstm:char_lstm",
    "next_char_lstm": "fedray.models.lstm:next_char_lstm",
    "word_lstm": "fedray.models.lstm:word_lstm",
    "sent140_lstm": "fedray.models.lstm:sent140_lstm",
    "resnet18": "fedray.models.resnet:resnet18",
    "resnet34": "fedray.models.resnet:resnet34",
    "flair_resnet18": "fedray.models.resnet:flair_resnet18",
    "sliceable_resnet18": "fedray.models.sliceable:sliceable_resnet18",
    "sliceable_resnet34": "fedray.models.sliceable:sliceable_resnet34",
}.items():
    registry.register_model(_name)(_target)
MODELS = registry.MODELS

__all__ = ["MODELS", "build_configured", "build_model", "count_flops", "get_model_builder",
           "list_models", "profile_model"]


def __getattr__(name: str) -> Any:  # the torch-side helpers, on first use
    if name in ("count_flops", "profile_model"):
        from fedray.models import profile

        return getattr(profile, name)
    raise AttributeError(f"module 'fedray.models' has no attribute {name!r}")


def get_model_builder(name: str, path: str = "model.name") -> Callable[..., Any]:
    """The builder registered as ``name``; a :class:`ConfigError` at ``path`` if unknown."""
    return registry.model_builder(name, path)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                **kwargs: Any) -> Any:
    """Build the registered model ``name`` for inputs of ``input_shape`` (without batch)."""
    return get_model_builder(name)(tuple(input_shape), num_classes, **kwargs)


def build_configured(model_cfg: dict[str, Any], input_shape: tuple[int, ...],
                     num_classes: int) -> Any:
    """Build the model a config's ``model`` section names (``name`` plus its keyword
    arguments) for inputs of ``input_shape``."""
    kwargs = {k: v for k, v in model_cfg.items() if k != "name"}
    return build_model(model_cfg["name"], input_shape, num_classes, **kwargs)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def list_models() -> list[dict[str, Any]]:
    """Name, one-line description and keyword defaults of every registered model."""
    out = []
    for name in sorted(MODELS):
        builder = get_model_builder(name)
        params = inspect.signature(builder).parameters.values()
        out.append({
            "name": name,
            "description": (inspect.getdoc(builder) or "").partition("\n")[0],
            "kwargs": {p.name: _jsonable(p.default) for p in params
                       if p.kind is p.KEYWORD_ONLY},
        })
    return out
