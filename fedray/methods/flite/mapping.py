"""The FLITE latent mapping: a frozen model whose mapped weights are generated from latents.

:class:`LatentMapping` wraps a (pretrained) model. For every mapped layer l it keeps a frozen
snapshot θ_l^pre, the frozen factors of :mod:`fedray.methods.flite.factors` and one trainable latent
z_l ∈ R^{d_l} (initialised at 0), and on every forward pass generates (paper Eq. 3)

    θ_l = θ_l^pre + U_l (V_lᵀ z_l)

and runs the wrapped model with those weights. Only the latents are trainable: the wrapped
model is frozen entirely (§3.5, Algorithm 1: non-mapped parameters stay frozen), so a client
trains and uploads the D = Σ_l d_l latent floats and nothing else. Because θ(z) is affine with
shared θ^pre, U, V, averaging latents averages the generated weights exactly (Eq. 2/4), which
:meth:`LatentMapping.generated_weights` lets a caller check.

Two ways to hold U_l (identical results up to float32 round-off):

* ``"stored"``: U_l is materialised (4·P_l·r bytes; ~1.4 GB for ResNet-18 at r = 32).
* ``"regenerated"`` (§3.4): only V_l and R_l are kept; U_l (V_lᵀ z_l) = G_l (R_l⁻¹ V_lᵀ z_l)
  is computed by regenerating G_l from the seed chunk by chunk in the forward pass, and the
  backward pass regenerates it again, so the working memory is about one chunk.

The P_l×d_l projection U_l V_lᵀ is never formed in either mode.

A cohort of clients (:mod:`fedray.methods.flite.cohort`) gets its mapped weights from its
stacked latents with :meth:`LatentMapping.stacked_weights`: per layer one product of rank r
for all K clients (U_l read, or G_l regenerated, once for the cohort).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.func import functional_call

import fedray.methods.flite.factors as _factors
from fedray.core.spec import ConfigError
from fedray.methods.flite.factors import LayerFactors, check_dims, check_seed, mapped_layers

MODES = ("stored", "regenerated")


class _StreamedGaussianProduct(torch.autograd.Function):
    """δ = G_l a for the layer's Gaussian G_l ∈ R^{P×r}, regenerated chunk by chunk.

    forward:  δ[rows of chunk c] = G_c a
    backward: ∂L/∂a = Σ_c G_cᵀ ∂L/∂δ[rows of chunk c]   (accumulated in float64)

    ``a`` is one client's (r,) or a cohort's (r, K), one column per client (δ then (P, K)):
    one regeneration of G_l serves every column. Nothing but the :class:`LayerFactors`
    recipe is saved between the passes, so G_l is never whole in memory; each pass costs
    one regeneration of G_l.
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, factors: LayerFactors) -> torch.Tensor:
        ctx.factors = factors
        out = a.new_empty((factors.P, *a.shape[1:]))
        for start, g in factors.g_chunks():
            g_c = torch.from_numpy(g).to(a.device)
            out[start:start + len(g_c)] = g_c @ a
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        factors: LayerFactors = ctx.factors
        acc = torch.zeros((factors.r, *grad_out.shape[1:]), dtype=torch.float64,
                          device=grad_out.device)
        for start, g in factors.g_chunks():
            g_c = torch.from_numpy(g).to(grad_out.device)
            part = grad_out[start:start + len(g_c)]
            # a cohort's (rows, K) gradient is the transpose of a contiguous (K, P) one:
            # (partᵀ G_c)ᵀ reads both operands in their own layout (several times faster)
            acc += (g_c.T @ part if part.dim() == 1 else (part.T @ g_c).T).double()
        return acc.to(grad_out.dtype), None


