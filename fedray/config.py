"""Typed, validated experiment configuration.

One loader for every method: a YAML or TOML file plus ``a.b=c`` command-line overrides
become an :class:`ExperimentConfig`. Every check runs before any Ray work, and every failure
is a :class:`ConfigError` naming the field, the value and what is allowed.

The ``model`` and ``algorithm`` sections are open-ended: ``name`` picks an entry of the
model or algorithm registry and the remaining keys are checked against that entry's typed
parameters (a dataclass for algorithms, the builder's keyword arguments for models).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import reprlib
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 120, 120, 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


def short_repr(value: Any, limit: int = 240) -> str:
    """``repr`` bounded in depth and length: a value in a message is shown, not expanded
    (a YAML alias bomb would otherwise take forever to print)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_CREDENTIALS = re.compile(r"(?<=://)[^/@\s'\"]+@")


def redact(text: str) -> str:
    """``text`` with the user-info part of every URI (``s3://KEY:SECRET@bucket/...``)
    replaced by ``***@``: credentials never reach a log, a config or a summary."""
    return _CREDENTIALS.sub("***@", text)


class ConfigError(ValueError):
    """A configuration value that is not allowed; names the field, the value and the rule."""

    def __init__(self, path: str, value: Any, allowed: str):
        self.path, self.value, self.allowed = path, value, allowed
        super().__init__(redact(f"config error at '{path}': got {short_repr(value)}; "
                                f"allowed: {allowed}"))

    def __reduce__(self):  # survives pickling (errors raised inside Ray workers)
        return ConfigError, (self.path, self.value, self.allowed)


def spec(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
         ge: float | None = None, gt: float | None = None, le: float | None = None,
         lt: float | None = None, help: str = "") -> Any:
    """A dataclass field with numeric bounds and a help text."""
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "help": help}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# ----------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    dataset: Literal["digits", "synthetic", "cifar10", "cifar100", "blogtext"] = spec(
        "digits", help="digits ships with scikit-learn; cifar* read a local torchvision root; "
                       "blogtext reads a BlogText-schema CSV (FAVoR)")
    root: str | None = spec(None, help="local directory of a torchvision dataset (cifar*), "
                                       "or the CSV file (blogtext)")
    download: bool = spec(False, help="let torchvision download cifar* into root")
    image_size: int | None = spec(None, ge=8, help="upsample digits to this square size")
    channels: int = spec(1, ge=1, le=3, help="digits channels (3 replicates the grey image)")
    partition: Literal["iid", "dirichlet", "pathological", "quantity"] = "iid"
    alpha: float = spec(0.5, gt=0, help="Dirichlet label-skew concentration")
    classes_per_client: int = spec(2, ge=1, help="pathological skew: classes per client")
    quantity_alpha: float = spec(0.5, gt=0, help="quantity skew: Dirichlet over client sizes")
    min_samples: int = spec(4, ge=2, help="minimum samples per client (train + test)")
    local_test_fraction: float = spec(0.2, gt=0, lt=1, help="share of a shard held out locally")
    feature_skew: float = spec(0.0, ge=0, help="strength of the per-client input transform")
    drift_round: int | None = spec(None, ge=1, help="round from which drifted labels apply")
    drift_fraction: float = spec(0.5, ge=0, le=1, help="share of clients whose labels drift")
    synthetic_samples: int = spec(6000, ge=10)
    synthetic_features: int = spec(784, ge=1)
    synthetic_classes: int = spec(10, ge=2)
    synthetic_test_fraction: float = spec(0.2, gt=0, lt=1)


@dataclass
class ClientsConfig:
    num_clients: int = spec(10, ge=1)
    fraction: float = spec(1.0, gt=0, le=1, help="share of clients sampled each round")
    per_round: int | None = spec(None, ge=1, help="clients sampled each round (wins over fraction)")
    tiers: list[str] | None = spec(None, help="tier name per client; default round-robin")

    def sampled_count(self) -> int:
        if self.per_round is not None:
            return self.per_round
        return max(1, int(round(self.fraction * self.num_clients)))


