"""Asynchronous aggregation: FedBuff (Nguyen et al., AISTATS 2022) and FedAsync (Xie, Koyejo
and Gupta, 2019). The clients are FedAvg's; these are server rules the runtime drives from
an event queue in simulated time (:meth:`fedray.runtime.driver.Driver.run_async_step`):
``concurrency`` clients train at once, each starting from the global state current when it
was dispatched; uploads arrive in order of simulated finish time; a client's staleness τ is
the number of server steps taken since it downloaded its model. One ``round`` of these
methods is one server step.

FedBuff (Algorithm 1 of the paper, with our Δ_i = θ_i − θ_start the negative of its client
delta): buffer ``K`` uploads, then

    θ ← θ + η_g · (1/K) Σ_i s(τ_i) Δ_i,    s(τ) = 1 / √(1 + τ).

That divides by K whatever the staleness: a stale buffer moves θ less. FLSim (the FedBuff
authors' library) defaults instead to the staleness-weighted average Σ_i s(τ_i) Δ_i / Σ_i s(τ_i),
a step 1/mean(s) larger; ``algorithm.reducer=weighted`` runs that one (default ``buffer``,
the paper's Algorithm 1).

FedAsync (Xie et al., eq. 2 with the polynomial staleness function; the clients run plain
local SGD, i.e. without the paper's optional proximal term ρ): every upload is applied at
once as

    θ ← (1 − α_t) θ + α_t θ_i,    α_t = α · (1 + τ)^(−a),    θ_i = θ_start + Δ_i.

Both are pure numpy (float64 accumulation, arrival order), so the final state is bitwise
the same whatever the executor count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import ConfigError, spec
from fedray.methods.base import AggregationPolicy, AsyncUpdate, State, add_weighted
from fedray.methods.fedavg import FedAvg
from fedray.services.server_opt import SGD


def fedbuff_weight(staleness: int | np.ndarray) -> np.ndarray:
    """FedBuff's staleness weight s(τ) = 1/√(1+τ)."""
    return 1.0 / np.sqrt(1.0 + np.asarray(staleness, dtype=np.float64))


def fedasync_mixing(alpha: float, a: float, staleness: int | np.ndarray) -> np.ndarray:
    """FedAsync's mixing weight α_t = α (1+τ)^(−a) (polynomial staleness)."""
    return alpha * (1.0 + np.asarray(staleness, dtype=np.float64)) ** (-a)


def _check(cfg: Any, name: str, concurrency: int) -> None:
    """What an asynchronous rule needs of the config: no synchronous-round fleet rules, and
    no more clients in flight than the population."""
    if cfg is None:
        return
    if concurrency > cfg.clients.num_clients:
        raise ConfigError("algorithm.concurrency", concurrency,
                          f"at most clients.num_clients = {cfg.clients.num_clients}")
    from fedray.core.config import check_unread

    rule = "a rule of synchronous rounds"
    in_flight = f"algorithm.concurrency = {concurrency} clients are always in flight"
    check_unread(cfg.fleet, "fleet", {"deadline_s": rule, "overcommit": rule, "min_reports": rule},
                 name)
    check_unread(cfg.clients, "clients", {"fraction": in_flight, "per_round": in_flight}, name)
    check_unread(cfg.runtime, "runtime", {"min_accepted": "an asynchronous rule has no "
                                                          "rounds to fail"}, name)


def fedbuff_coefficients(staleness: list[int] | np.ndarray, reducer: str = "buffer"
                         ) -> np.ndarray:
    """Each buffered update's coefficient in the pseudo-gradient: s(τ_k)/K (``buffer``: the
    paper's Algorithm 1) or s(τ_k)/Σ_j s(τ_j) (``weighted``: FLSim's default)."""
    s = fedbuff_weight(staleness)
    if reducer == "weighted":
        return s / s.sum()
    if reducer != "buffer":
        raise ValueError(f"reducer must be 'buffer' or 'weighted', got {reducer!r}")
    return s / len(s)


