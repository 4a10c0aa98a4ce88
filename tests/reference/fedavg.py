"""FedAvg and its server optimizers in plain PyTorch — the reference of fedray's ``fedavg``,
``fedavgm``, ``fedadam``, ``fedyogi`` and ``fedadagrad`` (and of FedProx's, FedDyn's and
ORDERS' local SGD, which this file's ``local_sgd`` runs).

McMahan et al. 2017: every sampled client starts from θ_t, runs local SGD on its own
batches and sends Δ_i = θ_i − θ_t; the server forms Δ = Σ_i w_i Δ_i (w_i = n_i / Σ n_j)
and steps. Reddi et al. 2021, Algorithm 2, with v_{−1} = τ²:

    sgd       θ ← θ + η Δ
    momentum  v ← β v + Δ,                          θ ← θ + η v      (FedAvgM)
    adam      m ← β1 m + (1−β1) Δ,  v ← β2 v + (1−β2) Δ²,  θ ← θ + η m / (√v + τ)
    yogi      v ← v − (1−β2) Δ² sign(v − Δ²)          adagrad  v ← v + Δ²

The only fedray import is the data order: each epoch's permutation of a client's samples
is drawn from (seed, round, client, "local-shuffle-e{epoch}").
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedray.core.seeding import rng


def batches(n, batch_size, epochs, seed, round, client, max_steps=None):
    steps = 0
    for epoch in range(epochs):
        perm = rng(seed, round, client, f"local-shuffle-e{epoch}").permutation(n)
        for start in range(0, n, batch_size):
            if max_steps is not None and steps >= max_steps:
                return
            yield perm[start:start + batch_size]
            steps += 1


def local_sgd(model, theta, x, y, *, lr, epochs, batch_size, seed, round, client,
              momentum=0.0, weight_decay=0.0, max_steps=None, extra_loss=None):
    """θ_i after local SGD from θ (``torch.optim.SGD``), on cross-entropy plus
    ``extra_loss(model)`` if given."""
    model.load_state_dict({k: torch.tensor(v) for k, v in theta.items()})
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    for idx in batches(len(x), batch_size, epochs, seed, round, client, max_steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if extra_loss is not None:
            loss = loss + extra_loss(model)
        loss.backward()
        opt.step()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def mean(deltas, sizes, weighted=True):
    w = np.asarray(sizes, np.float64)
    w = w / w.sum() if weighted else np.full(len(sizes), 1 / len(sizes))
    return {k: sum(wi * d[k].astype(np.float64) for wi, d in zip(w, deltas, strict=True))
            for k in deltas[0]}


class Server:
    def __init__(self, optimizer="sgd", lr=1.0, momentum=0.9, beta1=0.9, beta2=0.99, tau=1e-3):
        self.optimizer, self.lr, self.momentum = optimizer, lr, momentum
        self.beta1, self.beta2, self.tau = beta1, beta2, tau
        self.m, self.v = {}, {}

    def step(self, theta, delta):
        b1, b2, tau = self.beta1, self.beta2, self.tau
        direction = {}
        for k, d in delta.items():
            if self.optimizer == "sgd":
                direction[k] = d
            elif self.optimizer == "momentum":
                self.m[k] = self.momentum * self.m.get(k, 0.0) + d
                direction[k] = self.m[k]
            else:
                self.m[k] = b1 * self.m.get(k, 0.0) + (1 - b1) * d
                v, d2 = self.v.get(k, np.full(d.shape, tau ** 2)), d * d
                self.v[k] = {"adam": b2 * v + (1 - b2) * d2, "adagrad": v + d2,
                             "yogi": v - (1 - b2) * d2 * np.sign(v - d2)}[self.optimizer]
                direction[k] = self.m[k] / (np.sqrt(self.v[k]) + tau)
        return {k: (v.astype(np.float64) + self.lr * direction[k]).astype(v.dtype)
                if k in direction else v for k, v in theta.items()}


def run(model, theta0, clients, *, rounds, seed, local, server=None, weighted=True,
        extra_loss=None):
    """θ after ``rounds`` rounds in which every client of ``clients`` ({id: (x, y)}) takes
    part; ``local`` holds ``local_sgd``'s knobs; ``extra_loss(theta_t)`` gives a client's
    extra term (FedProx)."""
    theta, server = dict(theta0), server or Server()
    names = [n for n, _ in model.named_parameters()]
    for t in range(1, rounds + 1):
        deltas, sizes = [], []
        for c, (x, y) in sorted(clients.items()):
            extra = extra_loss(theta) if extra_loss else None
            local_theta = local_sgd(model, theta, x, y, seed=seed, round=t, client=c,
                                    extra_loss=extra, **local)
            deltas.append({k: local_theta[k] - theta[k] for k in names})
            sizes.append(len(x))
        theta = server.step(theta, mean(deltas, sizes, weighted))
    return theta