@dataclass
class LocalConfig:
    epochs: int = spec(1, ge=1)
    batch_size: int = spec(32, ge=1)
    lr: float = spec(0.05, gt=0)
    momentum: float = spec(0.0, ge=0, lt=1)
    weight_decay: float = spec(0.0, ge=0)
    max_steps: int | None = spec(None, ge=1, help="cap on local steps per round")
    keep_optimizer_state: bool = spec(
        False, help="keep each client's momentum buffer between rounds (client state store)")
    bf16: bool = spec(False, help="autocast forward passes to bfloat16 (fp32 master weights)")


@dataclass
class PayloadConfig:
    upload: Literal["fp32", "bf16", "int8", "int4"] = "fp32"
    download: Literal["fp32", "bf16"] = "fp32"


@dataclass
class EvalConfig:
    every: int = spec(1, ge=0, help="evaluate every k rounds (0: only after the last round)")
    clients: Literal["all", "sampled", "none"] = spec(
        "all", help="whose local test split the global model is evaluated on")
    global_test: bool = True
    local_before_after: bool = spec(
        False, help="clients report local test accuracy before and after their update")
    finetune_epochs: int = spec(0, ge=0, help="also report personalized accuracy after this "
                                              "many local fine-tuning epochs (0: off)")


@dataclass
class TierConfig:
    name: str = spec("default", help="tier name (clients.tiers refers to it)")
    executors: int = spec(2, ge=1, help="executor actors of this tier")
    num_cpus: float = spec(1.0, ge=0, help="CPUs per executor")
    num_gpus: float = spec(0.0, ge=0, le=1, help="fraction of one GPU per executor")
    capacity: float = spec(
        1.0, gt=0, le=1, help="budget ρ: the share of the full model's parameters (or FLOPs) "
                              "this tier's sub-model holds (sub-model methods)")
    resources: dict[str, float] = spec(
        default_factory=dict, help="custom Ray resources per executor (maps tiers to node "
                                   "types, e.g. {tier_full: 0.25})")
    accelerator_type: str | None = spec(
        None, help="pin the tier's executors to one GPU type (Ray's accelerator_type, e.g. "
                   "A100, A10G, H100): one GPU type per tier, required by "
                   "runtime.deterministic on GPU tiers")


@dataclass
class RuntimeConfig:
    tiers: list[TierConfig] = spec(default_factory=lambda: [TierConfig()],
                                   help="capacity tiers: executors of one resource shape each")
    device: Literal["auto", "cpu", "cuda"] = spec(
        "auto", help="cpu: no GPU anywhere; cuda: every tier asks for its num_gpus (> 0); "
                     "auto: each tier's num_gpus as written, except on a local Ray started by "
                     "this run without GPUs (then cpu). An executor uses CUDA only when Ray "
                     "granted it a GPU share")
    deterministic: bool = spec(
        False, help="deterministic GPU kernels (cuDNN/cuBLAS, no TF32) in every executor: "
                    "bitwise-repeatable GPU runs on one GPU type (CPU runs always are)")
    threads_per_executor: int = spec(1, ge=1)
    max_client_retries: int = spec(2, ge=0, help="re-runs of a failing client within a round")
    min_accepted: int = spec(
        1, ge=0, help="fewest accepted uploads a round needs; a round with fewer stops the "
                      "run with an error naming the round and the clients' errors")
    max_executor_restarts: int = spec(5, ge=0, help="executor deaths (and timeouts) a run "
                                                    "survives; one more stops it")
    call_timeout_s: float | None = spec(
        None, gt=0, help="an executor busy this many seconds without returning a result is "
                         "killed and replaced; its clients count a failed attempt (default: "
                         "no limit)")
    placement_timeout_s: float | None = spec(
        None, gt=0, help="fail if executors cannot be placed within this many seconds "
                         "(default 60 on a local Ray, 1800 on a cluster whose GPU nodes may "
                         "still be booting)")
    checkpoint_every: int = spec(1, ge=1)
    chunk_size: int | None = spec(None, ge=1, help="clients per executor call (default auto)")
    ray_address: str | None = spec(None, help="Ray cluster; default RAY_ADDRESS or local")
    include_dashboard: bool = False


