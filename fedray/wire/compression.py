"""Client-side update compression baselines with error feedback: top-k and PowerSGD.

These are the communication-compression baselines the FLITE paper compares against
("PowerSGD rank in {2, 8} with error feedback; top-k density in {1%, 10%} with error
feedback"). A client compresses its model update (``name -> float32 ndarray``) before upload;
the server decompresses each client's upload to a dense update and aggregates as usual.

Every compressor here is a pure function of (update, error memory, parameters, and for
PowerSGD its warm-start memory and (seed, round, client)). It returns a
:class:`CompressResult`: the tensors to upload, the new error memory, the shapes the server
needs to decompress, and (PowerSGD only) the new warm-start memory. The error and warm-start
memories belong to the client and live in the client state store between its rounds; with
partial participation they simply wait for the client's next round.

Error feedback (Karimireddy et al. 2019): the client compresses ``M = update + error`` and
keeps ``error' = M - decompress(upload)``, so whatever the compressor dropped this round is
added back next round. By construction, after T rounds
``sum(true updates) - sum(decompressed uploads) == error_T``: nothing is lost, only delayed.

Byte accounting. The uploaded dict goes through ``Payload.encode(upload, "fp32")`` — the one
byte-accounting path — so its arrays are exactly what is counted (FLITE: "for top-k we count
transmitted values and their integer indices; for PowerSGD we count both transmitted
factors"). Integer arrays travel as they are in every codec, so a top-k index costs its
own item size (uint16 for tensors of at most 65,536 entries, else uint32) and is exact.
:func:`payload_values` reports the count ``Payload.encode(upload, "fp32")`` makes, less its
JSON header.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, NamedTuple

import numpy as np

from fedray.core.seeding import rng

__all__ = ["COMPRESSORS", "CompressResult", "PayloadCount", "index_dtype",
           "payload_values", "powersgd_compress", "powersgd_decompress", "powersgd_is_compressed",
           "topk_compress", "topk_decompress", "topk_k"]

COMPRESSORS: tuple[str, ...] = ("topk", "powersgd")

Shape = tuple[int, ...]
Tensors = Mapping[str, np.ndarray]

_WIRE_VALUE_ITEMSIZE = 4  # float32 values and factors


class CompressResult(NamedTuple):
    """What a compressor returns for one client and round."""

    upload: dict[str, np.ndarray]  # goes into Payload.encode(upload, "fp32")
    error: dict[str, np.ndarray]  # new error-feedback memory (client state)
    shapes: dict[str, Shape]  # what decompress needs (the server also knows them)
    q_memory: dict[str, np.ndarray]  # PowerSGD warm-start Q per tensor (client state); {} for top-k


class PayloadCount(NamedTuple):
    """Exactly what an upload carries, as ``Payload.encode(upload, "fp32")`` counts it."""

    values: int  # float32 numbers: top-k values, PowerSGD factor entries, dense tensors
    indices: int  # top-k indices (0 for PowerSGD)
    index_bytes: int  # bytes the indices take on the fp32 wire

    @property
    def nbytes(self) -> int:
        """Payload bytes without the JSON header."""
        return self.values * _WIRE_VALUE_ITEMSIZE + self.index_bytes


def _size(shape: Shape) -> int:
    return int(math.prod(shape))


def _residual_input(update: Tensors, error: Tensors | None, name: str) -> np.ndarray:
    """``M = update + error`` in float32 (a missing error memory counts as zero)."""
    m = np.asarray(update[name], dtype=np.float32)
    if error is not None and name in error:
        m = m + np.asarray(error[name], dtype=np.float32)
    return np.array(m, dtype=np.float32)  # own copy: callers' arrays are never aliased


# ------------------------------------------------------------------------------------ top-k


def topk_k(size: int, density: float) -> int:
    """Entries top-k keeps in a tensor of ``size``: ``max(1, ceil(density * size))``.

    The product is shrunk by a relative 1e-12 before ``ceil`` so that float round-off such
    as ``0.1 * 30 == 3.0000000000000004`` does not keep an extra entry; an empty tensor
    keeps nothing.
    """
    if not 0.0 < density <= 1.0:
        raise ValueError(f"top-k density must be in (0, 1], got {density}")
    if size == 0:
        return 0
    return min(size, max(1, math.ceil(density * size * (1.0 - 1e-12))))


def index_dtype(size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every index of a tensor of ``size`` entries:
    uint16 when ``size <= 65536`` (indices 0..65535), else uint32."""
    return np.dtype(np.uint16 if size <= 1 << 16 else np.uint32)


