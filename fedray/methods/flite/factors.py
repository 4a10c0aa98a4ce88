"""Seed-regenerable low-rank factors U_l, V_l of the FLITE delta mapping (paper §3.3-3.4).

For every mapped layer l with P_l flattened weights the mapping is (Eq. 3)

    θ_l = θ_l^pre + U_l V_lᵀ z_l,    U_l ∈ R^{P_l×r},  V_l ∈ R^{d_l×r},

with U_l, V_l frozen and with orthonormal columns ("Gaussian draws orthonormalised by QR",
§3.4). This module turns one 64-bit ``seed`` into those factors, identically in every process:

* U_l = G_l R_l⁻¹ where G_l ∈ R^{P_l×r} is Gaussian and R_l = chol(G_lᵀ G_l) is upper
  triangular with a positive diagonal. That is exactly the thin QR factorisation of G_l with
  the (unique) positive-diagonal R, but computed through the r×r Gram matrix, so G_l can be
  streamed in row chunks and never held whole (the regenerated mode of §3.4).
* G_l's rows come in fixed chunks of ``CHUNK_ROWS`` rows; chunk c is drawn by numpy from
  ``rng(seed, -1, -1, f"flite-U-{l}-{c}")`` as float32, so any chunk can be regenerated on
  its own. The chunk size is part of the factors' definition: a different ``CHUNK_ROWS``
  gives different (equally valid) factors, so every party must use the same value.
* V_l = H_l chol(H_lᵀ H_l)⁻¹ likewise, from one Gaussian draw H_l ∈ R^{d_l×r} with purpose
  ``f"flite-V-{l}"``.

The Gram matrices, Cholesky factors and U = G R⁻¹ products are computed in float64 and the
factors are handed out as float32. ``l`` is the layer's position in the list of mapped layers.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.core.seeding import rng
from fedray.core.spec import ConfigError

if TYPE_CHECKING:
    from torch import nn

CHUNK_ROWS = 32768
"""Rows of G_l drawn per chunk; part of the factor definition (see the module docstring)."""

SEED_BOUND = 2**64


# ----------------------------------------------------------------------------- validation


def mapped_layers(model: nn.Module, patterns: list[str] | None = None) -> list[str]:
    """Names of the parameters FLITE maps, in ``model.named_parameters()`` order.

    By default every convolution weight (the ``weight`` of each ``nn.Conv*`` module; for the
    CIFAR ResNet-18 that is 20 tensors including the three 1x1 shortcut convs, the paper's
    D = 20·64 = 1280 setting). With ``patterns`` (fnmatch-style, case-sensitive, matched
    against parameter names such as ``"9.conv1.weight"`` or ``"layer4.*.weight"``) every
    matching parameter instead. Raises :class:`ConfigError` at ``algorithm.layers`` when nothing
    is selected.
    """
    if patterns is None:
        from torch import nn

        conv_weights = {f"{name}.weight" if name else "weight"
                        for name, module in model.named_modules()
                        if isinstance(module, nn.modules.conv._ConvNd)}
        names = [name for name, _ in model.named_parameters() if name in conv_weights]
        if not names:
            raise ConfigError("algorithm.layers", patterns,
                              "the model has no conv weights; give parameter-name patterns")
        return names
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError("algorithm.layers", patterns, "a list of fnmatch pattern strings")
    names = [name for name, _ in model.named_parameters()
             if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    if not names:
        example = next((name for name, _ in model.named_parameters()), "<none>")
        raise ConfigError("algorithm.layers", patterns,
                          f"fnmatch patterns matching at least one parameter name "
                          f"(e.g. {example!r})")
    return names


def check_seed(seed: Any) -> int:
    """``seed`` as a python int; :class:`ConfigError` at ``algorithm.factor_seed`` unless
    0 <= seed < 2**64."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= int(seed) < SEED_BOUND:
        raise ConfigError("algorithm.factor_seed", seed, "an integer in [0, 2**64)")
    return int(seed)


def check_dims(layer: str, P: int, d: Any, r: Any, d_path: str = "algorithm.d") -> None:
    """Check that layer ``layer`` (P weights) admits a latent of size d at rank r.

    V_l ∈ R^{d×r} and U_l ∈ R^{P×r} can only have r orthonormal columns if r <= d and r <= P.
    """
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0:
        raise ConfigError(d_path, d, "a positive integer")
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r <= 0:
        raise ConfigError("algorithm.r", r, "a positive integer")
    if r > d:
        raise ConfigError("algorithm.r", r, f"at most {d_path} = {d} (V_l needs r orthonormal "
                                        f"columns in R^d)")
    if r > P:
        raise ConfigError("algorithm.r", r, f"at most P_l = {P}, the size of mapped layer "
                                        f"{layer!r} (U_l needs r orthonormal columns in R^P)")


# ----------------------------------------------------------------------------- numerics


@functools.cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread() -> contextlib.AbstractContextManager:
    """Run numpy's BLAS on one thread.

    The products here are tall-and-skinny (an r×r or chunk×r result); threads buy nothing and,
    on a CPU shared with other jobs, spinning OpenBLAS threads made them ~100x slower.
    """
    try:
        return _blas_controller().limit(limits=1, user_api="blas")
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        return contextlib.nullcontext()


def _upper_cholesky(gram: np.ndarray) -> np.ndarray:
    """R with gram = RᵀR, upper triangular with a positive diagonal (float64)."""
    return np.ascontiguousarray(np.linalg.cholesky(gram).T)


def _resolve_chunk_rows(chunk_rows: int | None) -> int:
    rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
    if rows <= 0:
        raise ValueError(f"chunk_rows must be positive, got {rows}")
    return rows


