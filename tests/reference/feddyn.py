"""FedDyn in plain PyTorch (Acar et al. 2021, Algorithm 1) — the reference of fedray's
``feddyn``.

Client k (gradient state g_k = ∇L_k(θ_k^{t−1}), zero at first) minimises
L_k(θ) − ⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖² by local SGD (autograd on that objective), then
keeps g_k ← g_k − α(θ_k^t − θ^{t−1}). The server keeps h (zero at first):
h ← h − (α/m) Σ_k (θ_k^t − θ^{t−1}),  θ^t = (1/|P_t|) Σ_k θ_k^t − h/α, m the population.
"""

from __future__ import annotations

import numpy as np
import torch

from reference.fedavg import local_sgd


def run(model, theta0, clients, *, rounds, seed, local, alpha, population):
    theta = dict(theta0)
    names = [n for n, _ in model.named_parameters()]
    g = {c: {n: np.zeros_like(theta0[n]) for n in names} for c in clients}
    h = {n: np.zeros(theta0[n].shape) for n in names}
    for t in range(1, rounds + 1):
        locals_ = {}
        for c, (x, y) in sorted(clients.items()):
            anchor = {n: torch.tensor(theta[n]) for n in names}
            own = {n: torch.tensor(g[c][n]) for n in names}

            def dyn(model, anchor=anchor, own=own):
                return sum(-(own[n] * p).sum() + alpha / 2 * ((p - anchor[n]) ** 2).sum()
                           for n, p in model.named_parameters())

            locals_[c] = local_sgd(model, theta, x, y, seed=seed, round=t, client=c,
                                   extra_loss=dyn, **local)
            for n in names:
                g[c][n] = g[c][n] - alpha * (locals_[c][n] - theta[n])
        for n in names:
            drift = sum(locals_[c][n].astype(np.float64) - theta[n] for c in locals_)
            h[n] = h[n] - alpha / population * drift
        theta = {n: (np.mean([locals_[c][n].astype(np.float64) for c in sorted(locals_)], 0)
                     - h[n] / alpha).astype(np.float32) if n in h else v
                 for n, v in theta.items()}
    return theta
