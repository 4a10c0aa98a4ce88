"""Server-optimizer presets of FedAvg: FedAvgM (Hsu, Qi and Brown, 2019, "Measuring the
effects of non-identical data distribution for federated visual classification",
Algorithm 1) and FedAdam, FedYogi, FedAdagrad (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2).

Each is FedAvg's clients and aggregation rule with its server optimizer fixed
(:mod:`fedray.services.server_opt`): ``algorithm.name=fedadam`` is ``algorithm.name=fedavg`` with
``server.optimizer=adam``, and its hyperparameters are ``server.*`` (``server.lr``,
``server.beta1``, …; ``server.momentum`` for FedAvgM). The optimizer's state (FedAvgM's
velocity, the moments m and v) is its own part of the checkpoint, restored on ``--resume``.

This package is the whole of the four — registered by their decorators, found by the
registry; nothing outside it names them.
"""

from __future__ import annotations

from typing import Any

from fedray.core.registry import register_method
from fedray.methods.fedavg import FedAvg

FEDAVG_ONLY = frozenset(FedAvg.capabilities - {"server_optimizer"})


@register_method
class FedAvgM(FedAvg):
    """FedAvg clients, server momentum: v ← β v + Δ, θ ← θ + η v (``server.momentum`` β,
    ``server.lr`` η)."""

    name = "fedavgm"
    capabilities = FEDAVG_ONLY
    server_optimizer = "momentum"

    @classmethod
    def upgrade_config(cls, algorithm: dict[str, Any], server: dict[str, Any]) -> None:
        """A config stored before the server optimizers: ``algorithm.momentum`` is
        ``server.momentum`` now."""
        if "momentum" in algorithm:
            server["momentum"] = algorithm.pop("momentum")


@register_method
class FedAdam(FedAvg):
    """FedAvg clients, Adam on the server (FedAdam)."""

    name = "fedadam"
    capabilities = FEDAVG_ONLY
    server_optimizer = "adam"


@register_method
class FedYogi(FedAvg):
    """FedAvg clients, Yogi on the server (FedYogi)."""

    name = "fedyogi"
    capabilities = FEDAVG_ONLY
    server_optimizer = "yogi"


@register_method
class FedAdagrad(FedAvg):
    """FedAvg clients, Adagrad on the server (FedAdagrad)."""

    name = "fedadagrad"
    capabilities = FEDAVG_ONLY
    server_optimizer = "adagrad"


__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi"]
