"""Simulator overhead: fedray vs a plain single-process loop vs Flower, same workload.

Workload (the issue's anchor): FedAvg, MLP 784-256-10, seeded synthetic data, 256 training
samples per client, batch 32, 1 local epoch, SGD lr 0.05, N clients all sampled, 5 rounds,
no evaluation.

- bound: the identical computation in this process, no runtime — the same FedAvg client
  update and aggregation code fedray runs, called in a loop. Run twice, with torch's
  default thread count and with one thread (as fedray's executors use); the faster of the
  two is the bound, and the one-thread run must end in fedray's bitwise-identical state.
- fedray: ``run_experiment`` on a fresh local Ray (started inside the timing), 2 executors
  of 1 CPU each.
- flower: ``benchmarks/flower_sim.py`` under ``.venv-flower`` (Flower pins its own Ray),
  created by ``benchmarks/setup_flower_venv.sh``; skipped with a note when absent.

Per steady-state round = mean of rounds 2..R; end to end = wall time including Ray start.
Ratios are against the bound measured in the same invocation.

    .venv/bin/python benchmarks/sim_overhead.py --clients 10 50 100 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workload(n: int, rounds: int, seed: int) -> list[str]:
    return [
        "name=sim-overhead", f"seed={seed}", f"rounds={rounds}",
        "data.dataset=synthetic", "data.synthetic_features=784", "data.synthetic_classes=10",
        f"data.synthetic_samples={n * 400}", "data.synthetic_test_fraction=0.2",
        "data.partition=iid", "data.local_test_fraction=0.2",
        f"clients.num_clients={n}", "clients.fraction=1.0",
        "model.name=mlp", "model.hidden=[256]",
        "local.epochs=1", "local.batch_size=32", "local.lr=0.05",
        "eval.every=0", "eval.clients=none", "eval.global_test=false",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]",
    ]


def run_bound(cfg, threads: int | None = None) -> dict:
    """The same client updates and aggregation, in a loop, in this process."""
    import torch

    from fedray.data import build_federated
    from fedray.methods.base import ClientContext
    from fedray.registry import build_method

    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads)
    t0 = time.perf_counter()
    algo = build_method(cfg)
    data = build_federated(cfg.data, cfg.clients.num_clients, cfg.seed)
    model = algo.build_resident(data.input_shape, data.num_classes, "cpu")
    state = algo.init_global_state(model, cfg.seed)
    policy = algo.make_policy()
    times = []
    for r in range(1, cfg.rounds + 1):
        tr = time.perf_counter()
        ups = []
        for c in range(cfg.clients.num_clients):
            x, y = data.client_arrays(c, r, "train")
            xt, yt = data.client_arrays(c, r, "test")
            out = algo.client_update(ClientContext(c, r, cfg.seed, "default", x, y, xt, yt,
                                                   model), state)
            ups.append((c, out.num_samples, out.upload))
        state, _ = policy.aggregate(state, ups, r)
        times.append(time.perf_counter() - tr)
    e2e = time.perf_counter() - t0
    torch.set_num_threads(default_threads)
    samples = [data.num_samples(c, "train") for c in range(cfg.clients.num_clients)]
    return {"round_seconds": times, "e2e_seconds": e2e, "threads": threads or default_threads,
            "state": state, "mean_train_samples": float(np.mean(samples))}


def run_fedray(cfg, run_dir: str) -> dict:
    import ray

    from fedray.runtime import run_experiment
    from fedray.storage import Storage

    if ray.is_initialized():
        ray.shutdown()
    stamps: list[float] = []
    t0 = time.perf_counter()
    run_experiment(cfg, run_dir, progress=False, on_round=lambda row: stamps.append(
        time.perf_counter()))
    e2e = time.perf_counter() - t0
    s = Storage(run_dir)
    state = s.read_checkpoint()["global_state"]
    times = list(np.diff(stamps))
    return {"round_seconds": [float("nan")] + times, "e2e_seconds": e2e, "state": state}


def run_flower(n: int, rounds: int, seed: int) -> dict | None:
    py = os.path.join(ROOT, ".venv-flower", "bin", "python")
    if not os.path.exists(py):
        return None
    out = subprocess.run([py, os.path.join(ROOT, "benchmarks", "flower_sim.py"), "--clients",
                          str(n), "--rounds", str(rounds), "--seed", str(seed)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def steady(times: list[float]) -> float:
    return float(np.mean(times[1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()

    from fedray.config import load_config

    os.makedirs(args.out, exist_ok=True)
    rows = []
    for n in args.clients:
        cfg = load_config(None, workload(n, args.rounds, args.seed))
        bounds = [run_bound(cfg), run_bound(cfg, threads=1)]
        bound = min(bounds, key=lambda b: steady(b["round_seconds"]))
        fed = run_fedray(cfg, os.path.join(args.out, f"run-n{n}-{int(time.time())}"))
        same = all(np.array_equal(bounds[1]["state"][k], fed["state"][k])
                   for k in fed["state"])
        flower = None if args.no_flower else run_flower(n, args.rounds, args.seed)
        row = {
            "clients": n, "mean_train_samples": bound["mean_train_samples"],
            "bound_threads": bound["threads"],
            "bound_round_s_by_threads": {b["threads"]: steady(b["round_seconds"])
                                         for b in bounds},
            "bound_round_s": steady(bound["round_seconds"]),
            "fedray_round_s": steady(fed["round_seconds"]),
            "flower_round_s": steady(flower["round_seconds"]) if flower else None,
            "bound_e2e_s": bound["e2e_seconds"], "fedray_e2e_s": fed["e2e_seconds"],
            "flower_e2e_s": flower["e2e_seconds"] if flower else None,
            "fedray_state_equals_bound": same,
            "flower_version": flower.get("flwr_version") if flower else None,
        }
        row["fedray_round_ratio"] = row["fedray_round_s"] / row["bound_round_s"]
        row["fedray_e2e_ratio"] = row["fedray_e2e_s"] / row["bound_e2e_s"]
        if flower:
            row["flower_round_ratio"] = row["flower_round_s"] / row["bound_round_s"]
            row["flower_e2e_ratio"] = row["flower_e2e_s"] / row["bound_e2e_s"]
            row["fedray_e2e_over_flower"] = row["fedray_e2e_s"] / row["flower_e2e_s"]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    with open(os.path.join(args.out, "sim_overhead.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    def f(v, fmt="{:.3f}"):
        return "–" if v is None else fmt.format(v)

    lines = ["| N | bound s/round | fedray s/round | Flower s/round | fedray/bound round | "
             "Flower/bound round | bound e2e s | fedray e2e s | Flower e2e s | "
             "fedray/Flower e2e | fedray state == bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {f(r['bound_round_s'])} | {f(r['fedray_round_s'])} | "
            f"{f(r['flower_round_s'])} | {f(r['fedray_round_ratio'], '{:.2f}×')} | "
            f"{f(r.get('flower_round_ratio'), '{:.2f}×')} | {f(r['bound_e2e_s'], '{:.1f}')} | "
            f"{f(r['fedray_e2e_s'], '{:.1f}')} | {f(r['flower_e2e_s'], '{:.1f}')} | "
            f"{f(r.get('fedray_e2e_over_flower'), '{:.2f}')} | "
            f"{r['fedray_state_equals_bound']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