class _MappedLayer(nn.Module):
    """One mapped layer: θ^pre, the factors and the latent z (Eq. 3)."""

    def __init__(self, name: str, weight: torch.Tensor, factors: LayerFactors, mode: str):
        super().__init__()
        self.name, self.shape, self.factors, self.mode = name, tuple(weight.shape), factors, mode
        device = weight.device
        # θ^pre is part of the model's state (persistent); the factors are not: the seed
        # regenerates them, so they stay out of state_dict / checkpoints.
        self.register_buffer("pre", weight.detach().reshape(-1).clone())
        self.register_buffer("V", torch.from_numpy(factors.v()).to(device), persistent=False)
        if mode == "stored":
            U = torch.from_numpy(factors.stored_u()).to(device)
            self.register_buffer("U", U, persistent=False)
        else:
            R = torch.from_numpy(factors.gram_cholesky()).to(device)
            self.register_buffer("R", R, persistent=False)
        self.z = nn.Parameter(torch.zeros(factors.d, dtype=torch.float32, device=device))

    def delta(self, z: torch.Tensor) -> torch.Tensor:
        """U (Vᵀ z), flat (P,): two thin products, never the P×d projection.

        Always in fp32, autocast or not: the generated weights are master weights (a bf16
        product would round θ^pre + δ to 8 bits of mantissa), and the streamed product's
        backward, which runs outside autocast, needs its gradient in the factors' dtype."""
        with torch.autocast(device_type=z.device.type, enabled=False):
            w = self.V.T @ z.float()
            if self.mode == "stored":
                return self.U @ w
            # U w = G R⁻¹ w: solve the r×r triangular system (float64), then stream G.
            a = torch.linalg.solve_triangular(self.R, w.double().unsqueeze(1), upper=True)
            return _StreamedGaussianProduct.apply(a.squeeze(1).to(w.dtype), self.factors)

    def weight(self, z: torch.Tensor) -> torch.Tensor:
        """θ = θ^pre + U Vᵀ z in the layer's shape (Eq. 3)."""
        return (self.pre + self.delta(z).to(self.pre.dtype)).view(self.shape)

    def deltas(self, z: torch.Tensor) -> torch.Tensor:
        """U (Vᵀ Zᵀ) for a cohort's stacked latents ``z`` (K, d), laid out (K, P): one
        product of rank r for all K clients (stored: U read once, not K times;
        regenerated: G regenerated once per pass, forward and backward), never the P×d
        projection. Stored, it is computed as its transpose (Z V) Uᵀ, whose operands and
        gradient are all read in their own layout (measured several times faster on the
        CPU than U (Vᵀ Zᵀ) and its transposed backward)."""
        with torch.autocast(device_type=z.device.type, enabled=False):
            if self.mode == "stored":
                return (z.float() @ self.V) @ self.U.T
            w = self.V.T @ z.float().T  # (r, K)
            a = torch.linalg.solve_triangular(self.R, w.double(), upper=True)
            return _StreamedGaussianProduct.apply(a.to(w.dtype), self.factors).T

    def weights(self, z: torch.Tensor) -> torch.Tensor:
        """θ_k = θ^pre + U Vᵀ z_k for each row of ``z`` (K, d): (K, *the layer's shape)."""
        return (self.pre + self.deltas(z).to(self.pre.dtype)).reshape(-1, *self.shape)