@dataclass
class ContinualConfig:
    """Federated class-incremental learning (DROD §3): the classes are cut, in a fixed order,
    into ``tasks`` disjoint tasks that reach every client at the same round boundaries;
    one shared head, no task id. Each task's samples are split among the clients with
    Dirichlet(``data.alpha``), redrawn per task."""

    tasks: int = spec(0, ge=0, help="number of tasks (0: no task stream)")
    rounds_per_task: int = spec(1, ge=1, help="communication rounds per task")
    class_order: list[int] | None = spec(None, help="class order cut into tasks "
                                                    "(default 0..C-1, the paper's fixed order)")
    method: Literal["none", "er", "derpp", "bic", "ewc"] = spec(
        "er", help="continual-learning objective: none (fine-tune), er (experience replay), "
                   "derpp (DER++), bic (bias correction), ewc (online EWC)")
    buffer_total: int = spec(200, ge=0, help="fleet-wide replay exemplars, split uniformly "
                                             "over the clients")
    replay_batch: int | None = spec(None, ge=1, help="exemplars appended per local batch "
                                                     "(default local.batch_size)")
    derpp_alpha: float = spec(0.1, ge=0, help="DER++ weight of the logit-matching term")
    derpp_beta: float = spec(0.5, ge=0, help="DER++ weight of the replayed-label term")
    ewc_lambda: float = spec(10.0, ge=0, help="EWC penalty strength λ")
    ewc_gamma: float = spec(1.0, ge=0, le=1, help="online-EWC decay of the old Fisher")
    ewc_samples: int = spec(256, ge=1, help="samples per Fisher estimate")
    bic_steps: int = spec(300, ge=1, help="gradient steps of BiC's two-parameter stage")
    bic_lr: float = spec(0.1, gt=0, help="learning rate of BiC's two-parameter stage")
    bic_temperature: float = spec(2.0, gt=0, help="BiC distillation temperature")


@dataclass
class PretrainConfig:
    """Central pretraining of a shared base (``fedray pretrain``); the FLITE paper's recipe:
    SGD momentum 0.9, lr 0.05 with a 3-epoch linear warmup then cosine decay, weight decay
    5e-4, batch 128."""

    epochs: int = spec(100, ge=1)
    lr: float = spec(0.05, gt=0)
    momentum: float = spec(0.9, ge=0, lt=1)
    weight_decay: float = spec(5e-4, ge=0)
    batch_size: int = spec(128, ge=1)
    warmup_epochs: int = spec(3, ge=0)
    head: Literal["orthogonal", "kaiming", "trainable"] = spec(
        "orthogonal", help="classifier head: frozen orthogonal (FLITE), frozen Kaiming, trainable")
    classes: list[int] | None = spec(None, help="pretrain on these classes only (default all)")
    fraction: float = spec(1.0, gt=0, le=1, help="share of the (selected) train set used")


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    seed: int = spec(0, ge=0)
    rounds: int = spec(10, ge=1)
    run_dir: str | None = spec(None, help="local path or pyarrow.fs URI; default runs/NAME")
    data: DataConfig = spec(default_factory=DataConfig)
    clients: ClientsConfig = spec(default_factory=ClientsConfig)
    model: dict[str, Any] = spec(default_factory=lambda: {"name": "mlp"})
    algorithm: dict[str, Any] = spec(default_factory=lambda: {"name": "fedavg"})
    local: LocalConfig = spec(default_factory=LocalConfig)
    payload: PayloadConfig = spec(default_factory=PayloadConfig)
    eval: EvalConfig = spec(default_factory=EvalConfig)
    runtime: RuntimeConfig = spec(default_factory=RuntimeConfig)
    pretrain: PretrainConfig = spec(default_factory=PretrainConfig)
    continual: ContinualConfig = spec(default_factory=ContinualConfig)

    def to_dict(self) -> dict[str, Any]:
        """Every field; a run_dir URI with credentials is redacted (this is what config.yaml
        stores)."""
        out = dataclasses.asdict(self)
        if out["run_dir"]:
            out["run_dir"] = redact(out["run_dir"])
        return out

    def tier_of(self, client_id: int) -> str:
        if self.clients.tiers is not None:
            return self.clients.tiers[client_id]
        tiers = self.runtime.tiers
        return tiers[client_id % len(tiers)].name


