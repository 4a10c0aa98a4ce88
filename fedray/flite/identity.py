"""The server's view of FLITE: which weights are mapped, and the averaging-identity check.

Numpy only (the driver never imports torch for this). The mapped layers are derived from
the base's state dict — by default every 4-D weight, i.e. every conv kernel, which is what
:func:`fedray.flite.factors.mapped_layers` selects on the model — or by the same fnmatch
patterns; the factors come from the same seed recipe as the clients'
(:class:`~fedray.flite.factors.LayerFactors`).
"""

from __future__ import annotations

import fnmatch

import numpy as np

from fedray.config import ConfigError
from fedray.flite.factors import LayerFactors


def mapped_names(state: dict[str, np.ndarray], patterns: list[str] | None) -> list[str]:
    """Mapped parameter names in state order: conv kernels (4-D ``*.weight``) by default."""
    if patterns is None:
        names = [k for k, v in state.items() if v.ndim == 4 and k.endswith("weight")]
    else:
        names = [k for k in state if any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    if not names:
        raise ConfigError("algorithm.layers", patterns, "patterns matching at least one "
                                                        "parameter of the base model")
    return names


class IdentityChecker:
    """max |Σ_k w_k θ(z_k) − θ(Σ_k w_k z_k)| over all mapped weights (Eq. 2/4), with
    θ(z) = θ^pre + U (Vᵀ z) evaluated in float32 like the clients' forward pass.

    U is kept once built when ``keep_u`` (the clients' "stored" mode), otherwise regenerated
    chunk by chunk on every check (bounded memory, the "regenerated" mode's trade-off).
    """

    def __init__(self, pre: dict[str, np.ndarray], layers: list[LayerFactors],
                 keep_u: bool = True):
        self.pre = {f.name: np.asarray(pre[f.name], np.float32).reshape(-1) for f in layers}
        self.layers = layers
        self.keep_u = keep_u
        self._v = {f.name: f.v() for f in layers}
        self._r = {f.name: f.gram_cholesky() for f in layers}
        self._u: dict[str, np.ndarray] = {}

    def _u_chunks(self, f: LayerFactors):
        if not self.keep_u:
            yield from f.u_chunks(self._r[f.name])
            return
        if f.name not in self._u:
            self._u[f.name] = f.stored_u(self._r[f.name])
        yield 0, self._u[f.name]

    def error(self, latents: np.ndarray, weights: np.ndarray, mean: np.ndarray) -> float:
        """``latents`` (K, D) in layer order, ``weights`` (K,) summing to 1, ``mean`` (D,)."""
        worst, offset = 0.0, 0
        for f in self.layers:
            zk = latents[:, offset:offset + f.d].astype(np.float32)
            zbar = mean[offset:offset + f.d].astype(np.float32)
            offset += f.d
            a = self._v[f.name].T @ zk.T          # (r, K)
            abar = self._v[f.name].T @ zbar       # (r,)
            pre = self.pre[f.name]
            for start, u in self._u_chunks(f):
                rows = slice(start, start + len(u))
                each = pre[rows, None] + u @ a    # θ(z_k), float32
                avg = each.astype(np.float64) @ weights
                direct = pre[rows] + u @ abar     # θ(z̄), float32
                worst = max(worst, float(np.abs(avg - direct).max()))
        return worst
