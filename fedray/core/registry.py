"""Where the plugins are found: methods, model builders, datasets and the config sections a
method adds (codecs and transforms register in :mod:`fedray.wire`, server optimizers in
:mod:`fedray.services.server_opt`).

Ground floor: imports nothing of fedray but :mod:`fedray.core.spec`. A method package registers
itself with :func:`register_method` (a class decorator) when it is imported; a package that
needs more configuration than its ``algorithm.*`` parameters (DROD's ``continual`` task
stream) adds a top-level section with :func:`register_section`. :func:`discover` imports
every package under ``fedray/methods/`` and every entry point of the ``fedray.plugins``
group, so a new method — built in or installed from elsewhere — needs no edit anywhere
else. Lookups (:func:`method`, :func:`model_builder`, :func:`sections`) discover first.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

from fedray.core.spec import ConfigError, build_dataclass

METHODS: dict[str, type] = {}
MODELS: dict[str, Callable[..., Any]] = {}
DEFAULT_METHOD = "fedavg"  # the method of a config that names none
DATASETS: dict[str, Any] = {}
SECTIONS: dict[str, type] = {}
COMMANDS: dict[str, Any] = {}
PLUGIN_GROUP = "fedray.plugins"
RESERVED_SECTIONS = {"name", "seed", "rounds", "run_dir", "data", "clients", "model",
                     "algorithm", "local", "payload", "eval", "runtime", "pretrain", "sections",
                     "sweep", "fleet", "dp", "tracking"}
BUILTIN = ("fedray.models", "fedray.data", "fedray.services.secure_round")
_discovered = False


def register_method(cls: type) -> type:
    """Class decorator: make ``cls`` (an ``Algorithm`` with ``name`` and ``Params``) the
    method called ``cls.name``. Two packages claiming one name is an error."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} needs its own class attribute `name`")
    if METHODS.get(name, cls) is not cls:
        raise TypeError(f"method name {name!r} is taken by {METHODS[name].__module__}")
    METHODS[name] = cls
    return cls


def register_model(name: str) -> Callable[[Any], Any]:
    """Decorator: register ``builder(input_shape, num_classes, **kwargs) -> nn.Module``, or
    its ``"module:function"`` path (imported on first lookup: registering loads no torch)."""
    def add(builder: Any) -> Any:
        MODELS[name] = builder
        return builder
    return add


def register_dataset(entry: Any) -> Any:
    """Make ``entry`` (a :class:`fedray.data.catalog.DatasetEntry`: how the data is built,
    its input shape, its config checks) the ``data.dataset`` called ``entry.name``; two
    claiming one name is an error."""
    if DATASETS.get(entry.name, entry) is not entry:
        raise TypeError(f"dataset {entry.name!r} is taken")
    DATASETS[entry.name] = entry
    return entry


def dataset(name: Any, path: str = "data.dataset") -> Any:
    """The dataset registered as ``name``; a :class:`ConfigError` at ``path`` if unknown."""
    discover()
    if not isinstance(name, str) or name not in DATASETS:
        raise ConfigError(path, name, "one of " + ", ".join(repr(n) for n in DATASETS))
    return DATASETS[name]


def datasets() -> dict[str, Any]:
    discover()
    return dict(DATASETS)


def register_section(name: str, cls: type) -> type:
    """Add the top-level config section ``name`` (a dataclass of :func:`fedray.core.spec.spec`
    fields; an optional ``validate(self, cfg)`` runs on every loaded config)."""
    if SECTIONS.get(name, cls) is not cls or name in RESERVED_SECTIONS:
        raise TypeError(f"config section {name!r} is taken")
    SECTIONS[name] = cls
    return cls


def register_command(name: str, app: Any) -> Any:
    """Add a ``typer.Typer`` as ``fedray NAME ...`` (a method's own tools); returns it."""
    if COMMANDS.get(name, app) is not app:
        raise TypeError(f"command {name!r} is taken")
    COMMANDS[name] = app
    return app


