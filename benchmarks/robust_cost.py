"""What a robust aggregation rule costs the server per round, against the plain weighted
mean, on the driver's actual path (:class:`fedray.methods.fedavg.policy.FedAvgPolicy`
with and without :class:`fedray.methods.robust.RobustRule`): median wall seconds over
``--repeats`` and the peak memory the call allocates (tracemalloc, which sees numpy's
arrays) beyond what was held before it, for ``--clients``
uploads of ``--params`` float32 parameters (two tensors, random normal).

    .venv/bin/python benchmarks/robust_cost.py [--clients 10 100] [--params 100000 1000000]
        [--rules median krum ...]

Every rule stacks the round's uploads into one float64 matrix (clients × parameters), so
its memory is 8 · n · d bytes on top of the uploads themselves; Krum and Bulyan also form
the n × n distance matrix (negligible next to it), Bulyan repeats Krum n − 2f times.
FLTrust's aggregation is timed here; the server's own update on its root dataset is one
more local training of ``robust.root_samples`` samples per round, on an executor.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from fedray.methods.fedavg.policy import FedAvgPolicy
from fedray.methods.robust import RobustConfig, RobustRule

RULES = ["none", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_bound",
         "centered_clip", "fltrust"]


def measure(rule: str, n: int, d: int, repeats: int) -> dict:
    g = np.random.default_rng(0)
    half = d // 2
    ups = [(c, 10, {"a": g.normal(size=half).astype(np.float32),
                    "b": g.normal(size=d - half).astype(np.float32)}) for c in range(n)]
    state = {"a": np.zeros(half, np.float32), "b": np.zeros(d - half, np.float32)}
    f = max(0, (n - 3) // 4)  # Bulyan's largest f: n >= 4f + 3
    robust = None if rule == "none" else RobustRule(RobustConfig(rule=rule, f=f))
    policy = FedAvgPolicy(robust=robust)
    reference = {"a": g.normal(size=half).astype(np.float32),
                 "b": g.normal(size=d - half).astype(np.float32)}
    times = []
    for _ in range(repeats):
        if policy.root_samples:  # FLTrust: the server's update (its training not counted)
            policy.set_reference(reference)
        t = time.perf_counter()
        policy.aggregate(state, ups, 1)
        times.append(time.perf_counter() - t)
    if policy.root_samples:
        policy.set_reference(reference)
    tracemalloc.start()
    held = tracemalloc.get_traced_memory()[0]
    policy.aggregate(state, ups, 1)
    peak = tracemalloc.get_traced_memory()[1] - held
    tracemalloc.stop()
    return {"rule": rule, "clients": n, "params": d, "f": f,
            "seconds": statistics.median(times), "peak_alloc_mb": peak / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    p.add_argument("--params", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rules", nargs="+", default=RULES[1:], choices=RULES[1:],
                   help="rules measured (each against the plain mean, always measured)")
    a = p.parse_args()
    print("| clients | params | rule | s / round | × mean | peak allocation MB |")
    print("|---:|---:|---|---:|---:|---:|")
    for n in a.clients:
        for d in a.params:
            base = None
            for rule in ["none", *a.rules]:
                row = measure(rule, n, d, a.repeats)
                base = base or row["seconds"]
                print(f"| {n} | {d:,} | {rule} | {row['seconds']:.4f} | "
                      f"{row['seconds'] / base:.1f}× | {row['peak_alloc_mb']:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
