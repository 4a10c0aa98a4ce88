"""A composable chain of update transforms: top-k, PowerSGD, int8/int4 quantization, bf16.

A client's upload (``name -> ndarray``) can pass through a :class:`TransformChain` whatever
the method that produced it (FedAvg, FedProx, ORDERS, ...), in the spirit of pfl-research's
postprocessors and Flower's mods: ``["topk", "int8"]`` sparsifies each tensor and then
quantizes the kept values. The top-k and PowerSGD stages reuse :mod:`fedray.wire.compression`
and the quantizers reuse :mod:`fedray.wire.payload`'s, so a one-stage chain is bit-identical to
the compressor it wraps.

Stages and keys. A stage transforms the float tensors whose names are in ``shapes`` and
replaces each by suffixed keys, in the place the name held in the dict:

============  =======================================  ========================================
stage         emits for ``name``                       a later stage may transform
============  =======================================  ========================================
``topk``      ``name.values`` float32 [k],             ``name.values``
              ``name.indices`` uint16|uint32 [k]
``powersgd``  ``name.P`` float32 [n, r],               ``name.P``, ``name.Q`` (or ``name``)
              ``name.Q`` float32 [m, r];
              ``name`` (float32, dense) when the
              factors would not be smaller
``int8``      ``name.q`` uint8 codes [size],           nothing
``int4``      ``name.q`` uint8 [ceil(size/2)] (2/byte),
              ``name.scale`` float32 [scale, lo]
``bf16``      ``name.bf16`` uint16 [size]              nothing
``weights``   ``name`` float32 [shape]: the client's   ``name`` (first stage only)
              weights θ_t + Δ instead of Δ
============  =======================================  ========================================

Everything else — names not in ``shapes`` (e.g. ORDERS' ``orders.norm``), integer arrays —
passes through every stage untouched. :meth:`Transform.out_shapes` tells which float
tensors a stage emits, so the server computes every stage's input shapes from the global
shapes alone and decodes right to left (:meth:`TransformChain.server`); a name that is in
``shapes`` but not in an upload (a frozen head that was not sent) is skipped.

The broadcast as reference. ``weights`` is the one stage that needs the model the client
started from (:attr:`Transform.needs_reference`): :meth:`TransformChain.client` and
:meth:`TransformChain.server` then take ``reference=`` — the decoded broadcast the client
received, which the server rebuilds from the same payload — so ``["weights", "int4"]`` is
textbook int4 FedAvg of *weights* (the upload is quantize(θ_t + Δ_i); the server recovers
dequantize(quantize(θ_t + Δ_i)) − θ_t), where ``["int4"]`` quantizes the update Δ_i.

Error feedback (Karimireddy et al. 2019) is applied to the whole chain: the client encodes
``M = update + error`` and keeps ``error' = M - server(upload)``, so whatever any stage
dropped — sparsification, low rank and quantization alike — is sent later, never lost:
``sum(updates) - sum(server(uploads)) == error_T``.

Byte accounting stays with ``Payload.encode(upload, "fp32")``: float arrays travel as
float32 and integer arrays (indices, codes) as they are, so the count is exact.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from fedray.core.spec import spec as field_spec
from fedray.wire.compression import (
    powersgd_compress,
    powersgd_decompress,
    powersgd_is_compressed,
    topk_compress,
    topk_decompress,
    topk_k,
)
from fedray.wire.payload import dequantize, from_bf16, quantize, to_bf16

__all__ = ["BF16", "TRANSFORMS", "PowerSGD", "Quantize", "TopK", "Transform", "TransformChain",
           "Weights", "parse_transforms"]

Shape = tuple[int, ...]
Tensors = Mapping[str, np.ndarray]
Shapes = Mapping[str, Shape]


def _size(shape: Shape) -> int:
    return int(math.prod(shape))


def _is_float(x: Any) -> bool:
    return np.asarray(x).dtype.kind == "f"


def _splice(tensors: Tensors, replace: Mapping[str, dict[str, np.ndarray]],
            drop: set[str], stage: str) -> dict[str, np.ndarray]:
    """``tensors`` with each key of ``replace`` swapped, in place, for its new entries and
    the keys in ``drop`` removed. A new key that clashes with a key that stays raises
    ValueError (a pass-through tensor would otherwise be silently overwritten)."""
    out: dict[str, np.ndarray] = {}
    for key, value in tensors.items():
        if key in drop:
            continue
        if key not in replace:
            out[key] = value
            continue
        for new_key, new_value in replace[key].items():
            stays = new_key in tensors and new_key not in replace and new_key not in drop
            if new_key in out or stays:
                raise ValueError(f"{stage}: key {new_key!r} it emits is already in the upload")
            out[new_key] = new_value
    return out


def _decode_pairs(tensors: Tensors, shapes: Shapes, first: str, second: str, stage: str,
                  restore: Callable[[np.ndarray, np.ndarray, Shape], np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """Undo a stage that encodes ``name`` as the pair ``name+first``, ``name+second``:
    ``restore(first part, second part, shape)`` gives the tensor back, in the first part's
    place; names without their first part (absent, or not encoded) are left alone."""
    replace, drop = {}, set()
    for name, shape in shapes.items():
        if name + first not in tensors:
            continue
        a, b = tensors[name + first], _need(tensors, name + second, stage)
        replace[name + first] = {name: restore(np.asarray(a), np.asarray(b), tuple(shape))}
        drop.add(name + second)
    return _splice(tensors, replace, drop, stage)


def _need(tensors: Tensors, key: str, stage: str) -> np.ndarray:
    if key not in tensors:
        raise ValueError(f"{stage}: upload lacks {key!r} (its other part is there)")
    return np.asarray(tensors[key])


class Encoded(NamedTuple):
    """One client's upload after the chain (:meth:`TransformChain.client`)."""

    upload: dict[str, np.ndarray]
    memory: dict  # the chain's per-client memory for the next round (error feedback)
    metrics: dict[str, float]