def discover() -> None:
    """Import the built-in plugin packages and the installed ``fedray.plugins`` entry points
    (once per process)."""
    global _discovered
    if _discovered:
        return
    for module in BUILTIN:
        importlib.import_module(module)
    methods_pkg = importlib.import_module("fedray.methods")
    for info in pkgutil.iter_modules(methods_pkg.__path__):
        if info.ispkg:
            importlib.import_module(f"fedray.methods.{info.name}")
    _discovered = True  # the built-ins are all in: a broken plugin below leaves them usable
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 — one bad install must not break fedray
            print(f"fedray: plugin {ep.name!r} ({ep.value}) failed to load and is skipped: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)


def method_of(cfg: Any) -> type:
    """The method class a config names (``algorithm.name``, :data:`DEFAULT_METHOD` when it
    names none: a section validated before the config is completed)."""
    return method(cfg.algorithm.get("name", DEFAULT_METHOD))


def method(name: Any, path: str = "algorithm.name") -> type:
    """The method registered as ``name``; a :class:`ConfigError` at ``path`` if unknown."""
    discover()
    if not isinstance(name, str) or name not in METHODS:
        raise ConfigError(path, name, "one of " + ", ".join(sorted(METHODS)))
    return METHODS[name]


def methods() -> dict[str, type]:
    discover()
    return dict(sorted(METHODS.items()))


def models() -> list[str]:
    """The registered model names, sorted (plugins' included)."""
    discover()
    return sorted(MODELS)


def model_entry(name: Any, path: str = "model.name") -> Any:
    """What ``name`` is registered as, not imported: a builder or its ``"module:function"``
    path (its keywords are read from the source: checking a config loads no torch)."""
    discover()
    if not isinstance(name, str) or name not in MODELS:
        raise ConfigError(path, name, "one of " + ", ".join(sorted(MODELS)))
    return MODELS[name]


def model_builder(name: Any, path: str = "model.name") -> Callable[..., Any]:
    """The model builder registered as ``name`` (imported on first use); a
    :class:`ConfigError` at ``path``."""
    entry = model_entry(name, path)
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = MODELS[name] = getattr(importlib.import_module(module), attr)
    return entry


def sections() -> dict[str, type]:
    discover()
    return dict(sorted(SECTIONS.items()))


def commands() -> dict[str, Any]:
    discover()
    return dict(sorted(COMMANDS.items()))


CAPABILITIES = {
    "dp": "central DP (dp.enabled): every client's update has one shape, to clip and noise",
    "dp_sgd": "local DP-SGD (local.dp_noise_multiplier): its clients train with "
              "fedray.models.training.train_local's SGD, which Opacus wraps",
    "transforms": "update transforms (payload.transforms): the upload has the broadcast's "
                  "tensor shapes",
    "continual": "a continual task stream (continual.tasks)",
    "linear": "the step depends on the uploads only through Σ w_i Δ_i and Σ w_i "
              "(AggregationPolicy.weight / aggregate_sum), as summing on the executors "
              "(runtime.reduce=executors) and secure aggregation (secagg.enabled) need",
    "asynchronous": "an event queue in simulated time instead of rounds (buffer_size)",
    "client_state": "per-client state kept between a client's rounds (optimizer state, "
                    "private adapters, replay buffers)",
    "server_optimizer": "any server optimizer (server.optimizer: sgd, momentum, adam, yogi, "
                        "adagrad) applies its pseudo-gradient",
    "vectorizable": "a cohort of clients runs as one batched computation",
    "multilabel": "multi-label targets (data.dataset=flair): its clients train and score with "
                  "fedray.models.training's loss and evaluate, which take multi-hot targets",
    "robust": "a Byzantine-robust rule (robust.rule) aggregates its updates in place of the "
              "weighted mean",
    "attack": "model-poisoning attacks (adversary.attack): the upload is an update Δ with the "
              "broadcast's shapes, and its clients train on the context's labelled samples",
    "before_after": "eval.local_before_after: its client update scores the broadcast and the "
                    "trained model on the client's local test split (acc_before, acc_after)",
    "finetune": "eval.finetune_epochs: its clients score the global model after local "
                "fine-tuning (Algorithm.finetune_evaluate)",
}


def require(method: Any, capability: str, path: str, value: Any) -> None:
    """The one capability check: a :class:`ConfigError` at ``path`` naming the method, the
    value, what the setting needs and the methods that have it."""
    if capability in method.capabilities:
        return
    able = sorted(n for n, m in methods().items() if capability in m.capabilities)
    raise ConfigError(path, value, f"unset for {method.name}: it lacks the {capability!r} "
                                   f"capability ({CAPABILITIES[capability]}); methods with "
                                   f"it: {', '.join(able) or 'none'}")


def capabilities_of(cls: type) -> list[str]:
    """A method's capabilities in :data:`CAPABILITIES` order (``fedray methods``)."""
    return [c for c in CAPABILITIES if c in cls.capabilities]


def make_method(cls: type, cfg: Any) -> Any:
    """Instantiate the method ``cls`` with the validated parameters of ``cfg.algorithm``."""
    params = {k: v for k, v in cfg.algorithm.items() if k != "name"}
    return cls(cfg, build_dataclass(cls.Params, params, "algorithm"))


def build_method(cfg: Any) -> Any:
    """The configured method (``cfg.algorithm.name``), instantiated."""
    return make_method(method(cfg.algorithm["name"]), cfg)


__all__ = ["CAPABILITIES", "COMMANDS", "DATASETS", "METHODS", "MODELS", "SECTIONS",
           "build_method", "capabilities_of", "commands", "dataset", "datasets", "discover",
           "make_method", "method", "methods", "model_builder", "model_entry",
           "register_command", "register_dataset", "register_method", "register_model",
           "register_section", "require", "sections"]
