"""The ground floor of configuration: errors, typed fields and their validation.

Imports nothing from fedray, so every layer can use it. A config section is a dataclass
whose fields come from :func:`spec` (default, numeric bounds, help text);
:func:`build_dataclass` turns a mapping into that dataclass, rejecting unknown keys, wrong
types and out-of-range values with a :class:`ConfigError` that names the field, the value
and the rule. :func:`field_help` lists every key with its type and help (``fedray config
--keys``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import reprlib
import types
import typing
from dataclasses import field
from typing import Any, Literal

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


def field_help(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, type, help) for every field: used by ``--help`` texts and the README."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
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
