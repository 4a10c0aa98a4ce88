"""FedNova in plain PyTorch (Wang et al. 2020) — the reference of fedray's ``fednova``.

Clients run local SGD (momentum ρ, fresh each round) for τ_i steps; the server normalises
each update by ‖a_i‖₁ (τ_i for SGD, (τ_i − ρ(1 − ρ^τ_i)/(1 − ρ))/(1 − ρ) with momentum) and
rescales by τ_eff = Σ p_i ‖a_i‖₁:  x ← x + τ_eff Σ_i p_i Δ_i / ‖a_i‖₁,  p_i = n_i / n.
"""

from __future__ import annotations

import numpy as np

from reference.fedavg import batches, local_sgd


def run(model, theta0, clients, *, rounds, seed, local):
    x = dict(theta0)
    names = [n for n, _ in model.named_parameters()]
    rho = local.get("momentum", 0.0)
    n_total = sum(len(xs) for xs, _ in clients.values())
    for t in range(1, rounds + 1):
        step = {n: np.zeros(x[n].shape) for n in names}
        tau_eff, terms = 0.0, []
        for k, (xs, ys) in sorted(clients.items()):
            y = local_sgd(model, x, xs, ys, seed=seed, round=t, client=k, **local)
            tau = len(list(batches(len(xs), local["batch_size"], local["epochs"], seed, t, k,
                                   local.get("max_steps"))))
            a = tau if rho == 0 else (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)
            p = len(xs) / n_total
            tau_eff += p * a
            terms.append((p, a, {n: y[n].astype(np.float64) - x[n] for n in names}))
        for p, a, d in terms:
            for n in names:
                step[n] += tau_eff * p / a * d[n] if a else 0.0
        x = {n: (v + step[n]).astype(np.float32) if n in names else v for n, v in x.items()}
    return x
