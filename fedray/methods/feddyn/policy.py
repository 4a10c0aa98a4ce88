"""FedDyn's server half (Acar et al. 2021, Algorithm 1): pure numpy, no torch (the driver
aggregates without it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.methods.base import AggregationPolicy, State
from fedray.methods.fedavg.policy import weighted_mean


class FedDynPolicy(AggregationPolicy):
    """FedDyn's server half: the uniform (or weighted) mean of the uploads plus the drift
    correction −h^t/α, h checkpointed."""

    def __init__(self, alpha: float, population: int, weighted: bool = False):
        self.alpha, self.population, self.weighted = alpha, population, weighted
        self.h: dict[str, np.ndarray] = {}

    def aggregate(self, global_state: State, updates: list[tuple[int, int, State]],
                  round: int) -> tuple[State, dict[str, float]]:
        mean = weighted_mean(updates, self.weighted)
        total = weighted_mean(updates, False) if self.weighted else mean  # uniform
        scale = self.alpha * len(updates) / self.population  # α/m · Σ = α/m · |P_t| · mean
        new = dict(global_state)
        for k, m in mean.items():
            h = self.h.get(k, np.zeros(m.shape)) - scale * total[k]
            self.h[k] = h
            theta = np.asarray(global_state[k], np.float64)
            new[k] = (theta + m - h / self.alpha).astype(np.asarray(global_state[k]).dtype)
        h_norm = float(np.sqrt(sum(float((h ** 2).sum()) for h in self.h.values())))
        return new, {"h_norm": h_norm}

    def state_dict(self) -> dict[str, Any]:
        return {"h": dict(self.h)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.h = {k: np.asarray(v, np.float64) for k, v in state.get("h", {}).items()}
