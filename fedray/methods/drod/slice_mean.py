"""Per-coordinate aggregation for nested sub-models (HeteroFL, FjORD, FedRolex, DROD).

Each tier receives only its sub-model (the full state gathered through the tier's
selection) and uploads the update of exactly those coordinates. The new value of every
coordinate is the sample-weighted mean update over the clients that hold it; a coordinate
nobody holds keeps its value (DROD §3: "a coordinate that only the wider tiers instantiate
is averaged over just those clients that hold it"):

    θ_t[c] = θ_{t−1}[c] + Σ_{i ∋ c} n_i Δ_i[c] / Σ_{i ∋ c} n_i.

Clients of one tier share a selection, so updates are summed per tier (float64, client-id
order) and each tier's sum is scattered once. :class:`FiarsePolicy` adds FIARSE's magnitude
mask on top of the structural selection: a coordinate is held by a tier only where the
tier's mask keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedray.methods.base import AggregationPolicy, State
from fedray.methods.drod.selection import Rule, Shapes, gather, scatter_add, selection
from fedray.models.geometry import Arch, Geometry


class SliceMeanPolicy(AggregationPolicy):
    def __init__(self, arch: Arch, hw: tuple[int, int], geometries: dict[str, Geometry],
                 tier_of: Callable[[int], str], rule: Rule = "prefix", weighted: bool = True,
                 shapes: dict[str, Shapes] | None = None):
        """``shapes``: each tier's held (name, shape) list (``fedray.models.sliceable.held``),
        given by the method so the server cuts states without building a torch model."""
        self.arch, self.hw, self.geometries = arch, hw, geometries
        self.shapes = shapes or {}
        self.tier_of, self.rule, self.weighted = tier_of, rule, weighted

    def selection(self, tier: str, round: int):
        return selection(self.arch, self.geometries[tier], self.rule, round)

    def broadcast(self, global_state: State, round: int, tier: str) -> State:
        return gather(self.arch, self.hw, global_state, self.geometries[tier],
                      self.selection(tier, round), self.shapes.get(tier))

    def expand(self, tier: str, update: State, global_state: State, round: int
               ) -> tuple[State, State]:
        """(compact update, where the tier holds it): the identity here — every uploaded
        coordinate is held."""
        return update, {k: np.ones(v.shape) for k, v in update.items()}

    def aggregate(self, global_state, updates, round):
        by_tier: dict[str, tuple[dict[str, np.ndarray], float]] = {}
        for cid, n, up in updates:
            tier = self.tier_of(cid)
            w = float(n) if self.weighted else 1.0
            acc, total = by_tier.get(tier, ({}, 0.0))
            for k, v in up.items():
                acc[k] = acc[k] + w * v.astype(np.float64) if k in acc else \
                    w * v.astype(np.float64)
            by_tier[tier] = (acc, total + w)
        num = {k: np.zeros(v.shape) for k, v in global_state.items()}
        den = {k: np.zeros(v.shape) for k, v in global_state.items()}
        for tier in sorted(by_tier):
            acc, total = by_tier[tier]
            acc, where = self.expand(tier, acc, global_state, round)
            sel = self.selection(tier, round)
            scatter_add(self.arch, num, acc, sel)
            scatter_add(self.arch, den, where, sel, total)
        new, covered = {}, 0
        for k, v in global_state.items():
            held = den[k] > 0
            covered += int(held.sum())
            step = np.divide(num[k], den[k], out=np.zeros_like(num[k]), where=held)
            new[k] = (v.astype(np.float64) + step).astype(v.dtype)
        total = sum(v.size for v in global_state.values())
        return new, {"coverage": covered / total, "tiers": float(len(by_tier))}


class FiarsePolicy(SliceMeanPolicy):
    """FIARSE (Wu et al. 2024) on a structural axis: each tier receives its structural
    sub-model with every conv/linear weight masked to its largest-magnitude entries
    (:func:`fedray.methods.drod.selection.fiarse_masks`, recomputed from the current global
    weights each round), uploads only the kept entries' updates (flat, in mask order), and each
    entry is averaged over the clients whose mask held it. The broadcast travels dense (masked
    entries as zeros): a real deployment would send values and a bitmap, so the download
    bytes are an upper bound; the upload bytes are exact."""

    def __init__(self, *args, keep: dict[str, float], **kw):
        super().__init__(*args, **kw)
        self.keep = keep

    def _masks(self, tier: str, compact: State) -> dict[str, np.ndarray]:
        from fedray.methods.drod.selection import fiarse_masks

        return fiarse_masks(compact, self.keep[tier])

    def broadcast(self, global_state: State, round: int, tier: str) -> State:
        out = super().broadcast(global_state, round, tier)
        for k, m in self._masks(tier, out).items():
            out[k] = np.where(m, out[k], 0).astype(out[k].dtype)
        return out

    def expand(self, tier, update, global_state, round):
        masks = self._masks(tier, self.broadcast(global_state, round, tier))
        dense, where = {}, {}
        for k, v in update.items():
            if k in masks:
                dense[k] = np.zeros(masks[k].shape)
                dense[k][masks[k]] = v
                where[k] = masks[k].astype(np.float64)
            else:
                dense[k], where[k] = v, np.ones(v.shape)
        return dense, where
