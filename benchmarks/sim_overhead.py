"""Simulator overhead: fedray vs a single-process loop vs Flower vs pfl-research, same workload.

Workload (the issue's anchor): FedAvg, MLP 784-256-10, seeded synthetic data, 256 training
samples per client, batch 32, 1 local epoch, SGD lr 0.05, N clients all sampled, 5 rounds,
no evaluation.

- bound: the identical computation in this process, no runtime — the same FedAvg client
  update and aggregation code fedray runs, called in a loop. Run twice, with torch's
  default thread count and with one thread (as fedray's executors use); the faster of the
  two is the bound, and the one-thread run must end in fedray's bitwise-identical state.
- fedray (cold): ``run_experiment`` on a fresh local Ray (started and shut down inside the
  timing), 2 executors of 1 CPU each.
- fedray (warm, opt-in ``--fedray-warm``): the same, joining a Ray head that this script
  started once before the first warm run (``ray start --head --block``, free ports, 2 CPUs,
  no dashboard, ``--node-ip-address 127.0.0.1``, which Ray replaces with the node IP (see
  ``WarmRay``), its own ``--temp-dir`` so ``/tmp/ray/ray_current_cluster`` is not touched)
  through ``RAY_ADDRESS=127.0.0.1:<port>`` set for that measurement only; the timing covers
  ``run_experiment`` and the driver's ``ray.shutdown()`` (disconnect), not the head's start.
  The head runs in a session of its own and every process of that session is killed at the
  end (never ``ray stop``, which would stop every Ray on the machine). It stays up, idle,
  during the later measurements of the invocation.
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
Ratios are against the bound measured in the same invocation. The issue's targets are
reported with each row: fedray s/round ÷ bound ≤ 0.55, fedray e2e ÷ pfl e2e (single
process) ≤ 0.6, fedray e2e ÷ Flower e2e ≤ 1/3.

    .venv/bin/python benchmarks/sim_overhead.py --clients 10 50 100 --out benchmarks/results
    .venv/bin/python benchmarks/sim_overhead.py --clients 10 --fedray-warm --no-flower
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"fedray_round_over_bound": 0.55, "fedray_e2e_over_pfl": 0.6,
           "fedray_e2e_over_flower": 1 / 3}


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


def run_fedray(cfg, run_dir: str, address: str | None = None) -> dict:
    """``address`` (warm): join that Ray through ``RAY_ADDRESS``, set for this run only; the
    timing then ends after the driver's ``ray.shutdown()`` (fedray leaves a Ray it joined
    connected)."""
    import ray

    from fedray.runtime import run_experiment
    from fedray.storage import Storage

    if ray.is_initialized():
        ray.shutdown()
    saved = os.environ.get("RAY_ADDRESS")
    if address:
        os.environ["RAY_ADDRESS"] = address
    stamps: list[float] = []
    try:
        t0 = time.perf_counter()
        try:
            run_experiment(cfg, run_dir, progress=False, on_round=lambda row: stamps.append(
                time.perf_counter()))
        finally:
            if address and ray.is_initialized():
                ray.shutdown()
        e2e = time.perf_counter() - t0
    finally:
        if address:
            if saved is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = saved
    s = Storage(run_dir)
    state = s.read_checkpoint()["global_state"]
    times = list(np.diff(stamps))
    return {"round_seconds": [float("nan")] + times, "e2e_seconds": e2e, "state": state}


def free_ports(k: int) -> list[int]:
    """``k`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(k):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(name))
    return pids


class WarmRay:
    """One local Ray head for the warm fedray runs, in a session of its own.

    ``ray start --head --block`` on 127.0.0.1 with free ports (GCS, client server, dashboard
    agent, runtime-env agent, metrics), 2 CPUs, no dashboard, and a ``--temp-dir`` of its own
    (so ``/tmp/ray/ray_current_cluster``, which a plain ``ray.init()`` reads, is left alone).
    :meth:`stop` signals exactly the processes of that session (the ``ray start`` process,
    GCS, raylet, agents and the workers the raylet forked all share it): SIGTERM, then
    SIGKILL for what is left after 10 s. Never ``ray stop``: that stops every Ray here.

    Ray 2.60 on Linux replaces a loopback ``--node-ip-address`` (and a loopback address in
    ``ray.init``) with the node's own IP, and its GCS listens on all interfaces; so the head
    is given this process's ``RAY_AUTH_MODE`` explicitly (``token`` once the cold run's local
    ``ray.init`` has switched this process to Ray's default token auth), and fedray's driver,
    joining through ``RAY_ADDRESS``, authenticates with the same token.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None
        self.temp_dir: str | None = None

    def start(self, timeout: float = 120.0) -> str:
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        if not os.path.exists(ray_bin):
            raise RuntimeError(f"--fedray-warm needs the ray CLI next to python: {ray_bin}")
        gcs, client, agent_http, agent_grpc, runtime_env, metrics = free_ports(6)
        self.temp_dir = tempfile.mkdtemp(prefix="rso", dir="/tmp")  # short: socket paths
        log_path = os.path.join(self.temp_dir, "ray_start.log")
        cmd = [ray_bin, "start", "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1",
               "--num-cpus=2", "--include-dashboard=false",
               f"--ray-client-server-port={client}",
               f"--dashboard-agent-listen-port={agent_http}",
               f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
               f"--temp-dir={self.temp_dir}", "--disable-usage-stats", "--block"]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")  # = the driver's
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        t0 = time.perf_counter()
        while True:
            with open(log_path) as f:
                text = f.read()
            if "Ray runtime started" in text:
                break
            if self.proc.poll() is not None or time.perf_counter() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"warm Ray head did not start:\n{text[-3000:]}")
            time.sleep(0.2)
        self.address = f"127.0.0.1:{gcs}"
        print(f"[sim_overhead] warm Ray head at {self.address} (pid {self.proc.pid}) up in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return self.address

    def stop(self) -> None:
        if self.proc is None:
            return
        sid = self.proc.pid
        if sid != os.getsid(0):  # never our own session
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                for pid in session_pids(sid):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.perf_counter() + wait
                while session_pids(sid) and time.perf_counter() < deadline:
                    self.proc.poll()  # reap the ray start process once it exits
                    time.sleep(0.2)
                if not session_pids(sid):
                    break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        left = session_pids(sid)
        if left:
            print(f"[sim_overhead] warm Ray: processes {left} of session {sid} survived",
                  file=sys.stderr)
        else:
            print(f"[sim_overhead] warm Ray head {self.address} stopped", file=sys.stderr)
        self.proc = None
        if self.temp_dir and not left:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


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


PFL_PY = os.path.join(ROOT, ".venv-pfl", "bin", "python")


def run_pfl(n: int, rounds: int, seed: int, workers: int = 1,
            threads: int | None = None) -> tuple[dict | None, str | None]:
    """``benchmarks/pfl_sim.py`` under ``.venv-pfl``: (its JSON line, None) or (None, why)."""
    cmd = [PFL_PY, os.path.join(ROOT, "benchmarks", "pfl_sim.py"), "--clients", str(n),
           "--rounds", str(rounds), "--seed", str(seed), "--workers", str(workers)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
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


def add_fedray(row: dict, prefix: str, fed: dict, same: bool) -> None:
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
                   help="also time fedray joining one Ray head started once beforehand")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()

    from fedray.config import load_config

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

    warm = WarmRay() if args.fedray_warm else None
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    if warm is not None:  # a SIGTERM must still stop the head (via the finally below)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    try:
        for n in args.clients:
            rows.append(measure(n, args, load_config, warm, use_pfl, notes))
    finally:
        if warm is not None:
            warm.stop()
            signal.signal(signal.SIGTERM, previous_sigterm)
    with open(os.path.join(args.out, "sim_overhead.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print(markdown(rows, notes))


def measure(n: int, args, load_config, warm: WarmRay | None, use_pfl: bool,
            notes: list[str]) -> dict:
    cfg = load_config(None, workload(n, args.rounds, args.seed))
    bounds = [run_bound(cfg), run_bound(cfg, threads=1)]
    bound = min(bounds, key=lambda b: steady(b["round_seconds"]))
    stamp = int(time.time())
    fed = run_fedray(cfg, os.path.join(args.out, f"run-n{n}-{stamp}"))
    same = all(np.array_equal(bounds[1]["state"][k], fed["state"][k]) for k in fed["state"])
    fed_warm = same_warm = None
    if warm is not None:
        address = warm.address or warm.start()
        fed_warm = run_fedray(cfg, os.path.join(args.out, f"run-n{n}-{stamp}-warm"), address)
        same_warm = all(np.array_equal(bounds[1]["state"][k], fed_warm["state"][k])
                        for k in fed_warm["state"])
    flower = None if args.no_flower else run_flower(n, args.rounds, args.seed)

    pfl = pfl2 = None
    pfl_by_threads: dict = {}
    if use_pfl:
        runs = []
        for threads in (None, 1):
            res, note = run_pfl(n, args.rounds, args.seed, threads=threads)
            if res is None:
                notes.append(f"N={n}: {note}")
            else:
                runs.append(res)
                pfl_by_threads[res["threads"]] = steady(res["round_seconds"])
        pfl = min(runs, key=lambda r: steady(r["round_seconds"]), default=None)
        if n % 2:
            notes.append(f"N={n}: pfl×2 skipped (pfl's 2-worker simulation needs an even N)")
        else:
            pfl2, note = run_pfl(n, args.rounds, args.seed, workers=2)
            if pfl2 is None:
                notes.append(f"N={n}: {note}")

    row = {
        "clients": n, "mean_train_samples": bound["mean_train_samples"],
        "bound_threads": bound["threads"],
        "bound_round_s_by_threads": {b["threads"]: steady(b["round_seconds"])
                                     for b in bounds},
        "bound_round_s": steady(bound["round_seconds"]),
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
    if fed_warm is not None:
        add_fedray(row, "fedray_warm", fed_warm, same_warm)
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
        if "fedray_warm_round_s" in r:
            yield "warm", "fedray_warm"

    t = TARGETS
    lines = ["Per steady-state round (s):", "",
             "| N | fedray Ray | bound | fedray | fedray/bound "
             f"(≤ {t['fedray_round_over_bound']:.2f}) | Flower | Flower/bound | pfl | "
             "pfl/bound | pfl×2 | pfl×2/bound | fedray state == bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode, k in fedray_rows(r):
            lines.append(
                f"| {r['clients']} | {mode} | {f(r['bound_round_s'])} | "
                f"{f(r[k + '_round_s'])} | {x(r[k + '_round_ratio'])} | "
                f"{f(r['flower_round_s'])} | {x(r.get('flower_round_ratio'))} | "
                f"{f(r['pfl_round_s'])} | {x(r.get('pfl_round_ratio'))} | "
                f"{f(r['pfl2_round_s'])} | {x(r.get('pfl2_round_ratio'))} | "
                f"{r[k + '_state_equals_bound']} |")
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