class Transform:
    """One stage of a :class:`TransformChain`.

    Subclasses implement :meth:`_encode` (one tensor at a time), :meth:`decode` and
    :meth:`out_shapes`; :meth:`encode` picks the tensors to transform and splices the
    result back in place. A stage must not modify the arrays it is given.
    """

    name: ClassVar[str]
    #: suffixes of the keys that carry low-precision codes (counted as values, not indices)
    code_suffixes: ClassVar[tuple[str, ...]] = ()
    #: the stage's ``encode``/``decode`` take ``reference=`` (the client's decoded broadcast)
    needs_reference: ClassVar[bool] = False

    def encode(self, tensors: Tensors, shapes: Shapes, memory: dict | None, *, seed: int,
               round: int, client: int) -> tuple[dict[str, np.ndarray], dict | None]:
        """Transform the float tensors of ``tensors`` whose names are in ``shapes``; pass the
        rest through. Returns the new tensors and this stage's new memory (or None)."""
        replace: dict[str, dict[str, np.ndarray]] = {}
        for name, shape in shapes.items():
            if name not in tensors or not _is_float(tensors[name]):
                continue
            x = np.asarray(tensors[name])
            if tuple(x.shape) != tuple(shape):
                raise ValueError(f"{self.name}: tensor {name!r} has shape {tuple(x.shape)}, "
                                 f"expected {tuple(shape)}")
            replace[name] = self._encode(name, x.astype(np.float32, copy=False), memory,
                                         seed=seed, round=round, client=client)
        new_memory = self._memory(memory, replace) if replace else memory
        return _splice(tensors, replace, set(), self.name), new_memory

    def _encode(self, name: str, x: np.ndarray, memory: dict | None, *, seed: int, round: int,
                client: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _memory(self, memory: dict | None, encoded: Mapping[str, dict]) -> dict | None:
        """This stage's memory after encoding ``encoded`` (stateless stages: None)."""
        return None

    def out_shapes(self, shapes: Shapes) -> dict[str, Shape]:
        """Shapes of the float tensors this stage emits for ``shapes`` that a later stage
        may transform (computable from the shapes alone, as the server must)."""
        raise NotImplementedError

    def decode(self, tensors: Tensors, shapes: Shapes) -> dict[str, np.ndarray]:
        """Invert :meth:`encode` for the names in ``shapes`` whose encoded keys are present;
        absent names are skipped and every other key passes through."""
        raise NotImplementedError


# ------------------------------------------------------------------------------------ top-k


@dataclass(frozen=True)
class TopK(Transform):
    """Keep each tensor's ``topk_k(size, density)`` largest-magnitude entries
    (:func:`fedray.wire.compression.topk_compress`: ties lowest index first, ascending indices)."""

    density: float = field_spec(0.01, help="share of each tensor's entries sent, in (0, 1]")
    name: ClassVar[str] = "topk"

    def __post_init__(self) -> None:
        d = self.density
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not 0.0 < d <= 1.0:
            raise ValueError(f"topk density={d!r} is not allowed; allowed: a number in (0, 1]")

    def _encode(self, name, x, memory, *, seed, round, client):
        return dict(topk_compress({name: x}, None, self.density).upload)

    def out_shapes(self, shapes):
        return {name + ".values": (topk_k(_size(tuple(s)), self.density),)
                for name, s in shapes.items()}

    def decode(self, tensors, shapes):
        return _decode_pairs(tensors, shapes, ".values", ".indices", self.name,
                             lambda v, i, shape: topk_decompress(
                                 {"t.values": v, "t.indices": i}, {"t": shape})["t"])


# --------------------------------------------------------------------------------- PowerSGD


@dataclass(frozen=True)
class PowerSGD(Transform):
    """Rank-``rank`` PowerSGD with warm start (:func:`fedray.wire.compression.powersgd_compress`):
    the memory is ``{name: Q}``, and the first Q of a tensor is drawn from
    ``rng(seed, round, client, f"powersgd-{name}")`` with ``name`` the key this stage sees.
    Tensors whose factors would not be smaller are emitted dense under ``name``."""

    rank: int = field_spec(2, help="rank of the P Qᵀ approximation")
    name: ClassVar[str] = "powersgd"

    def __post_init__(self) -> None:
        r = self.rank
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 1:
            raise ValueError(f"powersgd rank={r!r} is not allowed; allowed: an integer >= 1")

    def _encode(self, name, x, memory, *, seed, round, client):
        q = (memory or {}).get(name)
        width = _size(x.shape[1:]) if x.ndim >= 2 else 0
        q_memory = {name: q} if q is not None and np.shape(q) == (width, self.rank) else None
        res = powersgd_compress({name: x}, None, self.rank, q_memory, seed=seed, round=round,
                                client=client)
        return dict(res.upload)

    def _memory(self, memory, encoded):
        """Warm-start Q per tensor; a tensor not sent this round keeps its old Q."""
        new = dict(memory or {})
        for name, parts in encoded.items():
            if name + ".Q" in parts:
                new[name] = parts[name + ".Q"]
        return new

    def out_shapes(self, shapes):
        out: dict[str, Shape] = {}
        for name, s in shapes.items():
            s = tuple(s)
            if powersgd_is_compressed(s, self.rank):
                out[name + ".P"] = (s[0], self.rank)
                out[name + ".Q"] = (_size(s[1:]), self.rank)
            else:
                out[name] = s
        return out

    def decode(self, tensors, shapes):  # a dense name (factors not smaller) passes as it is
        return _decode_pairs(tensors, shapes, ".P", ".Q", self.name,
                             lambda p, q, shape: powersgd_decompress(
                                 {"t.P": p, "t.Q": q}, {"t": shape})["t"])


# ------------------------------------------------------------------------------ quantizers


@dataclass(frozen=True)
class Quantize(Transform):
    """Uniform affine per-tensor quantization to ``bits`` (8 or 4) — the quantizer of
    ``Payload.encode(..., "int8"/"int4")``: ``name.q`` uint8 codes (int4 packed two per
    byte) and ``name.scale`` float32 ``[scale, lo]``."""

    bits: int = field_spec(8, help="bits per code: 8 or 4")
    code_suffixes: ClassVar[tuple[str, ...]] = (".q",)

    def __post_init__(self) -> None:
        b = self.bits
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b not in (8, 4):
            raise ValueError(f"quantize bits={b!r} is not allowed; allowed: 8 or 4")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"int{self.bits}"

    def _encode(self, name, x, memory, *, seed, round, client):
        q, sz = quantize(x, self.bits)
        return {name + ".q": q, name + ".scale": sz}

    def out_shapes(self, shapes):
        return {}

    def decode(self, tensors, shapes):
        return _decode_pairs(tensors, shapes, ".q", ".scale", self.name,
                             lambda q, sz, shape: dequantize(q, sz, self.bits, _size(shape))
                             .reshape(shape))


@dataclass(frozen=True)
class BF16(Transform):
    """bfloat16 (round to nearest even, as ``Payload``'s bf16 codec): ``name.bf16`` uint16."""

    name: ClassVar[str] = "bf16"
    code_suffixes: ClassVar[tuple[str, ...]] = (".bf16",)

    def _encode(self, name, x, memory, *, seed, round, client):
        return {name + ".bf16": to_bf16(x).reshape(-1)}

    def out_shapes(self, shapes):
        return {}

    def decode(self, tensors, shapes):
        replace = {name + ".bf16": {name: from_bf16(np.asarray(tensors[name + ".bf16"]))
                                    .reshape(tuple(shape))}
                   for name, shape in shapes.items() if name + ".bf16" in tensors}
        return _splice(tensors, replace, set(), self.name)


# ---------------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class Weights(Transform):
    """Send weights, not updates: the client emits ``reference[name] + x`` under ``name``
    (x the update Δ_i = θ_i − θ_t, plus the error memory with error feedback) and the server
    subtracts ``reference[name]`` again, so the decoded upload is still an update and every
    aggregation policy is unchanged. A later stage therefore compresses θ_i itself:
    ``["weights", "int4"]`` is the FLITE paper's "int4 full-weight FedAvg" (§5.9, Table 5),
    whose quantization error is relative to the weights' range, not to the update's.

    ``reference`` is the decoded broadcast the client trained from (the server rebuilds it
    from the same payload, so both sides subtract the same tensors). θ_t + (θ_i − θ_t) in
    float32 is θ_i up to one rounding of the sum (exact when no bits are lost), far below
    any codec's step. It must be the chain's first stage: later stages rename or reshape
    tensors (``name.values``, ``name.P``) that have no reference.
    """

    name: ClassVar[str] = "weights"
    needs_reference: ClassVar[bool] = True

    def encode(self, tensors, shapes, memory, *, seed, round, client,  # type: ignore[override]
               reference: Tensors) -> tuple[dict[str, np.ndarray], dict | None]:
        replace = {}
        for name, shape in shapes.items():
            if name not in tensors or not _is_float(tensors[name]):
                continue
            x = np.asarray(tensors[name], dtype=np.float32)
            ref = self._ref(reference, name, tuple(shape))
            if tuple(x.shape) != tuple(shape):
                raise ValueError(f"{self.name}: tensor {name!r} has shape {tuple(x.shape)}, "
                                 f"expected {tuple(shape)}")
            replace[name] = {name: ref + x}
        return _splice(tensors, replace, set(), self.name), memory

    def out_shapes(self, shapes):
        return {name: tuple(s) for name, s in shapes.items()}

    def decode(self, tensors, shapes, *, reference: Tensors  # type: ignore[override]
               ) -> dict[str, np.ndarray]:
        replace = {}
        for name, shape in shapes.items():
            if name in tensors and _is_float(tensors[name]):
                w = np.asarray(tensors[name], dtype=np.float32).reshape(tuple(shape))
                replace[name] = {name: w - self._ref(reference, name, tuple(shape))}
        return _splice(tensors, replace, set(), self.name)

    def _ref(self, reference: Tensors, name: str, shape: Shape) -> np.ndarray:
        if name not in reference:
            raise ValueError(f"{self.name}: the broadcast has no tensor {name!r} to add")
        ref = np.asarray(reference[name], dtype=np.float32)
        if tuple(ref.shape) != shape:
            raise ValueError(f"{self.name}: broadcast tensor {name!r} has shape "
                             f"{tuple(ref.shape)}, expected {shape}")
        return ref


# -------------------------------------------------------------------------------- registry


def _int8() -> Quantize:
    return Quantize(8)


def _int4() -> Quantize:
    return Quantize(4)


TRANSFORMS: dict[str, Callable[..., Transform]] = {
    "topk": TopK, "powersgd": PowerSGD, "int8": _int8, "int4": _int4, "quantize": Quantize,
    "bf16": BF16, "weights": Weights,
}


def register_transform(name: str, factory: Callable[..., Transform]) -> Callable[..., Transform]:
    """Make ``factory`` (a :class:`Transform` dataclass, or a function returning one) the
    ``payload.transforms`` entry ``name`` (a plugin's stage; two claiming one name is an
    error). Its dataclass fields are the entry's parameters, listed by ``fedray config
    --keys``."""
    if TRANSFORMS.get(name, factory) is not factory:
        raise TypeError(f"transform {name!r} is taken")
    TRANSFORMS[name] = factory
    return factory


def parse_transforms(specs: list[str | dict | Transform] | None) -> list[Transform]:
    """Transforms from config entries: a name (``"topk"``), a mapping with a ``name`` and
    parameters (``{"name": "topk", "density": 0.1}``), or a :class:`Transform`.

    A bad entry raises one-line ValueError naming its index, the value and what is allowed.
    """
    out: list[Transform] = []
    for i, spec in enumerate(specs or []):
        where = f"transforms[{i}]"
        if isinstance(spec, Transform):
            out.append(spec)
            continue
        if isinstance(spec, str):
            name, params = spec, {}
        elif isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            name, params = spec["name"], {k: v for k, v in spec.items() if k != "name"}
        else:
            raise ValueError(f"{where}: {spec!r} is not a transform; allowed: a name or a "
                             f"mapping with a 'name' key")
        factory = TRANSFORMS.get(name)
        if factory is None:
            raise ValueError(f"{where}: unknown transform {name!r}; allowed: "
                             f"{', '.join(sorted(TRANSFORMS))}")
        allowed = [p for p in inspect.signature(factory).parameters if p != "self"]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ValueError(f"{where}: {name} has no parameter {unknown[0]!r}; allowed: "
                             f"{', '.join(allowed) or 'none'}")
        try:
            out.append(factory(**params))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if out[-1].needs_reference and i > 0:
            raise ValueError(f"{where}: {name} must be the first transform (it adds the "
                             f"broadcast to the update before any stage renames tensors)")
    return out


# ----------------------------------------------------------------------------------- chain


class TransformChain:
    """Stages applied left to right by the client and undone right to left by the server,
    with chain-level error feedback.

    Client memory (a plain dict the client state store can keep)::

        {"error": {name: float32 ndarray},       # only with error_feedback
         "stages": {"<index>.<stage name>": stage memory}}   # e.g. "0.powersgd": {name: Q}

    A stage's memory is keyed by its index *and* name, so a changed chain does not feed
    one stage's memory to another. Names not uploaded this round keep their error and Q.
    An empty chain is the identity and keeps no memory.
    """

    def __init__(self, transforms: list[Transform], error_feedback: bool = True):
        self.transforms = list(transforms)
        self.error_feedback = error_feedback
        late = [t.name for t in self.transforms[1:] if t.needs_reference]
        if late:
            raise ValueError(f"transform {late[0]!r} must be the chain's first stage (a "
                             f"method that compresses by construction prepends its own)")

    @property
    def needs_reference(self) -> bool:
        """Whether :meth:`client` and :meth:`server` need ``reference=`` (the broadcast)."""
        return any(t.needs_reference for t in self.transforms)

    def __bool__(self) -> bool:
        return bool(self.transforms)

    @property
    def stateful(self) -> bool:
        """Whether a client keeps memory between its rounds (error feedback, PowerSGD's Q)."""
        return bool(self.transforms) and (self.error_feedback or any(
            isinstance(t, PowerSGD) for t in self.transforms))

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.transforms)
        return f"TransformChain([{names}], error_feedback={self.error_feedback})"

    def stage_shapes(self, shapes: Shapes) -> list[dict[str, Shape]]:
        """Every stage's input shapes (entry ``i`` for stage ``i``), from the global shapes."""
        out: list[dict[str, Shape]] = []
        current = {k: tuple(v) for k, v in shapes.items()}
        for t in self.transforms:
            out.append(current)
            current = t.out_shapes(current)
        return out

    def client(self, update: Tensors, shapes: Shapes, memory: dict | None, *, seed: int,
               round: int, client: int, reference: Tensors | None = None
               ) -> Encoded:
        """Encode ``update`` for upload: the :class:`Encoded` upload, new memory and
        metrics.

        ``shapes`` names the tensors to transform (normally the global state's shapes);
        ``reference`` is the decoded broadcast the client started from (needed only when
        :attr:`needs_reference`);
        metrics count the upload's entries: ``sent_values`` (float entries, incl. the two
        scale entries per quantized tensor), ``sent_indices`` (integer entries other than
        codes: top-k indices, pass-through integers) and ``sent_quantized`` (values sent as
        int8/int4/bf16 codes, one per value).
        """
        if not self.transforms:
            return Encoded(dict(update), {}, _metrics(update, {}))
        memory = memory or {}
        error = dict(memory.get("error") or {}) if self.error_feedback else {}
        tensors = dict(update)
        residual: dict[str, np.ndarray] = {}
        for name in shapes:
            if name in update and _is_float(update[name]):
                m = np.asarray(update[name], dtype=np.float32)
                if name in error:
                    m = m + np.asarray(error[name], dtype=np.float32)
                residual[name] = tensors[name] = np.array(m, dtype=np.float32)
        old_stages = memory.get("stages") or {}
        new_stages: dict[str, Any] = {}
        code_sizes: dict[str, int] = {}
        for i, (t, in_shapes) in enumerate(zip(self.transforms, self.stage_shapes(shapes),
                                               strict=True)):
            key = f"{i}.{t.name}"
            tensors, mem = t.encode(tensors, in_shapes, old_stages.get(key), seed=seed,
                                    round=round, client=client,
                                    **self._reference(t, reference))
            if mem is not None:
                new_stages[key] = mem
            for name, s in in_shapes.items():
                for suffix in t.code_suffixes:
                    if name + suffix in tensors:
                        code_sizes[name + suffix] = _size(s)
        new_memory: dict[str, Any] = {"stages": new_stages}
        if self.error_feedback:
            decoded = self.server(tensors, shapes, reference=reference)
            for name, m in residual.items():
                error[name] = m - decoded[name]
            new_memory["error"] = error
        return Encoded(tensors, new_memory, _metrics(tensors, code_sizes))

    def server(self, upload: Tensors, shapes: Shapes, reference: Tensors | None = None
               ) -> dict[str, np.ndarray]:
        """The dense tensors an upload stands for, under their original names; keys not in
        ``shapes`` pass through and names in ``shapes`` absent from the upload are skipped.
        ``reference``: the broadcast the client received (when :attr:`needs_reference`)."""
        tensors = dict(upload)
        stage_shapes = self.stage_shapes(shapes)
        for t, in_shapes in zip(reversed(self.transforms), reversed(stage_shapes), strict=True):
            tensors = t.decode(tensors, in_shapes, **self._reference(t, reference))
        return tensors

    @staticmethod
    def _reference(t: Transform, reference: Tensors | None) -> dict[str, Tensors]:
        if not t.needs_reference:
            return {}
        if reference is None:
            raise ValueError(f"transform {t.name!r} needs the broadcast (reference=)")
        return {"reference": reference}


def _metrics(upload: Tensors, code_sizes: Mapping[str, int]) -> dict[str, float]:
    values = indices = quantized = 0
    for key, arr in upload.items():
        arr = np.asarray(arr)
        if key in code_sizes:
            quantized += code_sizes[key]
        elif arr.dtype.kind in "iu":
            indices += arr.size
        else:
            values += arr.size
    return {"sent_values": float(values), "sent_indices": float(indices),
            "sent_quantized": float(quantized)}

