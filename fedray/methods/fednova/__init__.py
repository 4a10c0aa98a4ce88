"""FedNova (Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem
in Heterogeneous Federated Optimization", NeurIPS 2020), written once on the
local-training engine (:mod:`fedray.methods.engine`): client by client or as a vectorized
cohort from the same hooks.

Clients that take different numbers of local steps τ_i pull FedAvg's mean towards the
clients that took more. FedNova normalises each update by the norm of its local
aggregation vector a_i before averaging, then rescales by the effective step count:

    x ← x + τ_eff Σ_i p_i Δ_i / ‖a_i‖₁,      τ_eff = Σ_i p_i ‖a_i‖₁,      p_i = n_i / Σ_j n_j,

with ‖a_i‖₁ = τ_i for local SGD and, with momentum ρ (``local.momentum``; the buffer fresh
each round), ‖a_i‖₁ = (τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)) / (1 − ρ) (§5, Eq. 14's momentum case).
The server steps with τ_eff's choice of §4 (the paper's default); the result is handed to
the server optimizer (η = 1: the paper's update). Each client uploads Δ_i and its τ_i as
the integer ``fednova.steps`` (exact under every codec, 8 bytes), so the server computes
‖a_i‖₁ itself. A client that took no step contributes nothing (its ‖a_i‖₁ = 0).
``algorithm.weighted=false`` takes p_i = 1/|S|. Local weight decay is the engine's and is
not part of a_i (as in the paper's analysis, which has none). The plain-PyTorch reference
is ``tests/reference/fednova.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import ConfigError
from fedray.methods.base import (
    AggregationPolicy,
    State,
    accumulate,
)
from fedray.methods.fedavg.method import FedAvg
from fedray.services.server_opt import ServerOptimizer, norm

STEPS = "fednova.steps"


def a_norm(steps: int, momentum: float) -> float:
    """‖a_i‖₁ of τ_i = ``steps`` local SGD steps with momentum ρ (FedNova §5)."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


class FedNovaPolicy(AggregationPolicy):
    """Normalised averaging: Σ p_i Δ_i/‖a_i‖₁ scaled by τ_eff, to the server optimizer."""

    def __init__(self, optimizer: ServerOptimizer, momentum: float, weighted: bool = True):
        self.optimizer, self.momentum, self.weighted = optimizer, momentum, weighted

    def aggregate(self, global_state: State, updates: list[tuple[int, int, State]],
                  round: int) -> tuple[State, dict[str, float]]:
        counts = np.array([n for _, n, _ in updates], np.float64)
        p = counts / counts.sum() if self.weighted and counts.sum() > 0 else \
            np.full(len(updates), 1 / len(updates))
        a = np.array([a_norm(int(np.asarray(u[STEPS]).reshape(-1)[0]), self.momentum)
                      for _, _, u in updates])
        tau_eff = float(p @ a)
        w = np.where(a > 0, p / np.where(a > 0, a, 1.0), 0.0) * tau_eff
        mean: State = {}
        for (_, _, u), wi in zip(updates, w, strict=True):  # client-id order, float64
            accumulate(mean, {k: v for k, v in u.items() if k != STEPS}, float(wi))
        new, metrics = self.optimizer.step(global_state, mean)
        return new, {"update_norm": norm(mean), "tau_eff": tau_eff, **metrics}


@register_method
class FedNova(FedAvg):
    """FedAvg's clients, each update normalised by its local steps."""

    name = "fednova"
    capabilities = frozenset({"vectorizable", "server_optimizer", "multilabel",
                              "before_after", "finetune"})

    @classmethod
    def check(cls, cfg: Any) -> None:
        super().check(cfg)
        if cfg.local.keep_optimizer_state and cfg.local.momentum:
            raise ConfigError("local.keep_optimizer_state", True,
                              "false for fednova: ‖a_i‖₁ assumes a fresh momentum buffer "
                              "each round")

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return False

    def upload(self, broadcast: State, trained: State, own: State | None,
               steps: np.ndarray) -> State:
        """Δ_i and τ_i (``fednova.steps``, int64)."""
        return {**super().upload(broadcast, trained, own, steps),
                STEPS: steps.astype(np.int64).reshape(-1, 1)}

    def make_policy(self) -> FedNovaPolicy:
        return FedNovaPolicy(self.make_optimizer(), self.cfg.local.momentum,
                             self.params.weighted)
