"""The server's view of FLITE: which weights are mapped, and the averaging-identity check.

Numpy only (the driver never imports torch for this). The mapped layers are derived from
the base's state dict — by default every 4-D weight, i.e. every conv kernel, which is what
:func:`fedray.methods.flite.factors.mapped_layers` selects on the model — or by the same fnmatch
patterns; the factors come from the same seed recipe as the clients'
(:class:`~fedray.methods.flite.factors.LayerFactors`).
"""

from __future__ import annotations

import fnmatch

import numpy as np

from fedray.core.spec import ConfigError
from fedray.methods.flite.factors import LayerFactors


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


def payload_info(model_name: str, num_classes: int, d: int, r: int,
                 input_shape: tuple[int, ...] = (3, 32, 32), layers: list[str] | None = None,
                 **model_kwargs) -> dict:
    """Mapped layers, D, exact per-round payload bytes at fp32/int8/int4 (one quantizer for
    the whole latent, or one per layer) and the compression ratio Σ P_l / D — what
    ``fedray flite info`` prints. Builds the model (no factors, no weights downloaded)."""
    from fedray.methods.flite.factors import check_dims, mapped_layers
    from fedray.models import build_model
    from fedray.wire.payload import Payload

    model = build_model(model_name, input_shape, num_classes, **model_kwargs)
    params = dict(model.named_parameters())
    names = mapped_layers(model, layers)
    for n in names:
        check_dims(n, params[n].numel(), d, r)
    total = sum(p.numel() for p in params.values())
    mapped = sum(params[n].numel() for n in names)
    D = d * len(names)
    vector = {"z": np.zeros(D, np.float32)}
    per_layer = {f"z/{n}": np.zeros(d, np.float32) for n in names}
    out: dict = {"model": model_name, "num_classes": num_classes, "d": d, "r": r,
                 "mapped_layers": [{"name": n, "shape": list(params[n].shape),
                                    "parameters": params[n].numel()} for n in names],
                 "num_mapped_layers": len(names), "D": D, "mapped_parameters": mapped,
                 "model_parameters": total, "compression_ratio_mapped": mapped / D,
                 "compression_ratio_model": total / D,
                 "stored_factor_bytes": 4 * r * (mapped + D)}
    for codec in ("fp32", "int8", "int4"):
        pv, pl = Payload.encode(vector, codec), Payload.encode(per_layer, codec)
        out[f"payload_{codec}_bytes"] = pv.nbytes - len(pv.header)
        out[f"payload_{codec}_bytes_with_header"] = pv.nbytes
        out[f"payload_{codec}_per_layer_scale_bytes"] = pl.nbytes - len(pl.header)
    return out
