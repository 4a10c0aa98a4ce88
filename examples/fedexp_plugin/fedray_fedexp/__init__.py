"""FedExP (Jhunjhunwala, Wang and Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation", ICLR 2023) as a fedray plugin: FedAvg's clients, and a server that
extrapolates along the mean update with an adaptive step (Algorithm 1):

    Δ̄ = (1/M) Σ_i Δ_i,   η_g = max(1, Σ_i ‖Δ_i‖² / (2 M (‖Δ̄‖² + ε))),   θ ← θ + η_g Δ̄

over the M clients of the round (an unweighted mean, as in the paper). Installed, the
``fedray.plugins`` entry point imports this module and ``@register_method`` makes
``algorithm.name=fedexp`` known to every fedray command, its ``epsilon`` listed by
``fedray config --keys`` and checked when a config loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import spec
from fedray.methods.fedavg import FedAvg
from fedray.methods.fedavg.policy import FedAvgPolicy, weighted_mean


def squared_norm(update: dict[str, np.ndarray]) -> float:
    """‖Δ‖² over every tensor of an update, in float64."""
    return float(sum(np.sum(np.square(v, dtype=np.float64)) for v in update.values()))


def fedexp_step_size(updates: list[dict[str, np.ndarray]], mean: dict[str, np.ndarray],
                     epsilon: float) -> float:
    """η_g = max(1, Σ_i ‖Δ_i‖² / (2 M (‖Δ̄‖² + ε))) — FedExP's Algorithm 1."""
    total = sum(squared_norm(u) for u in updates)
    return max(1.0, total / (2 * len(updates) * (squared_norm(mean) + epsilon)))


class FedExPPolicy(FedAvgPolicy):
    """The server half: the unweighted mean, scaled by η_g, applied by the server optimizer
    (``sgd`` with ``server.lr`` 1 by default)."""

    def __init__(self, optimizer: Any, epsilon: float):
        super().__init__(optimizer, weighted=False)
        self.epsilon = epsilon

    def aggregate(self, global_state, updates, round):
        mean = weighted_mean(updates, weighted=False)
        eta = fedexp_step_size([u for _, _, u in updates], mean, self.epsilon)
        new, metrics = self.step(global_state, {k: eta * v for k, v in mean.items()})
        return new, {**metrics, "fedexp_step": eta}


@register_method
class FedExP(FedAvg):
    """FedAvg's clients, FedExP's extrapolating server."""

    name = "fedexp"
    capabilities = frozenset({"transforms", "client_state", "server_optimizer", "vectorizable",
                              "before_after", "finetune"})

    @dataclass
    class Params:
        epsilon: float = spec(1e-3, gt=0, help="ε in FedExP's step size: keeps the ratio "
                                               "finite when the mean update vanishes")

    def make_policy(self) -> FedExPPolicy:
        return FedExPPolicy(self.make_optimizer(), self.params.epsilon)
