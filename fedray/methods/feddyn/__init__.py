"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021,
Algorithm 1), written once on the local-training engine (:mod:`fedray.methods.engine`), so
it runs client by client or as a vectorized cohort from the same hooks.

Client k of the round's participants P_t minimises its dynamically regularised loss

    L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²

by local SGD — its gradient is ∇L_k(θ) − ∇L_k(θ_k^{t−1}) + α(θ − θ^{t−1}), the engine's
correction — uploads Δ_k = θ_k^t − θ^{t−1} and keeps, as its client state,

    ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α Δ_k          (zero before its first round).

The server keeps h (zero at first; its own part of the checkpoint) and steps

    h^t = h^{t−1} − (α/m) Σ_{k∈P_t} Δ_k,     θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h^t/α,

m the population's size (``clients.num_clients``). The paper's mean over P_t is uniform;
``algorithm.weighted=true`` weighs it by sample counts instead (not the paper's). The
authors' code folds weight decay into the same objective; here ``local.weight_decay`` is
the engine's, as for every local-SGD method (default 0). The plain-PyTorch reference is
``tests/reference/feddyn.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import spec
from fedray.methods.base import WEIGHTED_HELP, ClientContext, ClientOutput, State
from fedray.methods.fedavg.method import FedAvg, FedAvgParams
from fedray.methods.feddyn.policy import FedDynPolicy


@dataclass
class FedDynParams(FedAvgParams):
    alpha: float = spec(0.01, gt=0, help="FedDyn's regularisation α (the paper's runs use "
                                         "0.1, 0.01 or 0.001)")
    weighted: bool = spec(False, help=WEIGHTED_HELP)  # the paper's mean is uniform


@register_method
class FedDyn(FedAvg):
    """Dynamic regularisation: each client's gradient corrected by its own last gradient
    and α(θ − θ_t); the server's mean corrected by h."""

    name = "feddyn"
    Params = FedDynParams
    capabilities = frozenset({"client_state", "vectorizable", "multilabel", "before_after",
                              "finetune"})
    server_optimizer = None
    cohort_copies = 1

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return True

    def client_tensors(self, ctx: ClientContext, broadcast: State) -> State:
        """∇L_k(θ_k^{t−1}) from the client's state (zero before its first round)."""
        kept = (ctx.state or {}).get("grad")
        if kept is not None:
            return kept
        return {n: np.zeros(np.shape(broadcast[n]), np.float32)
                for n in self.trainable(ctx.resident)}

    def correction(self, model: Any, broadcast: State, device: str) -> Any:
        """g += α(θ − θ^{t−1}) − ∇L_k(θ_k^{t−1})."""
        import torch

        alpha = self.params.alpha
        anchors = [torch.from_numpy(np.asarray(broadcast[n], np.float32)).to(device)
                   for n in self.trainable(model)]

        def fix(params: list, own: list) -> None:
            for p, a, g in zip(params, anchors, own, strict=True):
                p.grad.add_(p.detach() - a, alpha=alpha).sub_(g)

        return fix

    def finish(self, ctx: ClientContext, out: ClientOutput, broadcast: State,
               trained: State) -> ClientOutput:
        """Keep ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α Δ_k."""
        last = self.client_tensors(ctx, broadcast)
        alpha = np.float32(self.params.alpha)
        grad = {k: (np.asarray(last[k], np.float32) - alpha * out.upload[k]).astype(np.float32)
                for k in last}
        out.state = {**(out.state or {}), "grad": grad}
        return out

    def make_policy(self) -> FedDynPolicy:
        return FedDynPolicy(self.params.alpha, self.cfg.clients.num_clients,
                            self.params.weighted)
