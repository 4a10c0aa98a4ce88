"""ORDERS in plain PyTorch/numpy (norm-rank difference aggregation; the text is in Chinese,
``shared/DESIGN.md`` restates it) — the reference of fedray's ``orders`` with its defaults:
sigmoid weights, the L2 norm, a 3-norm smoothing window, ranked once a client joined 2 of
the last 5 rounds (the threshold ramping up as min(2, t) in round t).

Clients run FedAvg's local SGD and report ‖Δθ_i‖₂ (floored at 1e-6). The server keeps each
client's last 3 norms, ranks the eligible clients by their mean, descending (ties by client
id), gives rank k the weight w_k = 1 / (1 + exp(β(k − γ))), γ = N/3, and steps

    θ_t = θ_{t−1} + Σ_{k=1}^{N} w_k (Δθ_{i_k} − Δθ_{i_{k+1}}),   Δθ_{i_{N+1}} = 0.
"""

from __future__ import annotations

import math

import numpy as np

from reference.fedavg import local_sgd


def run(model, theta0, clients, *, rounds, seed, local, beta=0.5, window=3, threshold=2,
        horizon=5, min_norm=1e-6):
    theta = dict(theta0)
    names = [n for n, _ in model.named_parameters()]
    norms = {c: [] for c in clients}
    joined = {c: [] for c in clients}
    for t in range(1, rounds + 1):
        deltas, smoothed, eligible = {}, {}, []
        for c, (x, y) in sorted(clients.items()):
            trained = local_sgd(model, theta, x, y, seed=seed, round=t, client=c, **local)
            deltas[c] = {n: trained[n].astype(np.float64) - theta[n] for n in names}
            flat = np.concatenate([(trained[n] - theta[n]).reshape(-1) for n in names])
            norm = max(math.sqrt(float(np.dot(flat.astype(np.float64), flat))), min_norm)
            norms[c] = (norms[c] + [norm])[-window:]
            smoothed[c] = float(np.mean(norms[c]))
            joined[c] = [r for r in joined[c] if r > t - horizon] + [t]
            if len(joined[c]) >= min(threshold, t):
                eligible.append(c)
        ranked = sorted(eligible, key=lambda c: (-smoothed[c], c))
        n = len(ranked)
        w = [1 / (1 + math.exp(beta * (k - n / 3))) for k in range(1, n + 1)]
        zero = {m: 0.0 for m in names}
        step = {m: 0.0 for m in names}
        for k, c in enumerate(ranked):
            after = deltas[ranked[k + 1]] if k + 1 < n else zero
            for m in names:
                step[m] = step[m] + w[k] * (deltas[c][m] - after[m])
        theta = {m: (v.astype(np.float64) + step[m]).astype(np.float32) if m in step else v
                 for m, v in theta.items()}
    return theta
