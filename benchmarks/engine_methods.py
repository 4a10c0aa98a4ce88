"""The local-training engine's cost per method: one round of the scale workload's clients
(``benchmarks/scale.py``: MLP 32-32-10, 16 samples of 32 features per client, batch 32, one
local step, lr 0.05) through each method's own hooks, in one process and one thread —
``cohort_update`` over all K clients as one vectorized cohort, and ``client_update`` client
after client — and, with ``--before TREE``, the same calls on another source tree (e.g. a
``git worktree`` of the commit before the engine) in the same invocation, alternating.

Each measurement is a fresh subprocess (``--child``): the method built from
``load_config`` overrides, its resident model, θ₀, K contexts of synthetic data drawn
from (seed, client), one warm-up call, then the median of ``--repeats`` timed calls.
Printed: seconds per round and the ratios a reader wants — each method against FedAvg on
the same tree and mode, and this tree against ``--before``.

    .venv/bin/python benchmarks/engine_methods.py --clients 1000 10000 \\
        --methods fedavg fedprox feddyn --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(method_name: str, k: int, mode: str, repeats: int) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from fedray.core import registry
    from fedray.core.config import load_config
    from fedray.core.registry import make_method
    from fedray.methods.base import ClientContext

    cfg = load_config(None, [f"algorithm.name={method_name}", "model.name=mlp",
                             "model.hidden=[32]", "local.epochs=1", "local.batch_size=32",
                             "local.lr=0.05", f"clients.num_clients={k}"])
    method = make_method(registry.method(method_name), cfg)
    model = method.build_resident((32,), 10, "cpu")
    theta = method.init_global_state(model, 0)
    ctxs = []
    for c in range(k):
        gen = np.random.default_rng([0, c])
        x = gen.normal(size=(16, 32)).astype(np.float32)
        y = gen.integers(0, 10, 16)
        ctxs.append(ClientContext(c, 1, 0, "default", x, y, x[:0], y[:0], model))

    def call() -> None:
        if mode == "cohort":
            method.cohort_update(ctxs, theta)
        else:
            for ctx in ctxs:
                method.client_update(ctx, theta)

    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "all": times}


def measure(tree: str, method: str, k: int, mode: str, repeats: int) -> float | None:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", method,
                          str(k), mode, str(repeats)], env=env, capture_output=True,
                         text=True, cwd=tree, timeout=3600)
    if out.returncode:
        print(f"  {tree} {method} K={k} {mode}: failed: {out.stderr.strip()[-300:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1_000, 10_000])
    p.add_argument("--methods", nargs="+", default=["fedavg", "fedprox", "feddyn"])
    p.add_argument("--modes", nargs="+", choices=["cohort", "sequential"],
                   default=["cohort", "sequential"])
    p.add_argument("--sequential-max", type=int, default=1_000,
                   help="client after client only up to this many clients (it is linear)")
    p.add_argument("--before", default=None, help="another source tree, timed alongside")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        method, k, mode, repeats = a.child
        print(json.dumps(child(method, int(k), mode, int(repeats))))
        return
    trees = {"after": ROOT, **({"before": os.path.abspath(a.before)} if a.before else {})}
    rows = []
    for k in a.clients:
        for mode in a.modes:
            if mode == "sequential" and k > a.sequential_max:
                continue
            for method in a.methods:
                row = {"clients": k, "mode": mode, "method": method}
                for name, tree in trees.items():
                    if name == "before" and method not in ("fedavg", "fedprox"):
                        continue  # FedDyn is new
                    row[name] = measure(tree, method, k, mode, a.repeats)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'K':>6} {'mode':<10} {'method':<8} {'s/round':>9} {'÷ fedavg':>9} "
          f"{'÷ before':>9}")
    for r in rows:
        base = next(x["after"] for x in rows if x["clients"] == r["clients"]
                    and x["mode"] == r["mode"] and x["method"] == "fedavg")
        vs_before = f"{r['after'] / r['before']:.2f}" if r.get("before") and r["after"] \
            else "-"
        ratio = f"{r['after'] / base:.2f}" if r["after"] and base else "-"
        print(f"{r['clients']:>6} {r['mode']:<10} {r['method']:<8} "
              f"{r['after'] if r['after'] is not None else float('nan'):>9.3f} "
              f"{ratio:>9} {vs_before:>9}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
