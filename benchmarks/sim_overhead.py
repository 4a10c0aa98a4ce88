"""Simulator overhead: fedray vs a single-process loop vs Flower vs pfl-research, same workload.

Workload (the issue's anchor): FedAvg, MLP 784-256-10, seeded synthetic data, 256 training
samples per client, batch 32, 1 local epoch, SGD lr 0.05, N clients all sampled, 5 rounds,
no evaluation. ``--workload femnist`` (issue #28's FEMNIST-shaped workload): LEAF's FEMNIST
CNN (6.6M parameters) on a generated LEAF-format FEMNIST of N writers with 100–300 samples
each, batch 10, read by fedray's LEAF reader and by the peers' scripts from the same files
(``benchmarks/femnist_workload.py``).

With ``--vectorize`` two more sides run: fedray with ``runtime.vectorize=on`` (cohorts of
``--cohort-size``, default ⌈N / 2⌉: one cohort per executor), and the vectorized bound —
the same cohorts through the method's batched hook (``cohort_update``) in this process, no
runtime, torch's default thread count: the limit the vectorized runtime is measured
against.

- bound: the identical computation in this process, no runtime — the same FedAvg client
  update and aggregation code fedray runs, called in a loop. Run twice, with torch's
  default thread count and with one thread (as fedray's executors use); the faster of the
  two is the bound, and the one-thread run must end in fedray's bitwise-identical state.
- fedray (cold): ``run_experiment`` on a fresh local Ray (started and shut down inside the
  timing), 2 executors of 1 CPU each.
- fedray (warm, opt-in ``--fedray-warm``): the same config with ``runtime.keep_warm=true``,
  run twice in this process; the second run is timed. It finds Ray up and takes the first
  run's driver and executors, emptied and reset (``fedray.runtime.warm``), so it pays
  neither Ray's start nor the actors' torch import; its final state must equal the cold
  run's bit for bit. Ray is shut down right after, before the next system runs. Then the
  same with ``runtime.reduce=executors`` (each executor call sends one partial sum instead
  of its uploads); its state is compared with the bound's loop summing the same groups
  (``reduce_in_groups``).
- flower: ``benchmarks/flower_sim.py`` under ``.venv-flower`` (Flower pins its own Ray),
  created by ``benchmarks/setup_flower_venv.sh``; skipped with a note when absent.
- pfl: ``benchmarks/pfl_sim.py`` under ``.venv-pfl`` (pfl-research, created by
  ``benchmarks/setup_pfl_venv.sh``; skipped with a note when absent): single process, run
  with torch's default thread count and with one thread, the faster (steady round) reported,
  as for the bound; and pfl's multi-worker simulation (``--workers 2``, torchrun, one thread
  per worker), reported as "pfl×2" when it runs (N must be even).

Per steady-state round = mean of rounds 2..R. End to end: bound, fedray and Flower = wall
time of the run inside an already started Python process that has torch imported (for
fedray and Flower Ray's start and shutdown included); pfl = from the start of its process
(interpreter start, torch and pfl imports, and with 2 workers torchrun and process-group
set-up included) to the end of training, as pfl_sim.py reports it; ``pfl_import_s`` in the
JSON says how much of it is the process start and imports.
The 2-process floor (``run_bound_parallel``): the bound's client updates split over two
processes that start each round together, one thread each, with no runtime, transfer or
aggregation: what two executors on this machine could do at best. The 2 Ray actors: the same
split in two plain Ray actors of one CPU (``run_bound_ray``): the floor plus what Ray's own
processes and calls cost, still without fedray's runtime, transfers or aggregation.
Ratios are against the bound measured in the same invocation. The issue's targets are
reported with each row: fedray s/round ÷ bound ≤ 0.55, fedray e2e ÷ pfl e2e (single
process) ≤ 0.6, fedray e2e ÷ Flower e2e ≤ 1/3.

    .venv/bin/python benchmarks/sim_overhead.py --clients 10 50 100 --out benchmarks/results
    .venv/bin/python benchmarks/sim_overhead.py --clients 10 --fedray-warm --no-flower
    .venv/bin/python benchmarks/sim_overhead.py --workload femnist --clients 100 --rounds 3 \
        --vectorize
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
TARGETS = {"fedray_round_over_bound": 0.55, "fedray_e2e_over_pfl": 0.6,
           "fedray_e2e_over_flower": 1 / 3}


def workload(n: int, rounds: int, seed: int, leaf_root: str | None = None) -> list[str]:
    """fedray's overrides: the MLP anchor workload, or with ``leaf_root`` the FEMNIST-shaped
    one (``benchmarks/femnist_workload.py``)."""
    if leaf_root is not None:
        from femnist_workload import fedray_overrides

        return fedray_overrides(leaf_root, n, rounds, seed,
                                os.path.join(os.path.dirname(leaf_root), "cache"))
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


def run_bound(cfg, threads: int | None = None, cohort: int | None = None) -> dict:
    """The same client updates and aggregation, in a loop, in this process; with ``cohort``
    the vectorized bound: the same clients as cohorts of ``cohort`` through the method's own
    batched hook (``cohort_update``, what ``runtime.vectorize=on`` runs), no runtime."""
    import torch

    from fedray.core.registry import build_method
    from fedray.data import build_data
    from fedray.methods.base import ClientContext

    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads)
    t0 = time.perf_counter()
    algo = build_method(cfg)
    data = build_data(cfg)
    model = algo.build_resident(data.input_shape, data.num_classes, "cpu")
    state = algo.init_global_state(model, cfg.seed)
    policy = algo.make_policy()
    times = []
    n = cfg.clients.num_clients
    for r in range(1, cfg.rounds + 1):
        tr = time.perf_counter()
        ups = []
        for first in range(0, n, cohort or 1):
            ctxs = []
            for c in range(first, min(n, first + (cohort or 1))):
                x, y = data.client_arrays(c, r, "train")
                xt, yt = data.client_arrays(c, r, "test")
                ctxs.append(ClientContext(c, r, cfg.seed, "default", x, y, xt, yt, model))
            outs = (algo.cohort_update(ctxs, state) if cohort
                    else [algo.client_update(ctxs[0], state)])
            ups += [(ctx.client_id, out.num_samples, out.upload)
                    for ctx, out in zip(ctxs, outs, strict=True)]
        if cfg.runtime.reduce == "executors":
            state = reduce_in_groups(cfg, policy, state, ups, r)
        else:
            state, _ = policy.aggregate(state, ups, r)
        times.append(time.perf_counter() - tr)
    e2e = time.perf_counter() - t0
    torch.set_num_threads(default_threads)
    samples = [data.num_samples(c, "train") for c in range(n)]
    return {"round_seconds": times, "e2e_seconds": e2e, "threads": threads or default_threads,
            "state": state, "mean_train_samples": float(np.mean(samples))}


def reduce_in_groups(cfg, policy, state: dict, ups: list, r: int) -> dict:
    """``runtime.reduce=executors`` by hand: Σ w_i Δ_i per group (the driver's 8 near-equal
    runs of the client-ordered sample), the groups' sums added in order, then the policy's
    step."""
    from fedray.methods.base import accumulate
    from fedray.runtime.dispatch import summation_groups

    total: dict = {}
    weight = 0.0
    for group in summation_groups(ups, cfg.runtime.chunk_size):
        part: dict = {}
        for _, n_samples, upload in group:
            accumulate(part, upload, policy.weight(n_samples))
            weight += policy.weight(n_samples)
        accumulate(total, part, 1.0)
    return policy.aggregate_sum(state, total, weight, r)[0]


class BoundHalf:
    """The client updates of clients ``c % parts == part``, one torch thread, every round
    from the initial model (which costs the same): one worker of the 2-process floors."""

    def __init__(self, overrides: list[str], part: int, parts: int):
        import torch

        torch.set_num_threads(1)
        from fedray.core.config import load_config
        from fedray.core.registry import build_method
        from fedray.data import build_data

        self.cfg = load_config(None, overrides)
        self.part, self.parts = part, parts
        self.algo = build_method(self.cfg)
        self.data = build_data(self.cfg)
        self.model = self.algo.build_resident(self.data.input_shape, self.data.num_classes,
                                              "cpu")
        self.state = self.algo.init_global_state(self.model, self.cfg.seed)

    def round(self, r: int) -> float:
        from fedray.methods.base import ClientContext

        t0 = time.perf_counter()
        for c in range(self.part, self.cfg.clients.num_clients, self.parts):
            x, y = self.data.client_arrays(c, r, "train")
            xt, yt = self.data.client_arrays(c, r, "test")
            self.algo.client_update(ClientContext(c, r, self.cfg.seed, "default", x, y, xt,
                                                  yt, self.model), self.state)
        return time.perf_counter() - t0


def _bound_half(overrides: list[str], part: int, parts: int, rounds: int, barrier,
                queue) -> None:
    """One of the processes of :func:`run_bound_parallel`, each round started on
    ``barrier``."""
    half = BoundHalf(overrides, part, parts)
    for r in range(1, rounds + 1):
        barrier.wait()
        queue.put((r, half.round(r)))


def run_bound_ray(overrides: list[str], rounds: int, parts: int = 2) -> list[float]:
    """The same split as :func:`run_bound_parallel` in ``parts`` plain Ray actors of one CPU
    on a fresh local Ray (no fedray runtime): what Ray's own processes cost the loop.
    A round's time is the wall time of one call to every actor."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=parts, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        actor = ray.remote(num_cpus=1)(BoundHalf)
        halves = [actor.remote(overrides, i, parts) for i in range(parts)]
        times = []
        for r in range(1, rounds + 1):
            t0 = time.perf_counter()
            ray.get([h.round.remote(r) for h in halves])
            times.append(time.perf_counter() - t0)
        return times
    finally:
        ray.shutdown()