class LatentMapping(nn.Module):
    """A frozen model whose mapped weights are θ_l^pre + U_l V_lᵀ z_l; only the z_l train.

    Args:
        model: the pretrained model; it is frozen (``requires_grad_(False)``) and its own
            values of the mapped weights are snapshotted here and no longer read.
        d: latent size per mapped layer, or ``{parameter name: d_l}`` naming every mapped layer.
        r: rank of the factors (r <= d_l and r <= P_l).
        seed: the 64-bit seed all factors derive from (same seed => same factors everywhere).
        layers: fnmatch patterns over parameter names; None maps every conv weight.
        mode: ``"stored"`` keeps U_l; ``"regenerated"`` rebuilds it from the seed per pass.
    """

    def __init__(self, model: nn.Module, *, d: int | dict[str, int] = 64, r: int = 32,
                 seed: int, layers: list[str] | None = None,
                 mode: Literal["stored", "regenerated"] = "stored"):
        super().__init__()
        if mode not in MODES:
            raise ConfigError("algorithm.mode", mode, "one of " + ", ".join(MODES))
        seed = check_seed(seed)
        names = mapped_layers(model, layers)
        dims, d_paths = _per_layer_d(d, names)
        params = dict(model.named_parameters())
        for name in names:  # validate every layer before generating any factor
            check_dims(name, params[name].numel(), dims[name], r, d_paths[name])

        self.model = model.requires_grad_(False)
        self.mode, self.seed, self.r = mode, seed, r
        self.chunk_rows = _factors.CHUNK_ROWS  # fixed now: the factors depend on it
        self.maps = nn.ModuleList(
            _MappedLayer(name, params[name],
                         LayerFactors(seed, i, params[name].numel(), dims[name], r,
                                      self.chunk_rows, name), mode)
            for i, name in enumerate(names))

    # ------------------------------------------------------------------------- forward

    def _weights(self, latents: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        return {m.name: m.weight(z) for m, z in zip(self.maps, latents, strict=True)}

    def stacked_weights(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: (K, *shape)}: every mapped layer's weights for each row of a cohort's
        stacked flat latents ``z`` (K, D), differentiable in ``z`` (each layer one batched
        product, :meth:`_MappedLayer.deltas`)."""
        parts = z.split([m.factors.d for m in self.maps], dim=1)
        return {m.name: m.weights(part) for m, part in zip(self.maps, parts, strict=True)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The wrapped model on ``x`` with the generated mapped weights (other params and
        buffers are the model's own). Autograd reaches the latents only."""
        weights = self._weights([m.z for m in self.maps])
        return functional_call(self.model, weights, (x,))

    # ------------------------------------------------------------------------- latents

    def latent_parameters(self) -> list[nn.Parameter]:
        """The trainable latents z_l, in layer order (what an optimiser should get)."""
        return [m.z for m in self.maps]

    def latent_layout(self) -> list[tuple[str, int]]:
        """(parameter name, d_l) per mapped layer, in the order of :meth:`latent_vector`."""
        return [(m.name, m.factors.d) for m in self.maps]

    @property
    def D(self) -> int:
        """Total latent size Σ_l d_l: the per-round payload in floats (§3.6)."""
        return sum(m.factors.d for m in self.maps)

    @property
    def num_mapped_parameters(self) -> int:
        """Σ_l P_l, the number of weights generated from the latent."""
        return sum(m.factors.P for m in self.maps)

    def latent_vector(self) -> torch.Tensor:
        """The latents concatenated in layer order: a detached (D,) float32 tensor."""
        return torch.cat([m.z.detach() for m in self.maps])

    def set_latent_vector(self, z: np.ndarray | torch.Tensor) -> None:
        """Load a flat (D,) latent (e.g. the server's average) into the z_l."""
        with torch.no_grad():
            for m, part in zip(self.maps, self._split(z), strict=True):
                m.z.copy_(part)

    def _split(self, z: np.ndarray | torch.Tensor) -> list[torch.Tensor]:
        device = self.maps[0].z.device
        flat = torch.as_tensor(z, dtype=torch.float32, device=device)
        if flat.shape != (self.D,):
            raise ValueError(f"expected a flat latent of shape ({self.D},), got "
                             f"{tuple(flat.shape)}")
        return list(flat.split([m.factors.d for m in self.maps]))

    @torch.no_grad()
    def generated_weights(self, z: np.ndarray | torch.Tensor | None = None
                          ) -> dict[str, torch.Tensor]:
        """{name: θ_l(z_l)} for a flat latent ``z`` (default: the current latents).

        Used to check the averaging identity (Eq. 4): mean_k θ(z_k) == θ(mean_k z_k).
        """
        latents = [m.z for m in self.maps] if z is None else self._split(z)
        return self._weights(latents)

    # ------------------------------------------------------------------------- memory

    def factor_bytes(self) -> int:
        """Bytes of factor tensors held: U_l and V_l (stored) or V_l and R_l (regenerated)."""
        return sum(buf.numel() * buf.element_size() for m in self.maps
                   for key, buf in m.named_buffers() if key in ("U", "V", "R"))

    def extra_repr(self) -> str:
        return (f"mode={self.mode!r}, layers={len(self.maps)}, D={self.D}, r={self.r}, "
                f"mapped_parameters={self.num_mapped_parameters}")


def _per_layer_d(d: int | dict[str, int], names: list[str]
                 ) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: d_l} and the config path to blame for each, from an int or a per-layer dict."""
    if isinstance(d, dict):
        if set(d) != set(names):
            raise ConfigError("algorithm.d", d, f"a dict naming exactly the mapped layers {names}")
        return dict(d), {name: f"algorithm.d.{name}" for name in names}
    return {name: d for name in names}, {name: "algorithm.d" for name in names}