def g_chunks(seed: int, layer_index: int, P: int, r: int,
             chunk_rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (row_start, G chunk) for the Gaussian G_l ∈ R^{P×r}, float32, chunk by chunk.

    Chunk c holds rows [c·chunk_rows, min((c+1)·chunk_rows, P)) and is drawn from
    ``rng(seed, -1, -1, f"flite-U-{layer_index}-{c}")``: bit-identical in every process.
    """
    rows = _resolve_chunk_rows(chunk_rows)
    for c, start in enumerate(range(0, P, rows)):
        gen = rng(seed, -1, -1, f"flite-U-{layer_index}-{c}")
        yield start, gen.standard_normal((min(rows, P - start), r), dtype=np.float32)


def _add_gram(gram: np.ndarray, g: np.ndarray) -> None:
    """gram += gᵀg in float64 (one chunk's contribution to G_lᵀG_l)."""
    g64 = g.astype(np.float64)
    with _one_blas_thread():
        gram += g64.T @ g64


def _u_chunk(g: np.ndarray, r_inv: np.ndarray) -> np.ndarray:
    """U rows = G rows · R⁻¹, computed in float64, returned as float32."""
    with _one_blas_thread():
        u = g.astype(np.float64) @ r_inv
    return u.astype(np.float32)


def gram_cholesky(seed: int, layer_index: int, P: int, r: int,
                  chunk_rows: int | None = None) -> np.ndarray:
    """R_l = chol(G_lᵀ G_l) (r×r, upper, positive diagonal, float64), streaming G_l's chunks.

    Peak memory is one chunk; the Gram matrix is accumulated in float64.
    """
    gram = np.zeros((r, r), dtype=np.float64)
    for _, g in g_chunks(seed, layer_index, P, r, chunk_rows):
        _add_gram(gram, g)
    return _upper_cholesky(gram)


def u_chunks(seed: int, layer_index: int, P: int, r: int, R: np.ndarray,
             chunk_rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (row_start, U chunk) of U_l = G_l R_l⁻¹ (float32), regenerating G_l chunk by chunk.

    ``R`` must be :func:`gram_cholesky` of the same (seed, layer_index, P, r, chunk_rows).
    """
    r_inv = np.linalg.inv(R)  # R is r×r, triangular and well conditioned (κ(R) = κ(G_l))
    for start, g in g_chunks(seed, layer_index, P, r, chunk_rows):
        yield start, _u_chunk(g, r_inv)


def stored_u(seed: int, layer_index: int, P: int, r: int, R: np.ndarray | None = None,
             chunk_rows: int | None = None) -> np.ndarray:
    """U_l materialised as a (P, r) float32 array (the stored mode; 4·P·r bytes).

    Equal, bit for bit, to stacking :func:`u_chunks` (same per-chunk arithmetic), but G_l is
    drawn only once: it is written into the output, its Gram taken from there (when ``R`` is
    not given), and each chunk is then replaced by its U rows in place.
    """
    rows = _resolve_chunk_rows(chunk_rows)
    out = np.empty((P, r), dtype=np.float32)
    gram = np.zeros((r, r), dtype=np.float64)
    for start, g in g_chunks(seed, layer_index, P, r, rows):
        out[start:start + len(g)] = g
        if R is None:
            _add_gram(gram, g)
    r_inv = np.linalg.inv(_upper_cholesky(gram) if R is None else R)
    for start in range(0, P, rows):
        out[start:start + rows] = _u_chunk(out[start:start + rows], r_inv)
    return out


def v_matrix(seed: int, layer_index: int, d: int, r: int) -> np.ndarray:
    """V_l ∈ R^{d×r} (float32) with orthonormal columns: H chol(HᵀH)⁻¹ for one Gaussian H."""
    h = rng(seed, -1, -1, f"flite-V-{layer_index}").standard_normal((d, r), dtype=np.float32)
    gram = np.zeros((r, r), dtype=np.float64)
    _add_gram(gram, h)
    return _u_chunk(h, np.linalg.inv(_upper_cholesky(gram)))


@dataclass(frozen=True)
class LayerFactors:
    """Everything needed to (re)generate one layer's factors: seed, layer index, P_l, d_l, r.

    A small value object passed to wherever the factors are needed (a client process, the
    regenerating autograd function); it validates its dimensions on construction.
    ``chunk_rows=None`` fixes the current module-wide :data:`CHUNK_ROWS`.
    """

    seed: int
    index: int
    P: int
    d: int
    r: int
    chunk_rows: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_seed(self.seed))
        check_dims(self.name or f"#{self.index}", self.P, self.d, self.r)
        object.__setattr__(self, "chunk_rows", _resolve_chunk_rows(self.chunk_rows))

    def g_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(row_start, G_l chunk) pairs, see :func:`g_chunks`."""
        return g_chunks(self.seed, self.index, self.P, self.r, self.chunk_rows)

    def gram_cholesky(self) -> np.ndarray:
        """R_l (r×r float64), see :func:`gram_cholesky`."""
        return gram_cholesky(self.seed, self.index, self.P, self.r, self.chunk_rows)

    def u_chunks(self, R: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(row_start, U_l chunk) pairs, see :func:`u_chunks`."""
        return u_chunks(self.seed, self.index, self.P, self.r, R, self.chunk_rows)

    def stored_u(self, R: np.ndarray | None = None) -> np.ndarray:
        """U_l as a (P, r) float32 array, see :func:`stored_u`."""
        return stored_u(self.seed, self.index, self.P, self.r, R, self.chunk_rows)

    def v(self) -> np.ndarray:
        """V_l (d×r float32), see :func:`v_matrix`."""
        return v_matrix(self.seed, self.index, self.d, self.r)