def run_bound_parallel(overrides: list[str], rounds: int, parts: int = 2) -> list[float]:
    """The floor of any ``parts``-process simulator on this machine: the bound's client
    updates split over ``parts`` processes started together each round, with no runtime,
    transfer or aggregation at all (every round trains from the initial model, which costs
    the same). A round's time is its slowest process's."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(parts), ctx.Queue()
    procs = [ctx.Process(target=_bound_half, args=(overrides, i, parts, rounds, barrier, queue))
             for i in range(parts)]
    for p in procs:
        p.start()
    per_round: dict[int, float] = {}
    for _ in range(parts * rounds):
        r, dt = queue.get(timeout=1800)
        per_round[r] = max(per_round.get(r, 0.0), dt)
    for p in procs:
        p.join()
    return [per_round[r] for r in sorted(per_round)]


def run_fedray(cfg, run_dir: str, keep_ray: bool = False) -> dict:
    """One fedray run, timed from ``run_experiment`` to its return. A Ray left up by an
    earlier run is shut down first unless ``keep_ray`` (the warm run, which reuses it)."""
    import ray

    from fedray.core.storage import Storage
    from fedray.runtime import run_experiment

    if ray.is_initialized() and not keep_ray:
        ray.shutdown()
    stamps: list[float] = []
    t0 = time.perf_counter()
    run_experiment(cfg, run_dir, progress=False, on_round=lambda row: stamps.append(
        time.perf_counter()))
    e2e = time.perf_counter() - t0
    state = Storage(run_dir).read_checkpoint()["parts"]["server"]["params"]
    times = list(np.diff(stamps))
    return {"round_seconds": [float("nan")] + times, "e2e_seconds": e2e, "state": state}


def run_fedray_warm(cfg, out: str) -> dict:
    """``cfg`` (with ``runtime.keep_warm``): one run to warm up, then the timed one; Ray and
    the kept actors are shut down after it."""
    import ray

    from fedray.runtime import release_warm

    try:
        run_fedray(cfg, out + "-warmup")
        return run_fedray(cfg, out, keep_ray=True)
    finally:
        release_warm()
        ray.shutdown()


def run_flower(n: int, rounds: int, seed: int, leaf_root: str | None = None) -> dict | None:
    py = os.path.join(ROOT, ".venv-flower", "bin", "python")
    if not os.path.exists(py):
        return None
    cmd = [py, os.path.join(ROOT, "benchmarks", "flower_sim.py"), "--clients", str(n),
           "--rounds", str(rounds), "--seed", str(seed)]
    out = subprocess.run(cmd + (["--leaf-root", leaf_root] if leaf_root else []),
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


PFL_PY = os.path.join(ROOT, ".venv-pfl", "bin", "python")


def run_pfl(n: int, rounds: int, seed: int, workers: int = 1, threads: int | None = None,
            leaf_root: str | None = None) -> tuple[dict | None, str | None]:
    """``benchmarks/pfl_sim.py`` under ``.venv-pfl``: (its JSON line, None) or (None, why)."""
    cmd = [PFL_PY, os.path.join(ROOT, "benchmarks", "pfl_sim.py"), "--clients", str(n),
           "--rounds", str(rounds), "--seed", str(seed), "--workers", str(workers)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if leaf_root:
        cmd += ["--leaf-root", leaf_root]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        return None, f"pfl_sim.py --workers {workers} timed out"
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        print(out.stderr[-3000:], file=sys.stderr)
        return None, f"pfl_sim.py --workers {workers} failed (exit {out.returncode})"
    return json.loads(lines[-1]), None


def steady(times: list[float]) -> float:
    return float(np.mean(times[1:]))


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def add_fedray(row: dict, prefix: str, fed: dict, same: bool | str) -> None:
    """fedray's numbers and ratios under ``prefix`` ("fedray" cold, "fedray_warm")."""
    row[f"{prefix}_round_s"] = steady(fed["round_seconds"])
    row[f"{prefix}_e2e_s"] = fed["e2e_seconds"]
    row[f"{prefix}_state_equals_bound"] = same
    row[f"{prefix}_round_ratio"] = row[f"{prefix}_round_s"] / row["bound_round_s"]
    row[f"{prefix}_e2e_ratio"] = row[f"{prefix}_e2e_s"] / row["bound_e2e_s"]
    for other in ("flower", "pfl", "pfl2"):
        r = ratio(row[f"{prefix}_e2e_s"], row.get(f"{other}_e2e_s"))
        if r is not None:
            row[f"{prefix}_e2e_over_{other}"] = r
    meets = {"fedray_round_over_bound": row[f"{prefix}_round_ratio"]
             <= TARGETS["fedray_round_over_bound"]}
    for key, other in (("fedray_e2e_over_pfl", "pfl"), ("fedray_e2e_over_flower", "flower")):
        r = row.get(f"{prefix}_e2e_over_{other}")
        meets[key] = None if r is None else r <= TARGETS[key]
    row[f"{prefix}_meets_targets"] = meets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--no-pfl", action="store_true", help="skip pfl-research (.venv-pfl)")
    p.add_argument("--fedray-warm", action="store_true",
                   help="also time a second fedray run that reuses the first one's Ray, "
                        "driver and executors (runtime.keep_warm), with the uploads summed "
                        "on the driver and on the executors (runtime.reduce)")
    p.add_argument("--vectorize", action="store_true",
                   help="also time a cold fedray run with runtime.vectorize=on (its state is "
                        "the bound's up to float32 rounding: the column shows the largest "
                        "relative difference of a tensor)")
    p.add_argument("--no-floors", action="store_true",
                   help="skip the 2-process floor and the 2-Ray-actor floor")
    p.add_argument("--cohort-size", type=int, default=None,
                   help="runtime.cohort_size of the vectorized runs (default ceil(N / 2): "
                        "one cohort per executor)")
    p.add_argument("--workload", choices=["mlp", "femnist"], default="mlp",
                   help="mlp: the MLP 784-256-10 anchor (default); femnist: LEAF's FEMNIST "
                        "CNN on a generated LEAF-format FEMNIST of N writers with 100-300 "
                        "samples each (benchmarks/femnist_workload.py)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()

    from fedray.core.config import load_config

    os.makedirs(args.out, exist_ok=True)
    notes: list[str] = []
    use_pfl = not args.no_pfl
    if use_pfl and not os.path.exists(PFL_PY):
        use_pfl = False
        notes.append("pfl skipped: .venv-pfl is missing (bash benchmarks/setup_pfl_venv.sh)")
    if not args.no_flower and not os.path.exists(
            os.path.join(ROOT, ".venv-flower", "bin", "python")):
        notes.append("Flower skipped: .venv-flower is missing "
                     "(bash benchmarks/setup_flower_venv.sh)")
    for note in notes:
        print(f"[sim_overhead] {note}", file=sys.stderr)

    rows = [measure(n, args, load_config, use_pfl, notes) for n in args.clients]
    name = "sim_overhead.json" if args.workload == "mlp" else f"sim_overhead_{args.workload}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(rows, f, indent=2)
    print(markdown(rows, notes))


def measure(n: int, args, load_config, use_pfl: bool, notes: list[str]) -> dict:
    leaf = None
    if args.workload == "femnist":
        from femnist_workload import write

        leaf = write(os.path.join(args.out, f"femnist-leaf-{n}-{args.seed}", "data"), n,
                     args.seed)

    def over(*extra: str) -> list[str]:
        return workload(n, args.rounds, args.seed, leaf) + list(extra)

    cfg = load_config(None, over())
    bounds = [run_bound(cfg), run_bound(cfg, threads=1)]
    bound = min(bounds, key=lambda b: steady(b["round_seconds"]))
    floor2 = None if args.no_floors else steady(run_bound_parallel(over(), args.rounds))
    ray2 = None if args.no_floors else steady(run_bound_ray(over(), args.rounds))
    stamp = int(time.time())
    fed = run_fedray(cfg, os.path.join(args.out, f"run-n{n}-{stamp}"))
    same = all(np.array_equal(bounds[1]["state"][k], fed["state"][k]) for k in fed["state"])
    fed_warm = same_warm = fed_reduce = same_reduce = None
    if args.fedray_warm:
        warm = load_config(None, over("runtime.keep_warm=true"))
        fed_warm = run_fedray_warm(warm, os.path.join(args.out, f"run-n{n}-{stamp}-warm"))
        same_warm = all(np.array_equal(bounds[1]["state"][k], fed_warm["state"][k])
                        for k in fed_warm["state"])
        red = load_config(None, over("runtime.keep_warm=true", "runtime.reduce=executors"))
        fed_reduce = run_fedray_warm(red, os.path.join(args.out, f"run-n{n}-{stamp}-reduce"))
        ref = run_bound(red, threads=1)["state"]  # the same sums, grouped, in this process
        same_reduce = all(np.array_equal(ref[k], fed_reduce["state"][k]) for k in ref)
    fed_vec = gap = vbound = None
    if args.vectorize:
        cohort = args.cohort_size or -(-n // 2)  # one cohort per executor by default
        vec = load_config(None, over("runtime.vectorize=on", f"runtime.cohort_size={cohort}"))
        vbound = run_bound(vec, cohort=cohort)
        fed_vec = run_fedray(vec, os.path.join(args.out, f"run-n{n}-{stamp}-vectorized"))
        ref = bounds[1]["state"]
        gap = max(float(np.linalg.norm(fed_vec["state"][k] - ref[k]) /
                        max(float(np.linalg.norm(ref[k])), 1e-30)) for k in ref)
    flower = None if args.no_flower else run_flower(n, args.rounds, args.seed, leaf)

    pfl = pfl2 = None
    pfl_by_threads: dict = {}
    if use_pfl:
        runs = []
        for threads in (None, 1):
            res, note = run_pfl(n, args.rounds, args.seed, threads=threads, leaf_root=leaf)
            if res is None:
                notes.append(f"N={n}: {note}")
            else:
                runs.append(res)
                pfl_by_threads[res["threads"]] = steady(res["round_seconds"])
        pfl = min(runs, key=lambda r: steady(r["round_seconds"]), default=None)
        if n % 2:
            notes.append(f"N={n}: pfl×2 skipped (pfl's 2-worker simulation needs an even N)")
        else:
            pfl2, note = run_pfl(n, args.rounds, args.seed, workers=2, leaf_root=leaf)
            if pfl2 is None:
                notes.append(f"N={n}: {note}")

    row = {
        "workload": args.workload,
        "clients": n, "mean_train_samples": bound["mean_train_samples"],
        "bound_threads": bound["threads"],
        "bound_round_s_by_threads": {b["threads"]: steady(b["round_seconds"])
                                     for b in bounds},
        "bound_round_s": steady(bound["round_seconds"]),
        "bound2_round_s": floor2,
        "bound2_round_ratio": ratio(floor2, steady(bound["round_seconds"])),
        "ray2_round_s": ray2,
        "ray2_round_ratio": ratio(ray2, steady(bound["round_seconds"])),
        "flower_round_s": steady(flower["round_seconds"]) if flower else None,
        "bound_e2e_s": bound["e2e_seconds"],
        "flower_e2e_s": flower["e2e_seconds"] if flower else None,
        "flower_version": flower.get("flwr_version") if flower else None,
        "pfl_round_s": steady(pfl["round_seconds"]) if pfl else None,
        "pfl_e2e_s": pfl["e2e_seconds"] if pfl else None,
        "pfl_import_s": pfl.get("import_seconds") if pfl else None,
        "pfl_threads": pfl.get("threads") if pfl else None,
        "pfl_round_s_by_threads": pfl_by_threads or None,
        "pfl2_round_s": steady(pfl2["round_seconds"]) if pfl2 else None,
        "pfl2_e2e_s": pfl2["e2e_seconds"] if pfl2 else None,
        "pfl2_import_s": pfl2.get("import_seconds") if pfl2 else None,
        "pfl2_exit_s": pfl2.get("exit_seconds") if pfl2 else None,
        "pfl_version": (pfl or pfl2 or {}).get("pfl_version"),
        "targets": TARGETS,
    }
    for other in ("flower", "pfl", "pfl2"):
        if row[f"{other}_round_s"] is not None:
            row[f"{other}_round_ratio"] = row[f"{other}_round_s"] / row["bound_round_s"]
            row[f"{other}_e2e_ratio"] = row[f"{other}_e2e_s"] / row["bound_e2e_s"]
    add_fedray(row, "fedray", fed, same)
    if fed_vec is not None:
        row["vbound_round_s"] = steady(vbound["round_seconds"])
        row["vbound_threads"] = vbound["threads"]
        row["vbound_round_ratio"] = row["vbound_round_s"] / row["bound_round_s"]
        add_fedray(row, "fedray_vec", fed_vec, f"≈ ({gap:.0e})")
        row["fedray_vec_over_vbound"] = row["fedray_vec_round_s"] / row["vbound_round_s"]
        row["fedray_vec_over_fedray"] = row["fedray_vec_round_s"] / row["fedray_round_s"]
        row["fedray_vec_over_ray2"] = ratio(row["fedray_vec_round_s"], ray2)
    if fed_warm is not None:
        add_fedray(row, "fedray_warm", fed_warm, same_warm)
        add_fedray(row, "fedray_reduce", fed_reduce, same_reduce)
    print(json.dumps(row), file=sys.stderr)
    return row


def markdown(rows: list[dict], notes: list[str] | None = None) -> str:
    def f(v, fmt="{:.3f}"):
        return "–" if v is None else fmt.format(v)

    def x(v):
        return f(v, "{:.2f}×")

    def e(v):
        return f(v, "{:.1f}")

    def fedray_rows(r):
        yield "cold", "fedray"
        if "fedray_vec_round_s" in r:
            yield "cold, vectorize=on", "fedray_vec"
        if "fedray_warm_round_s" in r:
            yield "warm", "fedray_warm"
            yield "warm, reduce=executors", "fedray_reduce"

    t = TARGETS
    lines = ["Per steady-state round (s):", "",
             "| N | fedray Ray | bound | 2-process floor | floor/bound | 2 Ray actors | "
             "actors/bound | fedray | fedray/bound "
             f"(≤ {t['fedray_round_over_bound']:.2f}) | Flower | Flower/bound | pfl | "
             "pfl/bound | pfl×2 | pfl×2/bound | fedray state == bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode, k in fedray_rows(r):
            lines.append(
                f"| {r['clients']} | {mode} | {f(r['bound_round_s'])} | "
                f"{f(r.get('bound2_round_s'))} | {x(r.get('bound2_round_ratio'))} | "
                f"{f(r.get('ray2_round_s'))} | {x(r.get('ray2_round_ratio'))} | "
                f"{f(r[k + '_round_s'])} | {x(r[k + '_round_ratio'])} | "
                f"{f(r['flower_round_s'])} | {x(r.get('flower_round_ratio'))} | "
                f"{f(r['pfl_round_s'])} | {x(r.get('pfl_round_ratio'))} | "
                f"{f(r['pfl2_round_s'])} | {x(r.get('pfl2_round_ratio'))} | "
                f"{r[k + '_state_equals_bound']} |")
    vec = [r for r in rows if "vbound_round_s" in r]
    if vec:
        lines += ["", "Vectorized (`runtime.vectorize=on`) per steady-state round (s):", "",
                  "| N | bound | vectorized bound | vbound/bound | fedray off | fedray on | "
                  "on/bound | on/vbound | on/off | on/2 Ray actors | Flower | pfl |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in vec:
            lines.append(
                f"| {r['clients']} | {f(r['bound_round_s'])} | {f(r['vbound_round_s'])} | "
                f"{x(r['vbound_round_ratio'])} | {f(r['fedray_round_s'])} | "
                f"{f(r['fedray_vec_round_s'])} | {x(r['fedray_vec_round_ratio'])} | "
                f"{x(r['fedray_vec_over_vbound'])} | {x(r['fedray_vec_over_fedray'])} | "
                f"{x(r['fedray_vec_over_ray2'])} | {f(r['flower_round_s'])} | "
                f"{f(r['pfl_round_s'])} |")
    lines += ["", "End to end (s):", "",
              "| N | fedray Ray | bound | fedray | Flower | pfl | pfl×2 | fedray/Flower "
              f"(≤ {t['fedray_e2e_over_flower']:.2f}) | fedray/pfl "
              f"(≤ {t['fedray_e2e_over_pfl']:.2f}) | fedray/pfl×2 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode, k in fedray_rows(r):
            lines.append(
                f"| {r['clients']} | {mode} | {e(r['bound_e2e_s'])} | {e(r[k + '_e2e_s'])} | "
                f"{e(r['flower_e2e_s'])} | {e(r['pfl_e2e_s'])} | {e(r['pfl2_e2e_s'])} | "
                f"{f(r.get(k + '_e2e_over_flower'), '{:.2f}')} | "
                f"{f(r.get(k + '_e2e_over_pfl'), '{:.2f}')} | "
                f"{f(r.get(k + '_e2e_over_pfl2'), '{:.2f}')} |")
    lines += ["", "pfl e2e runs from its process start (interpreter, torch and pfl imports "
              "included; `pfl_import_s` in the JSON); bound, fedray and Flower e2e run inside "
              "a process that already has torch imported."]
    lines += [f"- {note}" for note in notes or []]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