# ----------------------------------------------------------------------------- coercion


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {', '.join(f.name for f in dataclasses.fields(tp))}"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it in that type.

    Ints are accepted where floats are expected; nothing else is converted silently
    (``"3"`` is not an int, ``1`` is not a bool).
    """
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise ConfigError(path, value, _type_name(tp))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, path)
            except ConfigError:
                continue
        raise ConfigError(path, value, _type_name(tp))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, value, _type_name(tp))
        (arg,) = typing.get_args(tp)[:1] or (Any,)
        return [coerce(v, arg, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, value, "a mapping")
        _, vt = typing.get_args(tp) or (str, Any)
        return {k: coerce(v, vt, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, value, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(path, value, "an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(path, value, "a finite number")
            return float(value)
        raise ConfigError(path, value, "a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, value, "a string")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(path, value, _type_name(tp))


def check_bounds(value: Any, meta: typing.Mapping[str, Any], path: str) -> None:
    if value is None or isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        return
    rules = [("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
             ("le", lambda a, b: a <= b, "<="), ("lt", lambda a, b: a < b, "<")]
    for key, ok, _ in rules:
        bound = meta.get(key)
        if bound is not None and not ok(value, bound):
            text = " and ".join(f"{s} {meta[k]}" for k, _, s in rules if meta.get(k) is not None)
            raise ConfigError(path, value, f"a number {text}")


def build_dataclass(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and bad values."""
    if data is None:
        data = {}
    if dataclasses.is_dataclass(data):
        data = dataclasses.asdict(data)
    if not isinstance(data, dict):
        raise ConfigError(path or "<root>", data, _type_name(cls))
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(where, data[key], f"known keys of '{path or 'config'}': "
                              + ", ".join(sorted(known)))
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            continue
        where = f"{path}.{name}" if path else name
        value = coerce(data[name], hints[name], where)
        check_bounds(value, f.metadata, where)
        if isinstance(value, list):
            for i, v in enumerate(value):
                check_bounds(v, f.metadata, f"{where}[{i}]")
        kwargs[name] = value
    return cls(**kwargs)


