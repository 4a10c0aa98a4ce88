"""ORDERS aggregation cost vs FedAvg's weighted mean, on the same inputs, in one run.

N client updates of a P-parameter model as one (N, P) float32 matrix (the default
N = 1,000, P = 1,000,000 is 4 GB). FedAvg's weighted mean is ``w @ D`` (one BLAS pass);
ORDERS is :func:`fedray.methods.orders.policy.orders_step` — norms, smoothing, participation,
argsort ranking, weights, the telescoped difference sum, the maturity map — with the
norms reported by the clients (the text's protocol) and computed by the server. Best of
``--repeats`` after one warm-up.

    .venv/bin/python benchmarks/orders_aggregation.py --clients 1000 --params 1000000
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from fedray.methods.orders.policy import OrdersParams, OrdersState, orders_step


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--params", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gen = np.random.default_rng(0)
    d = gen.standard_normal((args.clients, args.params), dtype=np.float32)
    d *= gen.uniform(0.1, 2.0, size=(args.clients, 1)).astype(np.float32)
    prev = gen.standard_normal(args.params, dtype=np.float32)
    ids = np.arange(args.clients)
    n = gen.integers(100, 1000, size=args.clients).astype(np.float32)
    w = n / n.sum()
    reported = np.linalg.norm(d, axis=1)
    p = OrdersParams(participation_threshold=1)
    state = OrdersState()
    fedavg = best(lambda: prev + w @ d, args.repeats)
    client = best(lambda: orders_step(prev, d, ids, 1, state, p, norms=reported), args.repeats)
    server = best(lambda: orders_step(prev, d, ids, 1, state, p), args.repeats)
    out = {"clients": args.clients, "params": args.params, "fedavg_s": fedavg,
           "orders_client_norms_s": client, "orders_server_norms_s": server,
           "ratio_client_norms": client / fedavg, "ratio_server_norms": server / fedavg}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
