"""Flower's own FedAvgM / FedAdam / FedYogi / FedAdagrad on inputs fedray wrote; run in
.venv-flower (Flower pins its own ray) by tests/test_flower_server_opt.py:

    .venv-flower/bin/python tests/flower_server_opt_run.py IN.npz OUT.npz

IN.npz holds ``x0/<i>`` (the initial global arrays, float64), ``delta/<t>/<c>/<i>`` (client
c's update in round t) and ``n/<t>`` (the clients' sample counts). Each client reports the
weights x_t + Δ_c, as a Flower client would; each strategy's global arrays after every
round go to OUT.npz as ``<case>/<t>/<i>``. Standalone: it imports numpy and flwr only.
"""

from __future__ import annotations

import sys

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

CASES = {  # name -> (strategy, server-round offset)
    "sgd": (lambda p: FedAvgM(initial_parameters=p, server_learning_rate=0.7,
                              server_momentum=0.0), 0),
    "momentum": (lambda p: FedAvgM(initial_parameters=p, server_learning_rate=0.5,
                                   server_momentum=0.9), 0),
    # FedAdam's bias correction counts t = server_round + 1: round t is passed as t - 1
    "adam": (lambda p: FedAdam(initial_parameters=p, eta=0.05, beta_1=0.9, beta_2=0.99,
                               tau=1e-3), -1),
    "yogi": (lambda p: FedYogi(initial_parameters=p, eta=0.05, beta_1=0.9, beta_2=0.99,
                               tau=1e-3), 0),
    "adagrad": (lambda p: FedAdagrad(initial_parameters=p, eta=0.1, tau=1e-3), 0),
}


def main(src: str, dst: str) -> None:
    data = np.load(src)
    size = len([k for k in data.files if k.startswith("x0/")])
    x0 = [data[f"x0/{i}"] for i in range(size)]
    rounds = len([k for k in data.files if k.startswith("n/")])
    out = {}
    for name, (make, offset) in CASES.items():
        strategy = make(ndarrays_to_parameters(x0))
        current = [a.copy() for a in x0]
        for t in range(1, rounds + 1):
            counts = data[f"n/{t}"]
            results = []
            for c, n in enumerate(counts):
                weights = [current[i] + data[f"delta/{t}/{c}/{i}"] for i in range(size)]
                results.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(
                    weights), int(n), {})))
            params, _ = strategy.aggregate_fit(t + offset, results, [])
            current = parameters_to_ndarrays(params)
            for i, a in enumerate(current):
                out[f"{name}/{t}/{i}"] = a
    np.savez(dst, **out)
    print("ok", len(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
