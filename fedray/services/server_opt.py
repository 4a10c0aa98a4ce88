"""Server optimizers: the step from a round's pseudo-gradient Δ_t to the next global model.

An aggregation rule (FedAvg's weighted mean, ORDERS' rank-weighted sum, FedBuff's
staleness-weighted buffer) produces the round's pseudo-gradient Δ_t — the direction the
clients moved, ``+`` the update, not the gradient's sign — and a ``ServerOptimizer``
applies it, carrying its own state (``state_dict`` / ``load_state_dict``, checkpointed
with the policy). Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2,
and Hsu et al. 2019 (FedAvgM):

    sgd       x_{t+1} = x_t + η Δ_t
    momentum  v_t = β v_{t−1} + Δ_t,  x_{t+1} = x_t + η v_t                 (FedAvgM)
    adagrad   m_t = β1 m_{t−1} + (1 − β1) Δ_t,  v_t = v_{t−1} + Δ_t²
    adam      m_t as above,  v_t = β2 v_{t−1} + (1 − β2) Δ_t²
    yogi      m_t as above,  v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)
              x_{t+1} = x_t + η m_t / (√v_t + τ)                           (the three)

with m_{−1} = 0 and v_{−1} = τ² (Algorithm 2 asks v_{−1} ≥ τ²; ``initial_accumulator``
sets another value: Flower starts at 0). Defaults: β1 = 0.9, β2 = 0.99, τ = 1e-3 (the
paper's fixed choices), η = 1e-2 for the adaptive rules (the paper tunes η per task);
FedAdagrad takes β1 = 0 (Adagrad without momentum, as Flower's FedAdagrad). Algorithm 2
has no bias correction; ``adam.bias_correction`` multiplies η by √(1 − β2^t) / (1 − β1^t),
t = the optimizer's step count from 1 (Flower's FedAdam applies it always, with t = server
round + 1). Everything is float64; a tensor the round did not update keeps its value and
its state; the new value is cast back to the tensor's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedray.core.spec import spec

State = dict[str, np.ndarray]
OPTIMIZERS: dict[str, type[ServerOptimizer]] = {}


def register_optimizer(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
    """Class decorator: make ``cls`` the server optimizer ``cls.name``."""
    if OPTIMIZERS.get(cls.name, cls) is not cls:
        raise TypeError(f"server optimizer {cls.name!r} is taken")
    OPTIMIZERS[cls.name] = cls
    return cls


def norm(tensors: State) -> float:
    """The L2 norm of all tensors together, in float64."""
    return float(np.sqrt(sum(float((t * t).sum()) for t in tensors.values())))


class ServerOptimizer:
    """``step(params, delta) -> (new params, metrics)``; ``params`` are not modified."""

    name: ClassVar[str]
    Params: ClassVar[type]

    def __init__(self, params: Any):
        self.params = params

    @classmethod
    def of(cls, **params: Any) -> ServerOptimizer:
        """``cls`` with these hyperparameters (the others at their defaults)."""
        return cls(cls.Params(**params))

    def step(self, params: State, delta: State) -> tuple[State, dict[str, float]]:
        """The next global state from ``params`` and the rule's pseudo-gradient ``delta``
        (the aggregated update, pointing the way the clients moved), and the step's
        metrics (e.g. ``server_update_norm``)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's moments across rounds (its own part of the checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (on resume)."""


def _apply(params: State, direction: State, lr: float) -> State:
    """x + η d in float64, cast back to each tensor's dtype; tensors without d kept."""
    return {k: (v.astype(np.float64) + lr * np.asarray(direction[k], np.float64)).astype(
        v.dtype) if k in direction else v for k, v in params.items()}


@dataclass
class SGDParams:
    lr: float = spec(1.0, gt=0, help="server learning rate η")


@register_optimizer
class SGD(ServerOptimizer):
    """x ← x + η Δ (FedAvg's server step; η = 1 is McMahan et al.'s)."""

    name = "sgd"
    Params = SGDParams

    def step(self, params: State, delta: State) -> tuple[State, dict[str, float]]:
        return _apply(params, delta, self.params.lr), {}


@dataclass
class MomentumParams:
    lr: float = spec(1.0, gt=0, help="server learning rate η")
    momentum: float = spec(0.9, ge=0, lt=1, help="server momentum β (0: sgd)")