def check_kwargs(fn: Any, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    """Validate keyword arguments of a builder against its signature and annotations."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    allowed = {n: p for n, p in sig.parameters.items()
               if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    out = {}
    for key, value in kwargs.items():
        if key not in allowed or allowed[key].default is inspect.Parameter.empty:
            names = ", ".join(n for n, p in allowed.items()
                              if p.default is not inspect.Parameter.empty)
            raise ConfigError(f"{path}.{key}", value, f"known keys: name, {names}")
        out[key] = coerce(value, hints.get(key, Any), f"{path}.{key}")
    return out


# ----------------------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (["a", "b"], c) with ``c`` parsed as a YAML scalar/list."""
    if "=" not in text:
        raise ConfigError(text, text, "overrides of the form key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(key or text, text, "a dotted key such as local.lr")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for i, k in enumerate(keys[:-1]):
            if isinstance(node, list):  # e.g. runtime.tiers.0.executors
                entry = node[int(k)] if k.isdigit() and int(k) < len(node) else None
                if not isinstance(entry, dict):
                    raise ConfigError(".".join(keys[: i + 1]), text,
                                      f"an index below {len(node)} of a list of sections")
                node = entry
                continue
            nxt = node.get(k)
            if nxt is None and keys[i + 1].isdigit():
                raise ConfigError(".".join(keys[: i + 2]), text,
                                  f"an index into a list the config sets; this config has no "
                                  f"{'.'.join(keys[: i + 1])} list: give it whole, e.g. "
                                  f"-s '{'.'.join(keys[: i + 1])}=[{{...}}]'")
            if nxt is None:
                nxt = node[k] = {}
            if isinstance(nxt, list) and keys[i + 1].isdigit():
                node = nxt
                continue
            if not isinstance(nxt, (dict, list)):
                raise ConfigError(".".join(keys[: i + 1]), nxt, "a section to set keys in")
            node = nxt
        last = keys[-1]
        if isinstance(node, list):
            idx = int(last)
            if idx >= len(node):
                raise ConfigError(".".join(keys), value, f"an index below {len(node)}")
            node[idx] = value
        else:
            node[last] = value
    return data


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config file", str(path), "an existing .yaml, .yml, .toml or .json file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError("config file", str(path), f"UTF-8 text (byte {e.start} is not)") \
            from None
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        reason = " ".join(str(e).split())[:200]  # one line, bounded
        raise ConfigError("config file", str(path), f"valid {p.suffix[1:] or 'YAML'}: "
                                                    f"{reason}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("config file", str(path), "a mapping at the top level")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: typing.Iterable[str] = (),
                base: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read ``path`` (YAML/TOML/JSON), apply overrides, validate everything."""
    data: dict[str, Any] = json.loads(json.dumps(base)) if base else {}
    if path is not None:
        data = _merge(data, read_file(path))
    data = apply_overrides(data, overrides)
    cfg = build_dataclass(ExperimentConfig, data)
    validate(cfg)
    return cfg


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def validate(cfg: ExperimentConfig) -> None:
    """Cross-field rules and the model/algorithm sections (need the registries)."""
    from fedray.algorithms import get_algorithm
    from fedray.models import get_model_builder

    c = cfg.clients
    if c.per_round is not None and c.per_round > c.num_clients:
        raise ConfigError("clients.per_round", c.per_round,
                          f"at most clients.num_clients = {c.num_clients}")
    names = [t.name for t in cfg.runtime.tiers]
    if not names:
        raise ConfigError("runtime.tiers", [], "at least one tier")
    if len(set(names)) != len(names):
        raise ConfigError("runtime.tiers", names, "unique tier names")
    _validate_devices(cfg)
    if cfg.runtime.min_accepted > c.sampled_count():
        raise ConfigError("runtime.min_accepted", cfg.runtime.min_accepted,
                          f"at most the {c.sampled_count()} clients sampled per round")
    if c.tiers is not None:
        if len(c.tiers) != c.num_clients:
            raise ConfigError("clients.tiers", c.tiers,
                              f"a list of {c.num_clients} tier names (one per client)")
        for i, t in enumerate(c.tiers):
            if t not in names:
                raise ConfigError(f"clients.tiers[{i}]", t, f"one of the tiers {names}")
    if cfg.data.dataset == "blogtext" and (cfg.data.root is None
                                           or not Path(cfg.data.root).is_file()):
        raise ConfigError("data.root", cfg.data.root, "an existing BlogText-schema CSV file")
    if cfg.data.dataset.startswith("cifar"):
        root = cfg.data.root
        if root is None:
            raise ConfigError("data.root", root, "a local directory for " + cfg.data.dataset)
        if not cfg.data.download and not Path(root).is_dir():
            raise ConfigError("data.root", root,
                              "an existing directory (or set data.download=true)")
    if cfg.data.partition == "pathological" and cfg.data.classes_per_client > _num_classes(cfg):
        raise ConfigError("data.classes_per_client", cfg.data.classes_per_client,
                          f"at most the dataset's {_num_classes(cfg)} classes")
    if cfg.data.drift_round is not None and cfg.data.drift_round > cfg.rounds:
        raise ConfigError("data.drift_round", cfg.data.drift_round,
                          f"a round in 1..rounds = {cfg.rounds}")

    _validate_continual(cfg)

    model = dict(cfg.model)
    name = model.pop("name", "mlp")
    builder = get_model_builder(name, path="model.name")
    cfg.model = {"name": name, **check_kwargs(builder, model, "model")}

    algo = dict(cfg.algorithm)
    aname = algo.pop("name", "fedavg")
    algorithm_cls = get_algorithm(aname, path="algorithm.name")
    params = build_dataclass(algorithm_cls.Params, algo, "algorithm")
    if hasattr(params, "validate"):
        params.validate(cfg)
    cfg.algorithm = {"name": aname, **dataclasses.asdict(params)}


def _validate_devices(cfg: ExperimentConfig) -> None:
    rt = cfg.runtime
    for i, t in enumerate(rt.tiers):
        if rt.device == "cuda" and t.num_gpus <= 0:
            raise ConfigError(f"runtime.tiers[{i}].num_gpus", t.num_gpus,
                              "a GPU share > 0 when runtime.device=cuda (an executor given no "
                              "GPU share runs on the CPU)")
        gpu_tier = rt.device != "cpu" and t.num_gpus > 0
        if rt.deterministic and gpu_tier and not t.accelerator_type:
            raise ConfigError(f"runtime.tiers[{i}].accelerator_type", None,
                              "a GPU type (e.g. A100) when runtime.deterministic=true: kernels "
                              "differ between GPU types, so bitwise repeatability needs one "
                              "type per tier")


def _validate_continual(cfg: ExperimentConfig) -> None:
    from fedray.algorithms import get_algorithm

    cl = cfg.continual
    if not cl.tasks:
        return
    classes = _num_classes(cfg)
    if classes % cl.tasks:
        raise ConfigError("continual.tasks", cl.tasks,
                          f"a divisor of the dataset's {classes} classes")
    if cl.class_order is not None and sorted(cl.class_order) != list(range(classes)):
        raise ConfigError("continual.class_order", cl.class_order,
                          f"a permutation of 0..{classes - 1}")
    if cfg.eval.every and cl.rounds_per_task % cfg.eval.every:
        raise ConfigError("eval.every", cfg.eval.every,
                          f"a divisor of continual.rounds_per_task = {cl.rounds_per_task} (the "
                          f"accuracy matrix needs a score at every task boundary)")
    if cfg.rounds > cl.tasks * cl.rounds_per_task:
        raise ConfigError("rounds", cfg.rounds, f"at most continual.tasks x rounds_per_task = "
                                                f"{cl.tasks * cl.rounds_per_task}")
    if cl.buffer_total and cl.buffer_total < cfg.clients.num_clients and cl.method != "none":
        raise ConfigError("continual.buffer_total", cl.buffer_total,
                          f"0 or at least one exemplar per client "
                          f"({cfg.clients.num_clients})")
    algorithm = get_algorithm(cfg.algorithm.get("name", "fedavg"), path="algorithm.name")
    if not getattr(algorithm, "supports_continual", False):
        raise ConfigError("algorithm.name", cfg.algorithm.get("name"),
                          "a method that supports continual.tasks (the sub-model family: "
                          "drod, fjord, heterofl, fedrolex, shortcut_fjord, depthfl)")


def _num_classes(cfg: ExperimentConfig) -> int:
    return {"digits": 10, "cifar10": 10, "cifar100": 100}.get(
        cfg.data.dataset, cfg.data.synthetic_classes)


def field_help(cls: type = ExperimentConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, type, help) for every field: used by ``--help`` texts and the README."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        item = (typing.get_args(tp) or (None,))[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(tp):
            rows += field_help(tp, key + ".")
        elif dataclasses.is_dataclass(item):  # a list of sections: each entry's keys
            rows.append((key, f"a list of {item.__name__}", f.metadata.get("help", "")))
            rows += field_help(item, key + "[].")
        else:
            rows.append((key, _type_name(tp), f.metadata.get("help", "")))
    return rows