class FedBuffPolicy(AggregationPolicy):
    """The buffer's staleness-weighted reduction (:func:`fedbuff_coefficients`) is the
    pseudo-gradient of the server step, applied by the run's server optimizer (η_g Δ with
    ``sgd``, the paper's)."""

    def __init__(self, concurrency: int, buffer_size: int, optimizer: Any = None,
                 reducer: str = "buffer"):
        self.concurrency, self.buffer_size, self.reducer = concurrency, buffer_size, reducer
        self.optimizer = optimizer if optimizer is not None else SGD.of()

    def aggregate_async(self, global_state: State, updates: list[AsyncUpdate], step: int
                        ) -> tuple[State, dict[str, float]]:
        w = fedbuff_coefficients([u.staleness for u in updates], self.reducer)
        delta = {}
        for k in updates[0].upload:
            acc = np.zeros(np.shape(global_state[k]), dtype=np.float64)
            for wi, u in zip(w, updates, strict=True):
                add_weighted(acc, u.upload[k], wi)
            delta[k] = acc
        new, metrics = self.optimizer.step(global_state, delta)
        return new, {"mean_weight": float(w.sum()), **metrics}


class FedAsyncPolicy(AggregationPolicy):
    buffer_size = 1

    def __init__(self, concurrency: int, alpha: float, a: float):
        self.concurrency, self.alpha, self.a = concurrency, alpha, a

    def aggregate_async(self, global_state: State, updates: list[AsyncUpdate], step: int
                        ) -> tuple[State, dict[str, float]]:
        new = dict(global_state)
        mix = 0.0
        for u in updates:
            mix = float(fedasync_mixing(self.alpha, self.a, u.staleness))
            for k, d in u.upload.items():
                local = u.base[k].astype(np.float64) + d
                new[k] = ((1 - mix) * new[k].astype(np.float64) + mix * local).astype(
                    global_state[k].dtype)
        return new, {"mixing": mix}


@dataclass
class FedBuffParams:
    concurrency: int = spec(10, ge=1, help="clients training at once (C)")
    buffer_size: int = spec(5, ge=1, help="uploads per server step (K)")
    reducer: Literal["buffer", "weighted"] = spec(
        "buffer", help="buffer: Σ s(τ)Δ / K, the paper's Algorithm 1 (a stale buffer steps "
                       "less); weighted: Σ s(τ)Δ / Σ s(τ), FLSim's default (a step "
                       "1/mean(s) larger)")

    def validate(self, cfg: Any) -> None:
        _check(cfg, "fedbuff", self.concurrency)
        if cfg is not None and self.buffer_size > cfg.clients.num_clients:
            raise ConfigError("algorithm.buffer_size", self.buffer_size,
                              f"at most clients.num_clients = {cfg.clients.num_clients} (a "
                              f"server step takes each client's upload at most once)")


@dataclass
class FedAsyncParams:
    concurrency: int = spec(10, ge=1, help="clients training at once (C)")
    mixing: float = spec(0.6, gt=0, le=1, help="mixing weight α")
    staleness_exponent: float = spec(0.5, ge=0, help="a in α (1+τ)^(−a)")

    def validate(self, cfg: Any) -> None:
        _check(cfg, "fedasync", self.concurrency)


@register_method
class FedBuff(FedAvg):
    """FedAvg clients, buffered asynchronous server with staleness weights (FedBuff)."""

    name = "fedbuff"
    Params = FedBuffParams
    capabilities = frozenset(FedAvg.capabilities - {"linear", "vectorizable", "robust"}
                             | {"asynchronous"})

    @classmethod
    def dp_cohort(cls, cfg: Any) -> tuple[int, int]:
        """Central DP releases one noisy buffer sum per server step; the buffer fills with
        whoever finishes first (no uniform sampling): B of B, no amplification."""
        b = int(cfg.algorithm.get("buffer_size") or FedBuffParams().buffer_size)
        return b, b

    def make_policy(self) -> FedBuffPolicy:
        p = self.params
        return FedBuffPolicy(p.concurrency, p.buffer_size, self.make_optimizer(), p.reducer)


@register_method
class FedAsync(FedAvg):
    """FedAvg clients, every upload mixed in at once with polynomial staleness (FedAsync)."""

    name = "fedasync"
    Params = FedAsyncParams
    renamed_keys = {"alpha": "mixing"}
    # every upload is mixed in with its own staleness weight: no server optimizer
    capabilities = frozenset(FedAvg.capabilities - {"linear", "server_optimizer", "vectorizable",
                                                     "robust"}
                             | {"asynchronous"})
    server_optimizer = None

    @classmethod
    def dp_cohort(cls, cfg: Any) -> tuple[int, int]:
        """Every upload is its own server step: one of one, no amplification."""
        return 1, 1

    def make_policy(self) -> FedAsyncPolicy:
        p = self.params
        return FedAsyncPolicy(p.concurrency, p.mixing, p.staleness_exponent)


__all__ = ["FedAsync", "FedAsyncPolicy", "FedBuff", "FedBuffPolicy", "fedasync_mixing",
           "fedbuff_weight"]
