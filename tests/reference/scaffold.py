"""SCAFFOLD in plain PyTorch (Karimireddy et al. 2020, Algorithm 1, option II) — the
reference of fedray's ``scaffold``.

Client i (control c_i, zero at first) starts from y = x and runs local SGD on its loss plus
⟨c − c_i, y⟩, whose gradient is the correction c − c_i; after its K steps
c_i⁺ = c_i − c + (x − y)/(K η_l) (a client with no step keeps c_i). The server:
x ← x + η_g (1/|S|) Σ Δy_i,  c ← c + (1/N) Σ (c_i⁺ − c_i), N the population.
"""

from __future__ import annotations

import numpy as np
import torch

from reference.fedavg import batches, local_sgd


def run(model, theta0, clients, *, rounds, seed, local, population, server_lr=1.0):
    x = dict(theta0)
    names = [n for n, _ in model.named_parameters()]
    c = {n: np.zeros(theta0[n].shape) for n in names}
    ci = {k: {n: np.zeros(theta0[n].shape) for n in names} for k in clients}
    for t in range(1, rounds + 1):
        dy, dc = [], []
        for k, (xs, ys) in sorted(clients.items()):
            shift = {n: torch.tensor((c[n] - ci[k][n]).astype(np.float32)) for n in names}

            def control(model, shift=shift):
                return sum((shift[n] * p).sum() for n, p in model.named_parameters())

            y = local_sgd(model, x, xs, ys, seed=seed, round=t, client=k, extra_loss=control,
                          **local)
            steps = len(list(batches(len(xs), local["batch_size"], local["epochs"], seed, t,
                                     k, local.get("max_steps"))))
            dy.append({n: y[n].astype(np.float64) - x[n] for n in names})
            new = {n: ci[k][n] - c[n] + (x[n] - y[n]) / (steps * local["lr"]) if steps
                   else ci[k][n] for n in names}
            dc.append({n: new[n] - ci[k][n] for n in names})
            ci[k] = new
        for n in names:
            c[n] = c[n] + sum(d[n] for d in dc) / population
        x = {n: (v + server_lr * np.mean([d[n] for d in dy], 0)).astype(np.float32)
             if n in names else v for n, v in x.items()}
    return x
