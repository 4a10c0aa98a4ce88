"""Payload: the tensors that cross the wire, their codec and their exact byte count.

A :class:`Payload` is what a broadcast or a client upload really consists of: a small JSON
header (names, shapes, codec) and a list of numpy buffers (values, packed codes, scales).
``nbytes`` is ``len(header) + sum(buffer.nbytes)`` — the one byte-accounting path every
method uses. Ray moves the numpy buffers zero-copy through the object store; Ray's own
framing (a few hundred bytes per object) is not part of the count.

Codecs (per tensor):
- ``fp32``: raw float32 values.
- ``bf16``: the upper 16 bits of float32 with round-to-nearest-even.
- ``int8`` / ``int4``: uniform affine per-tensor quantization,
  ``q = round((x - lo) / s)`` with ``s = (hi - lo) / (2^b - 1)``; one float32 scale and
  one float32 zero-point (``lo``) per tensor; int4 codes are packed two per byte.

Integer tensors (e.g. top-k indices) travel as they are, whatever the codec: exact, and
counted at their own item size.

Codecs are registered (:func:`register_codec`), as methods, models and transforms are: a
:class:`Codec` says how one float tensor becomes buffers and back; ``payload.upload`` and
``payload.download`` take any registered name (``download`` only one marked for
broadcasts). An ``elementwise`` codec encodes each value on its own (fp32, bf16), so the
encoding of K tensors stacked is the stack of their encodings: a cohort's uploads can
travel as one stacked payload (:class:`fedray.runtime.jobs.StackedUploads`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) → float32, exactly."""
    return (b.astype(np.uint32) << 16).view(np.float32)


def quantize(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-tensor affine quantization to ``bits`` (8 or 4, packed two per byte): (codes,
    (scale, minimum) as float32)."""
    levels = (1 << bits) - 1
    flat = x.reshape(-1).astype(np.float32, copy=False)
    lo = float(flat.min()) if flat.size else 0.0
    hi = float(flat.max()) if flat.size else 0.0
    scale = (hi - lo) / levels if hi > lo else 1.0
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN inputs are caught upstream
        q = np.clip(np.rint((flat - lo) / scale), 0, levels).astype(np.uint8)
    if bits == 4:
        if q.size % 2:
            q = np.append(q, np.uint8(0))
        q = (q[0::2] | (q[1::2] << 4)).astype(np.uint8)
    return q, np.array([scale, lo], dtype=np.float32)


def dequantize(q: np.ndarray, sz: np.ndarray, bits: int, size: int) -> np.ndarray:
    """The inverse of :func:`quantize`: ``size`` float32 values from the codes."""
    if bits == 4:
        codes = np.empty(q.size * 2, dtype=np.uint8)
        codes[0::2] = q & 0x0F
        codes[1::2] = q >> 4
        q = codes[:size]
    return q.astype(np.float32) * sz[0] + sz[1]


@dataclass(frozen=True)
class Codec:
    """How one float tensor crosses the wire: ``encode(x) -> buffers`` (``buffers`` of
    them) and ``decode(buffers, size) -> flat float32``; ``values(buffers)`` are the floats
    a NaN or Inf would show in; ``broadcast``: allowed for ``payload.download``."""

    name: str
    buffers: int
    encode: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    decode: Callable[[tuple[np.ndarray, ...], int], np.ndarray]
    values: Callable[[tuple[np.ndarray, ...]], np.ndarray]
    broadcast: bool = False
    elementwise: bool = False


CODECS: dict[str, Codec] = {}


def register_codec(codec: Codec) -> Codec:
    """Make ``codec`` the wire codec ``codec.name`` (two claiming one name is an error)."""
    if CODECS.get(codec.name, codec) != codec:
        raise TypeError(f"codec {codec.name!r} is taken")
    CODECS[codec.name] = codec
    return codec


def _quantized(bits: int) -> Codec:
    return Codec(f"int{bits}", 2, lambda x: quantize(x, bits),
                 lambda b, size: dequantize(b[0], b[1], bits, size), lambda b: b[1])


for _codec in (
        Codec("fp32", 1, lambda x: (np.ascontiguousarray(x, dtype=np.float32).reshape(-1),),
              lambda b, size: b[0], lambda b: b[0], broadcast=True, elementwise=True),
        Codec("bf16", 1, lambda x: (to_bf16(x).reshape(-1),), lambda b, size: from_bf16(b[0]),
              lambda b: from_bf16(b[0]), broadcast=True, elementwise=True),
        _quantized(8), _quantized(4)):
    register_codec(_codec)


def codec_names(broadcast: bool = False) -> list[str]:
    """The registered codecs (for ``payload.download``: those marked for broadcasts)."""
    return [n for n, c in CODECS.items() if c.broadcast or not broadcast]


@dataclass(frozen=True)
class Payload:
    """Encoded named tensors; ``nbytes`` is the exact size of what is sent."""

    header: bytes
    buffers: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return len(self.header) + sum(int(b.nbytes) for b in self.buffers)

    @property
    def codec(self) -> str:
        return json.loads(self.header)["codec"]

    @classmethod
    def encode(cls, tensors: Mapping[str, np.ndarray], codec: str = "fp32") -> Payload:
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}; allowed: {', '.join(CODECS)}")
        spec = CODECS[codec]
        entries, buffers = [], []
        for name, value in tensors.items():
            arr = np.asarray(value)
            if arr.dtype.kind in "iu":
                entries.append([name, list(arr.shape), arr.dtype.str])
                buffers.append(np.ascontiguousarray(arr).reshape(-1))
                continue
            entries.append([name, list(arr.shape)])
            buffers.extend(spec.encode(arr))
        header = json.dumps({"codec": codec, "tensors": entries},
                            separators=(",", ":")).encode()
        return cls(header, tuple(buffers))

    def _entries(self):
        """(name, shape, kind, buffers) per tensor; kind is the codec or "int"."""
        meta = json.loads(self.header)
        if meta["codec"] not in CODECS:
            raise ValueError(f"payload codec {meta['codec']!r} is not registered here")
        i = 0
        for entry in meta["tensors"]:
            kind = "int" if len(entry) == 3 else meta["codec"]
            n = 1 if kind == "int" else CODECS[kind].buffers
            yield entry[0], entry[1], kind, self.buffers[i:i + n], entry[2:]
            i += n

    def decode(self) -> dict[str, np.ndarray]:
        out = {}
        for name, shape, kind, bufs, extra in self._entries():
            size = math.prod(shape)  # 1 for a scalar; numpy's prod costs 3 µs a call
            if kind == "int":
                arr = bufs[0].view(np.dtype(extra[0]))
            else:
                arr = CODECS[kind].decode(tuple(bufs), size)
            out[name] = arr.reshape(shape)
        return out

    def all_finite(self) -> bool:
        """False when any encoded value is NaN or Inf (float codecs and quantizer scales)."""
        for _, _, kind, bufs, _ in self._entries():
            if kind == "int":
                continue
            vals = CODECS[kind].values(tuple(bufs))
            if not np.isfinite(vals).all():
                return False
        return True
