"""MOON in plain PyTorch (Li, He and Song 2021, Algorithm 1) — the reference of fedray's
``moon``, for a model ``nn.Sequential(..., classifier)``: the representation is what the
layers before the classifier output.

Each client trains on cross-entropy + μ·ℓ_con, ℓ_con the cross-entropy of the logits
[sim(z, z_glob)/τ, sim(z, z_prev)/τ] against the first (as the authors' code writes Eq. 3),
z_glob from the round's global model and z_prev from the client's model of its previous
round (the global model at first), both frozen. The server takes the sample-weighted mean.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from reference.fedavg import batches, mean


def frozen(model, params):
    other = copy.deepcopy(model)
    other.load_state_dict({k: torch.tensor(v) for k, v in params.items()})
    return other.requires_grad_(False)


def run(model, theta0, clients, *, rounds, seed, local, mu, tau):
    theta = dict(theta0)
    names = [n for n, _ in model.named_parameters()]
    previous = {}
    for t in range(1, rounds + 1):
        deltas, sizes = [], []
        glob = frozen(model, theta)
        for c, (x, y) in sorted(clients.items()):
            prev = frozen(model, {**theta, **previous.get(c, {})})
            model.load_state_dict({k: torch.tensor(v) for k, v in theta.items()})
            opt = torch.optim.SGD(model.parameters(), lr=local["lr"],
                                  momentum=local["momentum"],
                                  weight_decay=local["weight_decay"])
            xs, ys = torch.from_numpy(x), torch.from_numpy(y)
            for idx in batches(len(xs), local["batch_size"], local["epochs"], seed, t, c):
                opt.zero_grad()
                z = model[:-1](xs[idx])
                pos = F.cosine_similarity(z, glob[:-1](xs[idx]), dim=-1) / tau
                neg = F.cosine_similarity(z, prev[:-1](xs[idx]), dim=-1) / tau
                logits = torch.stack([pos, neg], 1)
                con = F.cross_entropy(logits, torch.zeros(len(idx), dtype=torch.long))
                loss = F.cross_entropy(model[-1](z), ys[idx]) + mu * con
                loss.backward()
                opt.step()
            trained = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
            previous[c] = {n: trained[n] for n in names}
            deltas.append({n: trained[n] - theta[n] for n in names})
            sizes.append(len(x))
        step = mean(deltas, sizes)
        theta = {k: (v.astype(np.float64) + step[k]).astype(v.dtype) if k in step else v
                 for k, v in theta.items()}
    return theta
