"""The ground floor of configuration: errors, typed fields and their validation.

Imports nothing from fedray, so every layer can use it. A config section is a dataclass
whose fields come from :func:`spec` (default, numeric bounds, help text);
:func:`build_dataclass` turns a mapping into that dataclass, rejecting unknown keys, wrong
types and out-of-range values with a :class:`ConfigError` that names the field, the value
and the rule. :func:`knobs` lists every key with its type, default and help (``fedray config
--keys``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import math
import re
import reprlib
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 120, 120, 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


def short_repr(value: Any, limit: int = 240) -> str:
    """``repr`` bounded in depth and length: a value in a message is shown, not expanded
    (a YAML alias bomb would otherwise take forever to print)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown(text: Any) -> str:
    """``text`` as it can be printed: control and other non-printable characters escaped
    (``\\r``, ``\\x1b``), so a key that holds them is never shown as a different, valid-looking
    key; printable text (any script) as it is."""
    text = str(text)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


# a URI's user info: everything up to the authority's last "@" (a password may hold "@")
_CREDENTIALS = re.compile(r"(?<=://)[^/?#\s'\"]*@")
# a query value whose key names a secret (password=, token=, X-Amz-Signature=, api_key=)
_SECRET_QUERY = re.compile(r"(?i)([?&][^=&#\s'\"]*(?:pass|token|secret|key|sig|credential)"
                           r"[^=&#\s'\"]*=)[^&#\s'\"]*")


def redact(text: str) -> str:
    """``text`` with the user-info part of every URI (``s3://KEY:SECRET@bucket/...``)
    replaced by ``***@`` and the value of every query parameter whose name says secret
    (``?password=``, ``&token=``, a presigned URL's ``X-Amz-Signature=``) by ``***``:
    credentials never reach a log, a config or a summary."""
    return _SECRET_QUERY.sub(r"\1***", _CREDENTIALS.sub("***@", text))


class ConfigError(ValueError):
    """A configuration value that is not allowed; names the field, the value and the rule."""

    def __init__(self, path: str, value: Any, allowed: str):
        self.path, self.value, self.allowed = path, value, allowed
        super().__init__(redact(f"config error at '{shown(path)}': got {short_repr(value)}; "
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


_NAMES = {"int": int, "float": float, "str": str, "bool": bool, "None": type(None),
          "Any": Any, "tuple": tuple, "list": list, "dict": dict, "Literal": typing.Literal}


def _annotation(node: ast.AST | None) -> Any:
    """A type from an annotation's syntax tree (builtins, ``X | None``, ``tuple[X, ...]``,
    ``list[X]``, ``Literal[...]``); ``Any`` for anything else. Nothing is evaluated."""
    if node is None:
        return Any
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        return _annotation(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Name):
        return _NAMES.get(node.id, Any)
    if isinstance(node, ast.Attribute):  # typing.Literal, ...
        return _NAMES.get(node.attr, Any)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return typing.Union[_annotation(node.left), _annotation(node.right)]  # noqa: UP007
    if isinstance(node, ast.Subscript):
        base = _annotation(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base is typing.Literal:
            return typing.Literal[tuple(ast.literal_eval(i) for i in items)]
        if base is tuple and len(items) == 2 and isinstance(items[1], ast.Constant) \
                and items[1].value is Ellipsis:
            return tuple[_annotation(items[0]), ...]
        if base in (tuple, list, dict):
            return base[tuple(_annotation(i) for i in items)] if base is not list \
                else list[_annotation(items[0])]
    return Any


@functools.lru_cache(maxsize=64)
def keyword_params(target: Any) -> dict[str, tuple[Any, Any]]:
    """``{name: (type, default)}`` of the keyword arguments with defaults of a builder: a
    callable, or a ``"module:function"`` path read from its source without importing the
    module (validating ``model.*`` must not load torch). Read once per builder a process
    (the result is shared: not to be modified)."""
    if not isinstance(target, str):
        sig, hints = inspect.signature(target), typing.get_type_hints(target)
        return {n: (hints.get(n, Any), p.default) for n, p in sig.parameters.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is not inspect.Parameter.empty}
    module, _, name = target.partition(":")
    spec_ = importlib.util.find_spec(module)
    if spec_ is None or spec_.origin is None:
        raise ImportError(f"no module {module!r} for {target!r}")
    tree = ast.parse(Path(spec_.origin).read_text(encoding="utf-8"))
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise ImportError(f"{module} has no function {name!r}")
    a = fn.args
    positional = a.posonlyargs + a.args
    pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True))
    pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    return {p.arg: (_annotation(p.annotation), ast.literal_eval(d)) for p, d in pairs}


def check_kwargs(fn: Any, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    """Validate keyword arguments of a builder (a callable or a ``"module:function"`` path,
    :func:`keyword_params`) against its signature and annotations."""
    allowed = keyword_params(fn)
    out = {}
    for key, value in kwargs.items():
        if key not in allowed:
            raise ConfigError(f"{path}.{key}", value,
                              f"known keys: name, {', '.join(allowed)}")
        out[key] = coerce(value, allowed[key][0], f"{path}.{key}")
    return out


@dataclasses.dataclass
class Knob:
    """One configuration key as ``fedray config --keys`` lists it: its dotted key, type,
    default (per method or optimizer when those differ: ``{name: default}``), help, and the
    methods or optimizers it applies to (empty: every run)."""

    key: str
    type: str
    default: Any
    help: str
    applies_to: list[str] = dataclasses.field(default_factory=list)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return _plain(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _plain(f.default_factory())
    return None


def keyword_knobs(target: Any, prefix: str, help: str) -> list[Knob]:
    """A :class:`Knob` for every keyword of a builder (:func:`keyword_params`: its type
    and default read from the signature), each with ``help``."""
    return [Knob(prefix + name, _type_name(tp), _plain(default), help)
            for name, (tp, default) in keyword_params(target).items()]


def knobs(cls: type, prefix: str = "") -> list[Knob]:
    """A :class:`Knob` for every field of ``cls`` (nested sections flattened, a list of
    sections as one row plus each entry's keys)."""
    rows: list[Knob] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        item = (typing.get_args(tp) or (None,))[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(tp):
            rows += knobs(tp, key + ".")
        elif dataclasses.is_dataclass(item):  # a list of sections: each entry's keys
            rows.append(Knob(key, f"a list of {item.__name__}", _default(f),
                             f.metadata.get("help", "")))
            rows += knobs(item, key + "[].")
        else:
            rows.append(Knob(key, _type_name(tp), _default(f), f.metadata.get("help", "")))
    return rows
