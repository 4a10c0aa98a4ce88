"""FLITE: federated fine-tuning through a small latent (delta low-rank mapping, paper §3).

Each mapped layer's weights are generated as θ_l = θ_l^pre + U_l V_lᵀ z_l (Eq. 3) from a
frozen pretrained snapshot θ_l^pre, frozen seed-derived factors U_l, V_l with orthonormal
columns, and a trainable latent z_l. Clients train and exchange only the latents; because the
map is affine and shared, averaging latents is averaging weights (Eq. 2/4).

* :mod:`fedray.methods.flite.factors`: the seed-regenerable factors and the choice of mapped layers.
* :mod:`fedray.methods.flite.method`: :class:`Flite`, the method (client, server, knobs).
* :mod:`fedray.methods.flite.mapping`: :class:`LatentMapping`, the model wrapper (stored or
  regenerated factors).
"""

from fedray.methods.flite.factors import (
    LayerFactors,
    check_dims,
    check_seed,
    g_chunks,
    gram_cholesky,
    mapped_layers,
    stored_u,
    u_chunks,
    v_matrix,
)
from fedray.methods.flite.method import Flite, FliteParams

__all__ = ["Flite", "FliteParams", "LatentMapping", "LayerFactors", "check_dims",
           "check_seed", "g_chunks", "gram_cholesky", "mapped_layers", "stored_u", "u_chunks",
           "v_matrix"]

from fedray.methods.flite import cli as _cli  # noqa: E402,F401  (fedray flite ...)


def __getattr__(name: str):
    """``LatentMapping`` on first use: it needs torch, and loading a config must not."""
    if name == "LatentMapping":
        from fedray.methods.flite.mapping import LatentMapping

        return LatentMapping
    raise AttributeError(name)
