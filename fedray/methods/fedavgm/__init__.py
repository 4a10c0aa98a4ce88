"""FedAvgM — FedAvg with server momentum (Hsu, Qi and Brown, 2019, "Measuring the effects of
non-identical data distribution for federated visual classification", Algorithm 1).

The clients are FedAvg's. The server treats the weighted mean update Δ_t = Σ_i w_i Δ_i as
a (negative) pseudo-gradient and keeps a momentum buffer:

    v_t = β v_{t−1} + Δ_t,        θ_{t+1} = θ_t + η_s v_t,

with v_0 = 0, so β = 0 is exactly FedAvg with server learning rate η_s. The buffer is
policy state: it is checkpointed with the round and restored on ``--resume``. Tensors a
round's clients did not upload (a frozen head) keep their buffer and their value.

This package is the whole method — registered by its decorator, found by the registry;
nothing outside it names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.methods.base import AggregationPolicy, State
from fedray.methods.fedavg import FedAvg, FedAvgParams, weighted_mean
from fedray.registry import register_method
from fedray.spec import spec


@dataclass
class FedAvgMParams(FedAvgParams):
    momentum: float = spec(0.9, ge=0, lt=1, help="server momentum β (0: FedAvg)")


class FedAvgMPolicy(AggregationPolicy):
    """θ ← θ + η_s v, v ← β v + Σ_i w_i Δ_i (float64 buffer, client-id-order sums)."""

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9, weighted: bool = True):
        self.server_lr, self.momentum, self.weighted = server_lr, momentum, weighted
        self.velocity: dict[str, np.ndarray] = {}

    linear = True

    def weight(self, num_samples: int) -> float:
        return float(num_samples) if self.weighted else 1.0

    def aggregate(self, global_state: State, updates: list[tuple[int, int, State]],
                  round: int) -> tuple[State, dict[str, float]]:
        return self.step(global_state, weighted_mean(updates, self.weighted))

    def aggregate_sum(self, global_state, total, weight, round):
        return self.step(global_state, {k: v / weight for k, v in total.items()})

    def step(self, global_state: State, mean: State) -> tuple[State, dict[str, float]]:
        new = dict(global_state)
        for k, d in mean.items():
            v = self.momentum * self.velocity.get(k, 0.0) + d
            self.velocity[k] = v
            new[k] = (global_state[k].astype(np.float64) + self.server_lr * v).astype(
                global_state[k].dtype)
        norm = float(np.sqrt(sum(float((v * v).sum()) for v in self.velocity.values())))
        return new, {"velocity_norm": norm}

    def state_dict(self) -> dict[str, Any]:
        return {"velocity": dict(self.velocity)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.velocity = {k: np.asarray(v, dtype=np.float64)
                         for k, v in (state.get("velocity") or {}).items()}


@register_method
class FedAvgM(FedAvg):
    """FedAvg clients, server momentum (FedAvgM)."""

    name = "fedavgm"
    Params = FedAvgMParams

    def make_policy(self) -> FedAvgMPolicy:
        p = self.params
        return FedAvgMPolicy(p.server_lr, p.momentum, p.weighted)


__all__ = ["FedAvgM", "FedAvgMParams", "FedAvgMPolicy"]
