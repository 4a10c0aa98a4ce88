"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, Algorithm 1),
written once on the local-training engine (:mod:`fedray.methods.engine`): client by client
or as a vectorized cohort from the same hooks.

Each client adds to its task loss the model-contrastive term (Eq. 3)

    ℓ_con = −log [ exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ],

μ·ℓ_con averaged over the batch (μ is ``algorithm.contrastive_weight``: FedProx's
``algorithm.mu`` means another thing), where z, z_glob and z_prev are the representations of the
same input under the model being trained, the round's global model and the client's own
model from its previous round (frozen), and sim is the cosine similarity. The
representation is the input of the model's classifier (its last ``nn.Linear``): the
paper's networks end in a projection head whose output it contrasts; fedray's models'
penultimate features play that part (a per-token model's are flattened per sample). The
client keeps its trained parameters as its state; before its first round its "previous"
model is the global one, as in the authors' code. The server is FedAvg's, with every
capability the uploads (plain updates) allow. The plain-PyTorch reference is
``tests/reference/moon.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import spec
from fedray.methods.base import ClientContext, ClientOutput, State
from fedray.methods.fedavg.method import FedAvg, FedAvgParams


@dataclass
class MoonParams(FedAvgParams):
    contrastive_weight: float = spec(1.0, ge=0, help="MOON's μ: the weight of its "
                                                     "model-contrastive term (the paper: 5 on "
                                                     "CIFAR-10, 1 on CIFAR-100 and "
                                                     "Tiny-ImageNet)")
    temperature: float = spec(0.5, gt=0, help="temperature τ of MOON's contrastive term")


@register_method
class Moon(FedAvg):
    """FedAvg whose clients pull their representation towards the global model's and away
    from their previous one's."""

    name = "moon"
    Params = MoonParams
    capabilities = frozenset(FedAvg.capabilities - {"dp_sgd"})
    cohort_copies = 1  # the client's previous model
    cohort_forwards = 2  # the global and the previous model's representations

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return True

    def client_tensors(self, ctx: ClientContext, broadcast: State) -> State:
        """The client's previous model (the global one before its first round)."""
        previous = (ctx.state or {}).get("previous")
        return previous if previous is not None else \
            {n: broadcast[n] for n in self.trainable(ctx.resident)}

    def objective(self, model: Any, broadcast: State, device: str) -> Any:
        """μ ℓ_con per row (Eq. 3)."""
        import torch
        import torch.nn.functional as F

        names = self.trainable(model)
        glob = {n: torch.from_numpy(np.asarray(broadcast[n], np.float32)).to(device)
                for n in names}
        mu, tau = self.params.contrastive_weight, self.params.temperature

        def term(z: Any, features_of: Any, x: Any, own: list) -> Any:
            z_glob = features_of(glob, x).detach()
            z_prev = features_of(dict(zip(names, own, strict=True)), x).detach()
            pos = F.cosine_similarity(z.flatten(1), z_glob.flatten(1), dim=-1) / tau
            neg = F.cosine_similarity(z.flatten(1), z_prev.flatten(1), dim=-1) / tau
            return mu * (torch.logsumexp(torch.stack([pos, neg]), 0) - pos)

        return term

    def finish(self, ctx: ClientContext, out: ClientOutput, broadcast: State,
               trained: State) -> ClientOutput:
        """Keep the trained parameters: next round's previous model."""
        out.state = {**(out.state or {}),
                     "previous": {k: np.array(v, np.float32) for k, v in trained.items()}}
        return out
