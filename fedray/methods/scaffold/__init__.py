"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, Algorithm 1 with option II), written once on the local-training
engine (:mod:`fedray.methods.engine`): client by client or as a vectorized cohort from the
same hooks.

The server keeps a control variate c (zero at first) beside the model x; client i keeps its
own c_i (zero at first, its client state). A sampled client starts from y_i = x and takes
K local steps of y_i ← y_i − η_l (g_i(y_i) − c_i + c) — the engine's correction adds
c − c_i to every gradient — then sets, by option II,

    c_i⁺ = c_i − c + (x − y_i) / (K η_l),

and uploads Δy_i = y_i − x and Δc_i = c_i⁺ − c_i = −c − Δy_i / (K η_l). The server steps

    x ← x + η_g (1/|S|) Σ_i Δy_i,      c ← c + (1/N) Σ_i Δc_i,

N the population (``clients.num_clients``), η_g the server optimizer's (``server.lr``).

Where it lives: c is the policy's state (checkpointed with it) and reaches the clients in
the broadcast as the ``control.*`` tensors (``AggregationPolicy.broadcast``), counted by the
byte ledger both ways; it is not sent before the first round that produced one (c = 0 is
known to everyone). The control tensors are not the model's, so the features that act on
every tensor of an upload — central DP, robust rules, attacks, update transforms, the
executors' reduction — are declined. Choices the paper leaves open: the model mean is
uniform (``algorithm.weighted=true`` weighs it by samples), and a client that took no step
(K = 0: no samples, or ``local.max_steps=0``) uploads Δc = 0 and keeps its c_i. The
plain-PyTorch reference is ``tests/reference/scaffold.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import spec
from fedray.methods.base import (
    WEIGHTED_HELP,
    AggregationPolicy,
    ClientContext,
    ClientOutput,
    State,
)
from fedray.methods.fedavg.method import FedAvg, FedAvgParams
from fedray.methods.fedavg.policy import weighted_mean
from fedray.services.server_opt import ServerOptimizer, norm

CONTROL = "control."  # the broadcast's and the upload's control tensors: CONTROL + name


def split(upload: State) -> tuple[State, State]:
    """(model tensors, control tensors by parameter name) of an upload or a broadcast."""
    model = {k: v for k, v in upload.items() if not k.startswith(CONTROL)}
    return model, {k[len(CONTROL):]: v for k, v in upload.items() if k.startswith(CONTROL)}


@dataclass
class ScaffoldParams(FedAvgParams):
    weighted: bool = spec(False, help=WEIGHTED_HELP)  # the paper's mean is uniform


class ScaffoldPolicy(AggregationPolicy):
    """The server half: the model's mean update to the server optimizer, c's mean update
    scaled by |S|/N; c broadcast as ``control.*``."""

    def __init__(self, optimizer: ServerOptimizer, population: int, weighted: bool = False):
        self.optimizer, self.population, self.weighted = optimizer, population, weighted
        self.c: dict[str, np.ndarray] = {}

    def broadcast(self, global_state: State, round: int, tier: str) -> State:
        return {**global_state, **{CONTROL + k: v.astype(np.float32) for k, v in self.c.items()}}

    def aggregate(self, global_state: State, updates: list[tuple[int, int, State]],
                  round: int) -> tuple[State, dict[str, float]]:
        parts = [(cid, n, *split(u)) for cid, n, u in updates]
        model = weighted_mean([(cid, n, m) for cid, n, m, _ in parts], self.weighted)
        control = weighted_mean([(cid, n, c) for cid, n, _, c in parts], False)
        share = len(updates) / self.population
        for k, d in control.items():
            self.c[k] = self.c.get(k, np.zeros(d.shape)) + share * d
        new, metrics = self.optimizer.step(global_state, model)
        return new, {"update_norm": norm(model), "control_norm": norm(self.c), **metrics}

    def state_dict(self) -> dict[str, Any]:
        return {"c": dict(self.c)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.c = {k: np.asarray(v, np.float64) for k, v in state.get("c", {}).items()}


@register_method
class Scaffold(FedAvg):
    """Control variates: each client's gradient corrected by c − c_i."""

    name = "scaffold"
    Params = ScaffoldParams
    capabilities = frozenset({"client_state", "vectorizable", "server_optimizer",
                              "multilabel", "before_after", "finetune"})
    cohort_copies = 1

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return True

    def client_tensors(self, ctx: ClientContext, broadcast: State) -> State:
        """c − c_i (c = 0 before the server has one, c_i = 0 before the client's first
        round)."""
        _, c = split(broadcast)
        mine = (ctx.state or {}).get("control") or {}
        out = {}
        for n in self.trainable(ctx.resident):
            zero = np.zeros(np.shape(broadcast[n]), np.float32)
            out[n] = np.asarray(c.get(n, zero), np.float32) - np.asarray(mine.get(n, zero),
                                                                         np.float32)
        return out

    def correction(self, model: Any, broadcast: State, device: str) -> Any:
        """g ← g − c_i + c."""
        def fix(params: list, own: list) -> None:
            for p, d in zip(params, own, strict=True):
                p.grad.add_(d)

        return fix

    def upload(self, broadcast: State, trained: State, own: State | None,
               steps: np.ndarray) -> State:
        """Δy_i and Δc_i = −c − Δy_i / (K_i η_l) (0 where K_i = 0), each stacked."""
        delta = super().upload(broadcast, trained, own, steps)
        _, c = split(broadcast)
        lr = self.cfg.local.lr
        out = dict(delta)
        for k, d in delta.items():
            k_i = steps.reshape(-1, *[1] * (d.ndim - 1)).astype(np.float64)
            moved = -d / np.where(k_i > 0, k_i * lr, 1.0) - np.asarray(c.get(k, 0.0))
            out[CONTROL + k] = np.where(k_i > 0, moved, 0.0).astype(np.float32)
        return out

    def finish(self, ctx: ClientContext, out: ClientOutput, broadcast: State,
               trained: State) -> ClientOutput:
        """Keep c_i⁺ = c_i + Δc_i."""
        mine = (ctx.state or {}).get("control") or {}
        _, moved = split(out.upload)
        control = {k: (np.asarray(mine.get(k, 0.0), np.float32) + d).astype(np.float32)
                   for k, d in moved.items()}
        out.state = {**(out.state or {}), "control": control}
        return out

    def make_policy(self) -> ScaffoldPolicy:
        return ScaffoldPolicy(self.make_optimizer(), self.cfg.clients.num_clients,
                              self.params.weighted)