def _topk_indices(flat: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the ``k`` largest ``|flat|``; ties keep the lowest index.

    O(n): ``np.partition`` finds the k-th largest magnitude ``t``; every entry above ``t`` is
    kept and the remaining slots go to the entries equal to ``t`` in index order, which is
    the same set a stable sort by (-|x|, index) would pick. NaN counts as the largest
    magnitude so a diverged update is uploaded (and rejected by the driver) rather
    than hidden in the error memory.
    """
    n = flat.size
    if k >= n:
        return np.arange(n)
    mag = np.abs(flat)
    mag[np.isnan(mag)] = np.inf
    threshold = np.partition(mag, n - k)[n - k]
    above = np.flatnonzero(mag > threshold)
    ties = np.flatnonzero(mag == threshold)[: k - above.size]
    return np.sort(np.concatenate([above, ties]))


def topk_compress(update: Tensors, error: Tensors | None, density: float, *,
                  scope: Literal["tensor"] = "tensor") -> CompressResult:
    """Top-k sparsification with error feedback.

    Per tensor, ``M = update + error`` keeps its ``k = topk_k(M.size, density)`` largest
    ``|M|`` entries (ties: lowest flat index first) and uploads
    ``{name + ".values": float32[k], name + ".indices": uint16|uint32[k]}`` with the indices
    in ascending flat (C-order) index and ``index_dtype`` chosen from the tensor size. The
    new error memory is ``M`` with the kept entries zeroed (``M - sparse(M)``, exact).

    Only ``scope="tensor"`` (a per-tensor k) is offered: a global k would make each
    tensor's share, and hence the index dtypes and the byte count, depend on the data.
    """
    if scope != "tensor":
        raise ValueError(f"top-k scope must be 'tensor', got {scope!r}")
    upload: dict[str, np.ndarray] = {}
    new_error: dict[str, np.ndarray] = {}
    shapes: dict[str, Shape] = {}
    for name in update:
        m = _residual_input(update, error, name)
        flat = m.reshape(-1)
        idx = _topk_indices(flat, topk_k(flat.size, density))
        upload[name + ".values"] = flat[idx].copy()
        upload[name + ".indices"] = idx.astype(index_dtype(flat.size))
        flat[idx] = 0.0  # m is our own copy: what is left is the new error
        new_error[name] = m
        shapes[name] = tuple(m.shape)
    return CompressResult(upload, new_error, shapes, {})


def topk_decompress(upload: Tensors, shapes: Mapping[str, Shape]) -> dict[str, np.ndarray]:
    """Dense float32 tensors from a top-k upload: zeros except ``values`` at ``indices``.

    Accepts the upload as compressed or as decoded from its payload (the same arrays).
    """
    out = {}
    for name, shape in shapes.items():
        dense = np.zeros(_size(shape), dtype=np.float32)
        idx = np.asarray(upload[name + ".indices"]).astype(np.int64)
        dense[idx] = np.asarray(upload[name + ".values"], dtype=np.float32)
        out[name] = dense.reshape(shape)
    return out


# --------------------------------------------------------------------------------- PowerSGD


def powersgd_is_compressed(shape: Shape, rank: int) -> bool:
    """Whether PowerSGD factorises a tensor of ``shape``: it needs ``ndim >= 2`` and factors
    smaller than the matrix, ``rank * (n + m) < n * m`` with ``n = shape[0]`` and
    ``m = prod(shape[1:])``; everything else is sent dense."""
    if len(shape) < 2:
        return False
    n, m = shape[0], _size(shape[1:])
    return rank * (n + m) < n * m


def _orthonormalise(p: np.ndarray) -> np.ndarray:
    """Orthonormal columns spanning ``p`` (reduced QR, float64).

    Householder QR always returns orthonormal columns, also for a rank-deficient or zero
    ``p``; the extra columns then complete the basis arbitrarily but deterministically.
    """
    q, _ = np.linalg.qr(p, mode="reduced")
    return q


def _lowrank(p: np.ndarray, q: np.ndarray, shape: Shape) -> np.ndarray:
    """``P Qᵀ`` reshaped to ``shape`` — the one reconstruction used by client and server."""
    return (np.asarray(p, dtype=np.float32) @ np.asarray(q, dtype=np.float32).T).reshape(shape)


def powersgd_compress(update: Tensors, error: Tensors | None, rank: int,
                      q_memory: Tensors | None, *, seed: int, round: int,
                      client: int) -> CompressResult:
    """PowerSGD (Vogels et al. 2019): one power iteration with warm start and error feedback.

    For each tensor that :func:`powersgd_is_compressed`, with ``M = update + error`` viewed as
    an ``n x m`` matrix (``n = shape[0]``)::

        Q = q_memory[name] if present, else Gaussian (m x rank) from
            rng(seed, round, client, f"powersgd-{name}")
        P = orthonormalise(M Q)            # n x rank
        Q = Mᵀ P                           # m x rank
        upload name + ".P", name + ".Q"    # float32
        error' = M - P Qᵀ;  q_memory'[name] = Q

    Warm start: the client reuses its own previous Q (kept in the client state store), as
    PowerSGD reuses the previous step's Q, so one power iteration per round keeps refining the
    subspace. The first Q is drawn per client (and drawn afresh when the stored Q is all
    zero, as an all-zero M leaves it): unlike all-reduce PowerSGD, the server
    decompresses each client's ``P Qᵀ`` separately, so clients need no shared basis.

    The power iteration runs in float64; the error is taken against the float32 factors as
    uploaded, i.e. against exactly what the server reconstructs. Vectors, scalars and
    matrices whose factors would not be smaller are uploaded dense under ``name`` (their
    error memory is zero).
    """
    if rank < 1:
        raise ValueError(f"PowerSGD rank must be >= 1, got {rank}")
    upload: dict[str, np.ndarray] = {}
    new_error: dict[str, np.ndarray] = {}
    new_q: dict[str, np.ndarray] = {}
    shapes: dict[str, Shape] = {}
    for name in update:
        m = _residual_input(update, error, name)
        shape = tuple(m.shape)
        shapes[name] = shape
        if not powersgd_is_compressed(shape, rank):
            upload[name] = m
            new_error[name] = np.zeros_like(m)
            continue
        mat = m.reshape(shape[0], -1).astype(np.float64)
        q = None
        if q_memory is not None and name in q_memory:
            q = np.asarray(q_memory[name], dtype=np.float64)
        if q is None or not q.any():  # a zero M leaves Q = 0, which M Q could never leave
            q = rng(seed, round, client, f"powersgd-{name}").standard_normal((mat.shape[1], rank))
        p32 = _orthonormalise(mat @ q).astype(np.float32)
        q32 = (mat.T @ p32.astype(np.float64)).astype(np.float32)
        upload[name + ".P"], upload[name + ".Q"] = p32, q32
        new_error[name] = m - _lowrank(p32, q32, shape)
        new_q[name] = q32
    return CompressResult(upload, new_error, shapes, new_q)


def powersgd_decompress(upload: Tensors, shapes: Mapping[str, Shape]) -> dict[str, np.ndarray]:
    """Dense float32 tensors from a PowerSGD upload: ``P Qᵀ`` reshaped, dense ones as sent."""
    out = {}
    for name, shape in shapes.items():
        if name + ".P" in upload:
            out[name] = _lowrank(upload[name + ".P"], upload[name + ".Q"], tuple(shape))
        else:
            out[name] = np.asarray(upload[name], dtype=np.float32).reshape(shape)
    return out


# ------------------------------------------------------------------------------ accounting


def payload_values(kind: str, shapes: Mapping[str, Shape], *, density: float | None = None,
                   rank: int | None = None) -> PayloadCount:
    """Exactly what a ``kind`` upload of tensors with ``shapes`` carries, known in advance.

    ``PayloadCount.nbytes`` equals ``Payload.encode(upload, "fp32").nbytes`` minus the JSON
    header: top-k sends ``topk_k`` float32 values plus as many indices (4 bytes each on the
    fp32 wire); PowerSGD sends ``rank * (n + m)`` factor entries per compressed tensor and
    every other tensor dense.
    """
    values = indices = index_bytes = 0
    if kind == "topk":
        if density is None:
            raise ValueError("top-k payload_values needs density")
        for shape in shapes.values():
            size = _size(tuple(shape))
            k = topk_k(size, density)
            values, indices = values + k, indices + k
            index_bytes += k * index_dtype(size).itemsize
    elif kind == "powersgd":
        if rank is None:
            raise ValueError("PowerSGD payload_values needs rank")
        for shape in shapes.values():
            shape = tuple(shape)
            if powersgd_is_compressed(shape, rank):
                values += rank * (shape[0] + _size(shape[1:]))
            else:
                values += _size(shape)
    else:
        raise ValueError(f"unknown compressor {kind!r}; allowed: {', '.join(COMPRESSORS)}")
    return PayloadCount(values, indices, index_bytes)