@register_optimizer
class Momentum(ServerOptimizer):
    """v ← β v + Δ, x ← x + η v (FedAvgM, Hsu et al. 2019, Algorithm 1; v_0 = 0)."""

    name = "momentum"
    Params = MomentumParams

    def __init__(self, params: Any):
        super().__init__(params)
        self.velocity: State = {}

    def step(self, params: State, delta: State) -> tuple[State, dict[str, float]]:
        for k, d in delta.items():
            d = np.asarray(d, dtype=np.float64)
            self.velocity[k] = self.params.momentum * self.velocity.get(k, 0.0) + d
        new = _apply(params, {k: self.velocity[k] for k in delta}, self.params.lr)
        return new, {"velocity_norm": norm(self.velocity)}

    def state_dict(self) -> dict[str, Any]:
        return {"velocity": dict(self.velocity)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.velocity = {k: np.asarray(v, dtype=np.float64)
                         for k, v in (state.get("velocity") or {}).items()}


@dataclass
class AdagradParams:
    lr: float = spec(1e-2, gt=0, help="server learning rate η")
    beta1: float = spec(0.0, ge=0, lt=1, help="first-moment decay β1")
    tau: float = spec(1e-3, gt=0, help="adaptivity τ (added to √v)")
    initial_accumulator: float | None = spec(
        None, ge=0, help="v_{-1} (default τ², Reddi et al. Algorithm 2; Flower starts at 0)")


@dataclass
class YogiParams(AdagradParams):
    beta1: float = spec(0.9, ge=0, lt=1, help="first-moment decay β1")
    beta2: float = spec(0.99, ge=0, lt=1, help="second-moment decay β2")


@dataclass
class AdamParams(YogiParams):
    bias_correction: bool = spec(False, help="scale η by √(1−β2^t)/(1−β1^t) (Adam's; not in "
                                             "Algorithm 2, always on in Flower)")


class Adaptive(ServerOptimizer):
    """The FedOpt family: first moment m, second moment v, x ← x + η m / (√v + τ)."""

    def __init__(self, params: Any):
        super().__init__(params)
        self.m: State = {}
        self.v: State = {}
        self.t = 0

    def second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def rate(self) -> float:
        return self.params.lr

    def step(self, params: State, delta: State) -> tuple[State, dict[str, float]]:
        p = self.params
        v0 = p.tau ** 2 if p.initial_accumulator is None else p.initial_accumulator
        self.t += 1
        direction = {}
        for k, d in delta.items():
            d = np.asarray(d, dtype=np.float64)
            m = p.beta1 * self.m.get(k, 0.0) + (1 - p.beta1) * d
            v = self.second_moment(self.v.get(k, np.full(d.shape, float(v0))), d * d)
            self.m[k], self.v[k] = m, v
            direction[k] = m / (np.sqrt(v) + p.tau)
        return _apply(params, direction, self.rate()), {"moment_norm": norm(self.m)}

    def state_dict(self) -> dict[str, Any]:
        return {"m": dict(self.m), "v": dict(self.v), "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m = {k: np.asarray(x, dtype=np.float64) for k, x in (state.get("m") or {}).items()}
        self.v = {k: np.asarray(x, dtype=np.float64) for k, x in (state.get("v") or {}).items()}
        self.t = int(state.get("t", 0))


@register_optimizer
class Adagrad(Adaptive):
    """FedAdagrad: v_t = v_{t−1} + Δ_t²."""

    name = "adagrad"
    Params = AdagradParams

    def second_moment(self, v, d2):
        return v + d2


@register_optimizer
class Adam(Adaptive):
    """FedAdam: v_t = β2 v_{t−1} + (1 − β2) Δ_t²."""

    name = "adam"
    Params = AdamParams

    def second_moment(self, v, d2):
        return self.params.beta2 * v + (1 - self.params.beta2) * d2

    def rate(self) -> float:
        p = self.params
        if not p.bias_correction:
            return p.lr
        return p.lr * np.sqrt(1 - p.beta2 ** self.t) / (1 - p.beta1 ** self.t)


@register_optimizer
class Yogi(Adaptive):
    """FedYogi: v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)."""

    name = "yogi"
    Params = YogiParams

    def second_moment(self, v, d2):
        return v - (1 - self.params.beta2) * d2 * np.sign(v - d2)


def make_optimizer(spec_: dict[str, Any]) -> ServerOptimizer:
    """The optimizer of a resolved ``server`` config section ``{"optimizer": name, ...}``."""
    from fedray.core.spec import build_dataclass

    name = spec_.get("optimizer") or "sgd"
    cls = OPTIMIZERS[name]
    return cls(build_dataclass(cls.Params, {k: v for k, v in spec_.items()
                                            if k != "optimizer"}, "server"))


__all__ = ["OPTIMIZERS", "Adagrad", "Adam", "Momentum", "SGD", "ServerOptimizer", "Yogi",
           "make_optimizer", "norm", "register_optimizer"]
