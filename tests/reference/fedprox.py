"""FedProx in plain PyTorch (Li et al. 2020): FedAvg whose clients minimise
F_i(θ) + (μ/2)‖θ − θ_t‖², the proximal term differentiated by autograd — the reference of
fedray's ``fedprox``, which adds its gradient μ(θ − θ_t) in the engine's correction."""

from __future__ import annotations

import torch

from reference import fedavg


def proximal(mu):
    def term(theta_t):
        anchor = {k: torch.tensor(v) for k, v in theta_t.items()}
        return lambda model: mu / 2 * sum(((p - anchor[n]) ** 2).sum()
                                          for n, p in model.named_parameters())
    return term


def run(model, theta0, clients, *, rounds, seed, local, mu):
    return fedavg.run(model, theta0, clients, rounds=rounds, seed=seed, local=local,
                      extra_loss=proximal(mu))
