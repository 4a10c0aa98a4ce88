"""Population scale: fedray, Flower and pfl-research from 1e4 to 1e7 clients, 100 to 10,000
per round.

Issue #12, deliverable 5(a): for every total population N and clients sampled per round K
(K <= N), one table row per system with setup seconds, seconds per round, the ratio of the
round time to a single-process bound on the same K clients, and the peak summed RSS of all
the processes the system ran — fedray and Flower's ``run_simulation`` side by side in the
same invocation, Flower as far as it goes.

Workload (the same for all three):

* FedAvg, MLP 32-32-10 (``Linear(32, 32), ReLU, Linear(32, 10)``, 1,386 parameters);
* each client: 20 synthetic samples of 32 features and 10 classes, drawn on demand from
  (seed, client id), nothing stored per client. fedray keeps the last
  ``round(0.2 * 20) = 4`` as the client's local test split (``data.local_test_fraction``,
  never evaluated here) and trains on 16; the bound and Flower are given the training-sample
  count fedray reports (16), so all three do the same arithmetic;
* 1 local epoch, batch 32 (one SGD step per client), SGD lr 0.05, cross-entropy;
* K clients sampled per round, R rounds (``--rounds``, default 3);
* no evaluation of any kind (no per-client, global-test or federated evaluation; Flower:
  ``fraction_evaluate=0``): the cheapest setting, and the same for every system;
* 2 workers: fedray ``runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]``; Flower
  ``client_resources.num_cpus = CPUs / 2`` (2 client actors on this 2-core machine).

Systems and how each is measured:

* **fedray** — in a fresh subprocess per configuration (so memory is per configuration),
  through the Python API: ``load_config(None, overrides)``, ``Experiment(cfg, run_dir,
  overwrite=True)``, ``exp.start()``, ``exp.step()`` until ``exp.done``, ``exp.close()``,
  ``exp.release()`` in a ``finally``. Overrides: ``data.dataset=synthetic
  data.synthetic_features=32 data.synthetic_classes=10 data.synthetic_per_client=20
  clients.num_clients=N clients.per_round=K rounds=R model.name=mlp model.hidden=[32]
  local.epochs=1 local.batch_size=32 local.lr=0.05 eval.clients=none eval.every=0
  eval.global_test=false runtime.include_dashboard=false runtime.reduce=driver`` (or
  ``executors`` with ``--reduce executors``) and the tier above. *Setup* =
  from just before ``load_config`` to the end of ``exp.start()`` (config, building the
  client data, starting a fresh local Ray, placing the driver and executors). *s/round* =
  median of the wall times of the ``exp.step()`` calls (every round counted; all are in the
  JSON, with the driver's own per-round seconds). Checkpoints are written every round
  (fedray's default), as in any fedray run.
  Before ``data.synthetic_per_client`` existed the script fell back to one pooled set of
  ``data.synthetic_samples = 20 N`` split among the clients; it still does when the key is
  missing, but only for N <= 100,000 (that set grows with N).
* **Flower** — ``.venv-flower/bin/python benchmarks/flower_sim.py`` in its scale mode
  (``--clients N --per-round K --features 32 --hidden 32 --classes 10 --samples S
  --rounds R --ray-local``): ``flwr.simulation.run_simulation`` with a Message-API
  ``ClientApp`` and ``FedAvg(fraction_train=K/N, min_train_nodes=K)``. *Setup* = start of
  ``run_simulation`` to the moment the first client began training (the wall clock its
  actor reports; Flower starts Ray and its actors while round 1 is already under way, so
  the first ``configure_train`` comes after 0.1 s and says nothing); *s/round* = median of
  the times between consecutive ``aggregate_train`` ends (round 1 from the first
  ``configure_train``, so it carries that setup — the median of 3 rounds does not; all
  rounds are in the JSON). Each configuration has a
  wall-clock cap (``--timeout``, default 600 s); at the cap the run is stopped and the row
  says "timeout after X s" with the rounds finished by then (and the RSS reached). Flower
  runs only for N <= ``--flower-max-population`` (default 100,000; its earlier runs here:
  212 s per round at 100K / 1,000), and not at a larger N for a K at which it already timed
  out or failed (its round time grows with N).
* **pfl-research** — ``.venv-pfl/bin/python benchmarks/pfl_sim.py`` in its scale mode
  (``--clients N --per-round K --features 32 --hidden 32 --classes 10 --samples S --rounds R
  --threads 1 --workers W``): pfl's ``FederatedAveraging`` on a ``SimulatedBackend``, each
  user's data drawn by pfl's ``make_dataset_fn`` from (seed, user id) when the user is
  sampled, ``MinimizeReuseUserSampler`` (K distinct users a round, in id order), central SGD
  at lr 1.0 (plain FedAvg). Two rows: one process with one torch thread (W = 1, the way
  the bound runs), and ``--executors`` torchrun workers of one thread each (pfl's own
  multi-worker simulation, "pfl-research ×2"; K must be a multiple of W). *s/round* = median
  of pfl's round times (from a ``TrainingProcessCallback``); *setup* = the process's wall
  time to the end of training less its rounds (interpreter start, imports, torchrun and
  process-group set-up). Same cap (``--timeout``) as Flower. ``--no-pfl`` skips it; it is
  skipped with a note when ``.venv-pfl`` is absent (``bash benchmarks/setup_pfl_venv.sh``).
* **bound** — one process, plain PyTorch, one thread (``--bound-threads``): the K clients of
  a round one after another, each drawing its S x 32 samples from (seed, client id),
  loading the global weights, one epoch of SGD, its delta added to a sample-weighted sum;
  the global model moves by the average delta. *s/round* = median over the R rounds
  (data drawing included, as in the two systems). Measured once per (K, S); its *setup* is
  the import of torch and building the model.

*Peak summed RSS*: every 0.2 s the RSS (resident set size as ``/proc/PID/stat`` reports it,
the figure ``psutil.Process.memory_info().rss`` gives) of the configuration's process and
of all processes it started (its descendants plus its session: the child runs in a session
of its own, so Ray's gcs, raylet and workers are found even once re-parented) is summed; the
peak of that sum is reported, in GB (10^9 bytes). Shared memory (Ray's object store in
/dev/shm, shared libraries, the pages of a forked worker) is counted in every process that
maps it, so the sum over-counts what the machine actually spends; it is the figure the
issue asks for ("peak summed RSS of all Ray + CLI processes"). The benchmark's own parent
process is not counted. A configuration is stopped when the machine's available memory
falls below ``--min-free-gb`` (default 1.0) or the sum exceeds ``--max-rss-gb`` (off by
default); its row then reads "stopped at the memory guard" with the RSS reached, i.e. the
memory it needed is more than that. When a configuration ends, any of its processes still
alive (found by pid) are terminated — never anything else (no ``ray stop``).

Full grid (hours: fedray setup at 1e7, Flower up to its cap per configuration)::

    .venv/bin/python benchmarks/scale.py --populations 10000 100000 1000000 10000000 \\
        --per-round 100 1000 10000 --rounds 3 --out benchmarks/results/scale

writes ``scale.json`` (every raw number, rewritten after each configuration) and
``scale.md`` (the table), and prints the table. ``--no-flower`` skips Flower.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOWER_PY = os.path.join(ROOT, ".venv-flower", "bin", "python")
FLOWER_SIM = os.path.join(ROOT, "benchmarks", "flower_sim.py")
PFL_PY = os.path.join(ROOT, ".venv-pfl", "bin", "python")
PFL_SIM = os.path.join(ROOT, "benchmarks", "pfl_sim.py")

FEATURES, HIDDEN, CLASSES = 32, 32, 10
SAMPLES_PER_CLIENT = 20
BATCH_SIZE, LOCAL_EPOCHS, LR = 32, 1, 0.05
FALLBACK_MAX_POPULATION = 100_000  # the pooled-data fallback's limit (memory grows with N)
GB = 1e9
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# ============================================================================ process trees

def _proc_stat(pid: int) -> tuple[int, int, int, int] | None:
    """(ppid, session, starttime, rss bytes) of ``pid`` from /proc, or None if it is gone
    or a zombie (exited, only waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    # rest[0] is the state (field 3); ppid 4, session 6, starttime 22, rss 24 (in pages)
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), int(rest[3]), int(rest[19]), int(rest[21]) * PAGE


def _title(pid: int) -> str:
    """The start of ``pid``'s command line (a Ray actor's reads ``ray::Executor...``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:80].strip()
    except OSError:
        return ""


def _all_stats() -> dict[int, tuple[int, int, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


class TreeSampler(threading.Thread):
    """Samples the summed RSS of ``root`` and every process it started, every ``interval``
    seconds, until :meth:`stop`. ``root`` must lead a session of its own
    (``start_new_session=True``): members are its descendants plus that session's
    processes. Trips ``guard`` (and calls ``on_guard``) when the machine's available memory
    falls below ``min_free`` bytes or the sum exceeds ``max_rss`` bytes."""

    def __init__(self, root: int, interval: float = 0.2, min_free: float = 0.0,
                 max_rss: float | None = None, on_guard=None):
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.min_free, self.max_rss, self.on_guard = min_free, max_rss, on_guard
        self.peak_bytes = 0
        self.peak_procs = 0
        self.peak_by_pid: dict[int, int] = {}  # pid -> its own peak RSS
        self.titles: dict[int, str] = {}  # pid -> its command line's start (ray::Executor)
        self.samples = 0
        self.seen: dict[int, int] = {}  # pid -> starttime of every member ever sampled
        self.guard: str | None = None
        self._halt = threading.Event()

    def members(self, stats: dict[int, tuple[int, int, int, int]] | None = None
                ) -> dict[int, tuple[int, int, int, int]]:
        stats = _all_stats() if stats is None else stats
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        found = {pid for pid, st in stats.items() if st[1] == self.root}
        stack = [self.root] if self.root in stats else []
        while stack:
            pid = stack.pop()
            found.add(pid)
            stack.extend(c for c in children.get(pid, ()) if c not in found)
        # members seen before (same pid and start time) that left the tree and the session
        found |= {pid for pid, start in self.seen.items()
                  if pid in stats and stats[pid][2] == start}
        return {pid: stats[pid] for pid in found}

    def sample(self) -> int:
        import psutil

        members = self.members()
        for pid, st in members.items():
            self.seen[pid] = st[2]
            self.peak_by_pid[pid] = max(st[3], self.peak_by_pid.get(pid, 0))
            if not self.titles.get(pid, "").startswith("ray::"):  # Ray renames its workers
                self.titles[pid] = _title(pid) or self.titles.get(pid, "")
        total = sum(st[3] for st in members.values())
        self.samples += 1
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_procs = total, len(members)
        if self.guard is None:
            avail = psutil.virtual_memory().available
            if avail < self.min_free:
                self.guard = (f"machine memory nearly exhausted ({avail / GB:.2f} GB "
                              f"available) at {total / GB:.2f} GB summed RSS")
            elif self.max_rss is not None and total > self.max_rss:
                self.guard = f"summed RSS {total / GB:.2f} GB over --max-rss-gb"
            if self.guard is not None and self.on_guard is not None:
                self.on_guard()
        return total

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 — never let sampling kill the benchmark
                print(f"scale: RSS sampling error: {e!r}", file=sys.stderr)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def leftovers(self) -> dict[int, tuple[int, int, int, int]]:
        """Members still alive (the root included, unless reaped)."""
        return self.members()

    def kill_all(self, grace: float = 5.0) -> list[int]:
        """SIGTERM, then after ``grace`` seconds SIGKILL, every member still alive; only
        processes this configuration started (by pid and start time). Returns their pids."""
        targets = self.leftovers()
        if not targets:
            return []
        for pid in targets:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            alive = {p for p, st in targets.items() if _same_process(p, st[2])}
            if not alive:
                break
            time.sleep(0.2)
        for pid, st in targets.items():
            if _same_process(pid, st[2]):
                _signal(pid, signal.SIGKILL)
        return sorted(targets)


def _same_process(pid: int, starttime: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[2] == starttime


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without RAY_ADDRESS (every configuration starts its own local Ray,
    never joins one), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.update(extra or {})
    return env


def run_measured(cmd: list[str], log_path: str, timeout: float, min_free_gb: float,
                 max_rss_gb: float | None, stdout_path: str | None = None,
                 env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` in a session of its own with its RSS tree sampled; stop it at ``timeout``
    seconds or at the memory guard; terminate whatever of it is left when it ends."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "wb") as log, \
            open(stdout_path or os.devnull, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env or child_env(), stdout=out,
                                stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        tripped = threading.Event()
        sampler = TreeSampler(proc.pid, min_free=min_free_gb * GB,
                              max_rss=None if max_rss_gb is None else max_rss_gb * GB,
                              on_guard=tripped.set)
        sampler.start()
        timed_out = False
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if tripped.is_set():
                    sampler.kill_all(grace=0.0)  # memory: no grace
                    proc.wait()
                    break
                if time.perf_counter() - t0 > timeout:
                    timed_out = True
                    sampler.kill_all(grace=10.0)
                    proc.wait()
                    break
        except BaseException:
            sampler.kill_all(grace=2.0)
            proc.wait()
            raise
        finally:
            wall = time.perf_counter() - t0
            sampler.stop()
            deadline = time.monotonic() + 3.0  # let Ray's own shutdown finish first
            while sampler.leftovers() and time.monotonic() < deadline:
                time.sleep(0.2)
            left = sampler.kill_all(grace=5.0)
    return {"returncode": proc.returncode, "wall_seconds": wall, "timed_out": timed_out,
            "timeout_seconds": timeout,
            "memory_guard": sampler.guard, "peak_rss_gb": sampler.peak_bytes / GB,
            "peak_rss_processes": sampler.peak_procs, "rss_samples": sampler.samples,
            "process_peaks": sorted(([sampler.titles.get(p, ""), b / GB]
                                     for p, b in sampler.peak_by_pid.items()),
                                    key=lambda t: -t[1])[:12],
            "processes_seen": len(sampler.seen), "leftovers_killed": left}


def log_tail_reason(log_path: str, limit: int = 300) -> str:
    """The last line of a log that looks like an error, else its last non-empty line."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 200_000))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()
                     if ln.strip()]
    except OSError:
        return "no log"
    keys = ("Error", "Exception", "error:", "Killed", "MemoryError", "OOM")
    hits = [ln for ln in lines if any(k in ln for k in keys)]
    line = (hits or lines or ["(empty log)"])[-1]
    return line[:limit]


# ============================================================================ children

def fedray_overrides(n: int, k: int, rounds: int, seed: int, executors: int,
                     per_client_key: bool, reduce: str = "driver",
                     cohort: int | None = None, vectorize: bool = False) -> list[str]:
    """fedray's config of the workload; ``vectorize``: ``runtime.vectorize=on``, in cohorts
    of ``cohort`` (``runtime.cohort_size``; None: fedray's own rule)."""
    data = ([f"data.synthetic_per_client={SAMPLES_PER_CLIENT}"] if per_client_key
            else [f"data.synthetic_samples={SAMPLES_PER_CLIENT * n}"])
    return [
        "name=scale", f"seed={seed}", f"rounds={rounds}",
        "data.dataset=synthetic", f"data.synthetic_features={FEATURES}",
        f"data.synthetic_classes={CLASSES}", *data,
        f"clients.num_clients={n}", f"clients.per_round={k}",
        "model.name=mlp", f"model.hidden=[{HIDDEN}]",
        f"local.epochs={LOCAL_EPOCHS}", f"local.batch_size={BATCH_SIZE}", f"local.lr={LR}",
        "eval.clients=none", "eval.every=0", "eval.global_test=false",
        f"runtime.tiers=[{{name: default, executors: {executors}, num_cpus: 1}}]",
        "runtime.include_dashboard=false", f"runtime.reduce={reduce}",
        *(["runtime.vectorize=on"] if vectorize or cohort else []),
        *([f"runtime.cohort_size={cohort}"] if cohort else []),
    ]


def default_train_samples() -> int:
    """Training samples of a client of SAMPLES_PER_CLIENT under fedray's default local split
    (its last clip(round(f n), 1, n - 1) samples are local test); fedray's own report wins."""
    from fedray.core.config import DataConfig

    n, f = SAMPLES_PER_CLIENT, DataConfig().local_test_fraction
    return n - min(max(round(f * n), 1), n - 1)


def has_per_client_key() -> bool:
    from fedray.core.config import DataConfig

    return "synthetic_per_client" in {f.name for f in dataclasses.fields(DataConfig)}


def _write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def child_fedray(spec: dict) -> None:
    """One fedray configuration, timed; writes ``spec["result"]``."""
    t_import = time.perf_counter()
    from fedray.core.config import load_config
    from fedray.runtime.experiment import Experiment

    out: dict = {"import_seconds": time.perf_counter() - t_import}
    exp = None
    try:
        t0 = time.perf_counter()
        cfg = load_config(None, spec["overrides"])
        t_cfg = time.perf_counter()
        exp = Experiment(cfg, spec["run_dir"], overwrite=True)
        t_data = time.perf_counter()
        exp.start()
        t_started = time.perf_counter()
        out.update(config_seconds=t_cfg - t0, data_seconds=t_data - t_cfg,
                   start_seconds=t_started - t_data, setup_seconds=t_started - t0)
        data = exp.data
        out["data_kind"] = type(data).__name__
        if hasattr(data, "num_samples"):  # client tables (FAVoR's text has its own shape)
            probe = range(min(cfg.clients.num_clients, 1000))
            sizes = [data.num_samples(c, "train") for c in probe]
            out.update(train_samples_mean=sum(sizes) / len(sizes),
                       train_samples_min=min(sizes), train_samples_max=max(sizes))
        rounds, driver, sampled, ok = [], [], [], []
        while not exp.done:
            t = time.perf_counter()
            row = exp.step()
            rounds.append(time.perf_counter() - t)
            driver.append(row.get("seconds"))
            sampled.append(row.get("sampled"))
            ok.append(row.get("ok"))
            print(f"scale: fedray round {row['round']}: {rounds[-1]:.3f} s", file=sys.stderr,
                  flush=True)
        out.update(round_seconds=rounds, driver_round_seconds=driver,
                   sampled_per_round=sampled, ok_per_round=ok)
        t = time.perf_counter()
        exp.close()
        out["close_seconds"] = time.perf_counter() - t
        out["e2e_seconds"] = time.perf_counter() - t0
        import ray
        import torch

        out.update(ray_version=ray.__version__, torch_version=torch.__version__)
    except BaseException as e:
        out["error"] = f"{type(e).__name__}: {e}"[:1000]
        traceback.print_exc()
        raise
    finally:
        try:
            if exp is not None:
                exp.release()
        finally:
            if "ray" in sys.modules:
                import ray

                if ray.is_initialized():
                    ray.shutdown()
            _write_json(spec["result"], out)


def child_bound(spec: dict) -> None:
    """The single-process bound for K clients of S samples; writes ``spec["result"]``."""
    t0 = time.perf_counter()
    import numpy as np
    import torch
    from torch import nn

    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    k, s, seed = int(spec["per_round"]), int(spec["samples"]), int(spec["seed"])
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    params = list(model.parameters())
    global_w = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    setup = time.perf_counter() - t0
    times, losses = [], []
    for r in range(1, int(spec["rounds"]) + 1):
        t = time.perf_counter()
        acc = [torch.zeros_like(w) for w in global_w]
        total_n, total_loss = 0, 0.0
        for i in range(k):
            cid = (r - 1) * k + i  # K distinct clients per round
            gen = np.random.default_rng([seed, cid])
            x = torch.from_numpy(gen.standard_normal((s, FEATURES), dtype=np.float32))
            y = torch.from_numpy(gen.integers(0, CLASSES, size=s, dtype=np.int64))
            with torch.no_grad():
                for p, w in zip(params, global_w, strict=True):
                    p.copy_(w)
            tg = torch.Generator().manual_seed(seed * 1_000_003 + cid * 1_009 + r)
            for _ in range(LOCAL_EPOCHS):
                perm = torch.randperm(s, generator=tg)
                for start in range(0, s, BATCH_SIZE):
                    idx = perm[start:start + BATCH_SIZE]
                    opt.zero_grad()
                    loss = loss_fn(model(x[idx]), y[idx])
                    loss.backward()
                    opt.step()
                    total_loss += float(loss.detach())
            with torch.no_grad():
                for a, p, w in zip(acc, params, global_w, strict=True):
                    a.add_(p - w, alpha=s)
            total_n += s
        with torch.no_grad():
            for w, a in zip(global_w, acc, strict=True):
                w.add_(a / total_n)
        times.append(time.perf_counter() - t)
        losses.append(total_loss / k)
    _write_json(spec["result"], {"setup_seconds": setup, "round_seconds": times,
                                 "train_loss": losses, "threads": threads,
                                 "torch_version": torch.__version__})


def child_vbound(spec: dict) -> None:
    """The vectorized single-process bound: the same K clients and data as
    :func:`child_bound`, their local SGD batched with ``torch.func`` (``vmap`` over
    ``grad`` of a ``functional_call``, parameters stacked along a client axis) in
    ``⌈K / cohort⌉`` near-equal cohorts (as fedray cuts a ``reduce=driver`` round; with
    ``reduce=executors`` fedray cuts each of its summation groups, the same cohorts at
    K = 1,000 and 10,000), one thread; writes ``spec["result"]``."""
    t0 = time.perf_counter()
    import numpy as np
    import torch
    from torch import nn
    from torch.func import functional_call, grad_and_value, vmap

    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    k, s, seed, size = (int(spec["per_round"]), int(spec["samples"]), int(spec["seed"]),
                        int(spec["cohort"]))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    names = [n for n, _ in model.named_parameters()]
    global_w = {n: p.detach().clone() for n, p in model.named_parameters()}

    def loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(model, params, (x,)), y)

    step = vmap(grad_and_value(loss))
    setup = time.perf_counter() - t0
    times, losses = [], []
    for r in range(1, int(spec["rounds"]) + 1):
        t = time.perf_counter()
        acc = {n: torch.zeros_like(w) for n, w in global_w.items()}
        total_loss = 0.0
        runs = -(-k // size)
        q, rem = divmod(k, runs)
        cuts = [i * q + min(i, rem) for i in range(runs + 1)]
        for first, last in zip(cuts[:-1], cuts[1:], strict=True):
            m = last - first
            xs = torch.empty(m, s, FEATURES)
            ys = torch.empty(m, s, dtype=torch.int64)
            perms = torch.empty(m, s, dtype=torch.int64)
            for i in range(m):
                cid = (r - 1) * k + first + i
                gen = np.random.default_rng([seed, cid])
                xs[i] = torch.from_numpy(gen.standard_normal((s, FEATURES), dtype=np.float32))
                ys[i] = torch.from_numpy(gen.integers(0, CLASSES, size=s, dtype=np.int64))
                tg = torch.Generator().manual_seed(seed * 1_000_003 + cid * 1_009 + r)
                perms[i] = torch.randperm(s, generator=tg)
            params = {n: w.unsqueeze(0).repeat(m, *[1] * w.dim()) for n, w in global_w.items()}
            rows = torch.arange(m)[:, None]
            for _ in range(LOCAL_EPOCHS):
                for start in range(0, s, BATCH_SIZE):
                    idx = perms[:, start:start + BATCH_SIZE]
                    grads, values = step(params, xs[rows, idx], ys[rows, idx])
                    params = {n: params[n] - LR * grads[n] for n in names}
                    total_loss += float(values.sum())
            for n in names:
                acc[n] += (params[n] - global_w[n]).sum(0) * s
        for n in names:
            global_w[n] += acc[n] / (k * s)
        times.append(time.perf_counter() - t)
        losses.append(total_loss / k)
    _write_json(spec["result"], {"setup_seconds": setup, "round_seconds": times,
                                 "train_loss": losses, "threads": threads, "cohort": size,
                                 "torch_version": torch.__version__})


# ============================================================================ parent

def median(xs: list[float] | None) -> float | None:
    return float(statistics.median(xs)) if xs else None


def run_child(kind: str, spec: dict, work: str, tag: str, timeout: float,
              args: argparse.Namespace) -> tuple[dict, dict]:
    """Run ``scale.py --child KIND`` measured; (its result JSON or {}, the measurement)."""
    spec = dict(spec, result=os.path.join(work, f"{tag}.result.json"))
    spec_path = os.path.join(work, f"{tag}.spec.json")
    _write_json(spec_path, spec)
    if os.path.exists(spec["result"]):
        os.unlink(spec["result"])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, spec_path]
    meas = run_measured(cmd, os.path.join(args.out, "logs", f"{tag}.log"), timeout,
                        args.min_free_gb, args.max_rss_gb)
    result = {}
    if os.path.exists(spec["result"]):
        with open(spec["result"]) as f:
            result = json.load(f)
    return result, meas


def failure_note(meas: dict, result: dict, log_path: str, done: int, rounds: int) -> str | None:
    if meas["memory_guard"]:
        return (f"stopped at the memory guard: {meas['memory_guard']} "
                f"(needs more than {meas['peak_rss_gb']:.1f} GB summed RSS)")
    if meas["timed_out"]:
        return f"timeout after {meas['timeout_seconds']:g} s ({done}/{rounds} rounds done)"
    if meas["returncode"] != 0 or result.get("error"):
        rc = meas["returncode"]
        why = result.get("error") or log_tail_reason(log_path)
        if rc is not None and rc < 0:
            why = f"killed by {signal.Signals(-rc).name}; {why}"
        return f"failed: {why}"
    return None


def fedray_cohort(n: int, k: int, args: argparse.Namespace, per_client_key: bool) -> int:
    """The cohort size of the vectorized rows: ``--cohort-size``, or what fedray's rule
    gives a round of ``k`` clients with ``runtime.cohort_size`` unset."""
    if args.cohort_size:
        return args.cohort_size
    from fedray.core.config import load_config
    from fedray.methods.base import cohort_size
    from fedray.methods.fedavg.method import FedAvg

    cfg = load_config(None, fedray_overrides(n, k, args.rounds, args.seed, args.executors,
                                             per_client_key, args.reduce, vectorize=True))
    return cohort_size(cfg, FedAvg, (FEATURES,), CLASSES).of(k)


def run_fedray(n: int, k: int, args: argparse.Namespace, per_client_key: bool,
               cohort: int | None = None) -> dict:
    system = "fedray vectorized" if cohort else "fedray"
    tag = f"fedray-N{n}-K{k}" + (f"-C{cohort}" if cohort else "")
    run_dir = os.path.join(args.out, "runs", tag)
    spec = {"overrides": fedray_overrides(n, k, args.rounds, args.seed, args.executors,
                                          per_client_key, args.reduce, args.cohort_size,
                                          vectorize=cohort is not None),
            "run_dir": run_dir, "cohort": cohort}
    result, meas = run_child("fedray", spec, os.path.join(args.out, "work"), tag,
                             args.fedray_timeout, args)
    if not args.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
    rounds = result.get("round_seconds") or []
    note = failure_note(meas, result, os.path.join(args.out, "logs", f"{tag}.log"),
                        len(rounds), args.rounds)
    return {"system": system, "population": n, "per_round": k, "overrides": spec["overrides"],
            "data_mode": "synthetic_per_client" if per_client_key else "pooled synthetic_samples",
            "setup_seconds": result.get("setup_seconds"),
            "round_seconds_median": median(rounds) if len(rounds) == args.rounds else None,
            **{f"result_{key}": v for key, v in result.items()}, **meas,
            "ok": note is None, "note": note}


def run_bound(k: int, samples: int, args: argparse.Namespace, cohort: int | None = None
              ) -> dict:
    kind = "vbound" if cohort else "bound"
    tag = f"{kind}-K{k}-S{samples}" + (f"-C{cohort}" if cohort else "")
    spec = {"per_round": k, "samples": samples, "rounds": args.rounds, "seed": args.seed,
            "threads": args.bound_threads, "cohort": cohort}
    result, meas = run_child(kind, spec, os.path.join(args.out, "work"), tag,
                             args.fedray_timeout, args)
    note = failure_note(meas, result, os.path.join(args.out, "logs", f"{tag}.log"),
                        len(result.get("round_seconds") or []), args.rounds)
    return {"system": "vectorized bound" if cohort else "bound", "per_round": k,
            "samples": samples, "cohort": cohort,
            "setup_seconds": result.get("setup_seconds"),
            "round_seconds_median": median(result.get("round_seconds")),
            **{f"result_{key}": v for key, v in result.items()}, **meas,
            "ok": note is None, "note": note}


def flower_cpus_per_client(executors: int) -> float:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1.0, (cpus or 1) / executors)


def run_peer(cmd: list[str], tag: str, args: argparse.Namespace) -> tuple[dict, dict]:
    """A peer's script under :func:`run_measured` (``--timeout``, the memory guard), its
    stderr in ``logs/TAG.log``: (the measurement, its last JSON line on stdout or {})."""
    stdout_path = os.path.join(args.out, "work", f"{tag}.stdout")
    os.makedirs(os.path.dirname(stdout_path), exist_ok=True)
    meas = run_measured(cmd, os.path.join(args.out, "logs", f"{tag}.log"), args.timeout,
                        args.min_free_gb, args.max_rss_gb, stdout_path=stdout_path)
    with open(stdout_path, errors="replace") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
    try:
        return meas, json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return meas, {}


def run_flower(n: int, k: int, samples: int, args: argparse.Namespace) -> dict:
    tag = f"flower-N{n}-K{k}"
    logs = os.path.join(args.out, "logs")
    cpus = flower_cpus_per_client(args.executors)
    cmd = [FLOWER_PY, FLOWER_SIM, "--clients", str(n), "--per-round", str(k),
           "--features", str(FEATURES), "--hidden", str(HIDDEN), "--classes", str(CLASSES),
           "--samples", str(samples), "--rounds", str(args.rounds), "--seed", str(args.seed),
           "--num-cpus-per-client", f"{cpus:g}", "--ray-local"]
    meas, result = run_peer(cmd, tag, args)
    progress = []
    with open(os.path.join(logs, f"{tag}.log"), errors="replace") as f:
        for ln in f:
            if ln.startswith("FLOWER_ROUND "):
                progress.append(json.loads(ln[len("FLOWER_ROUND "):]))
    rounds = result.get("round_seconds") or [p["seconds"] for p in progress]
    note = failure_note(meas, result, os.path.join(logs, f"{tag}.log"), len(rounds),
                        args.rounds)
    if note is None and not result:
        note = "failed: no result line on stdout"
    if note is not None and progress:
        note += "; rounds finished: " + ", ".join(f"{p['seconds']:.1f} s" for p in progress)
    return {"system": "flower", "population": n, "per_round": k, "samples": samples,
            "command": cmd, "setup_seconds": result.get("setup_seconds"),
            "round_seconds_median": median(rounds) if note is None else None,
            "rounds_finished": progress, "num_cpus_per_client": cpus,
            **{f"result_{key}": v for key, v in result.items()}, **meas,
            "ok": note is None, "note": note}


def pfl_label(workers: int) -> str:
    return "pfl-research" + (f" ×{workers}" if workers > 1 else "")


def run_pfl(n: int, k: int, samples: int, args: argparse.Namespace, workers: int) -> dict:
    """pfl-research on the same K of N clients: one process with one torch thread (as the
    bound), or ``workers`` torchrun workers of one thread each; data drawn per user from
    (seed, user id) when pfl samples it (``pfl_sim.py``'s scale mode)."""
    system = pfl_label(workers)
    tag = f"pfl{workers}-N{n}-K{k}"
    logs = os.path.join(args.out, "logs")
    cmd = [PFL_PY, PFL_SIM, "--clients", str(n), "--per-round", str(k),
           "--features", str(FEATURES), "--hidden", str(HIDDEN), "--classes", str(CLASSES),
           "--samples", str(samples), "--rounds", str(args.rounds), "--seed", str(args.seed),
           "--workers", str(workers), "--threads", "1"]
    meas, result = run_peer(cmd, tag, args)
    rounds = result.get("round_seconds") or []
    note = failure_note(meas, result, os.path.join(logs, f"{tag}.log"), len(rounds),
                        args.rounds)
    if note is None and not result:
        note = "failed: no result line on stdout"
    # pfl builds its model and samplers before round 1 and reports no setup mark of its
    # own: setup = the process's wall time to the end of training, less its rounds.
    setup = (result["e2e_seconds"] - sum(rounds)) if rounds else None
    return {"system": system, "population": n, "per_round": k, "samples": samples,
            "command": cmd, "setup_seconds": setup,
            "round_seconds_median": median(rounds) if note is None else None,
            **{f"result_{key}": v for key, v in result.items()}, **meas,
            "ok": note is None, "note": note}


def _f(v: float | None, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def _ratio(r: dict, b: dict | None) -> float | None:
    if b and b.get("round_seconds_median") and r.get("round_seconds_median") is not None:
        return r["round_seconds_median"] / b["round_seconds_median"]
    return None


def markdown(rows: list[dict], bounds: dict) -> str:
    lines = ["| total clients | per round | system | setup s | s/round | ratio to bound | "
             "ratio to vectorized bound | peak summed RSS GB | note |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = _ratio(r, bounds.get(r.get("bound_key") or ""))
        vratio = _ratio(r, bounds.get(r.get("vbound_key") or ""))
        if r.get("skipped"):
            note, rss_text = r["note"], "–"
        else:
            note = r["note"] or _rounds_note(r)
            rss_text = _f(r.get("peak_rss_gb"), "{:.2f}" if r["ok"] else "≥ {:.2f}")
        lines.append(
            f"| {r['population']:,} | {r['per_round']:,} | {r['system']} | "
            f"{_f(r.get('setup_seconds'), '{:.1f}')} | "
            f"{_f(r.get('round_seconds_median'), '{:.3f}')} | {_f(ratio, '{:.2f}×')} | "
            f"{_f(vratio, '{:.2f}×')} | {rss_text} | {note} |")
    lines += ["", "Single-process bounds (plain PyTorch, one process: clients one after "
                  "another, or vectorized in cohorts of the given size):", "",
              "| bound | per round | train samples/client | threads | setup s | s/round | "
              "peak RSS GB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for b in bounds.values():
        kind = f"vectorized (cohorts of {b['cohort']:,})" if b.get("cohort") else "sequential"
        lines.append(f"| {kind} | {b['per_round']:,} | {b['samples']} | "
                     f"{b.get('result_threads', '–')} "
                     f"| {_f(b.get('setup_seconds'), '{:.2f}')} | "
                     f"{_f(b.get('round_seconds_median'), '{:.4f}')} | "
                     f"{_f(b.get('peak_rss_gb'), '{:.2f}')} |")
    return "\n".join(lines)


def _rounds_note(r: dict) -> str:
    times = r.get("result_round_seconds") or []
    text = "rounds " + " / ".join(f"{t:.2f}" for t in times) + " s"
    if r["system"].startswith("fedray"):
        text += (f"; data {r.get('result_data_seconds', 0):.1f} s + Ray/executors "
                 f"{r.get('result_start_seconds', 0):.1f} s; "
                 f"{r.get('result_train_samples_mean', 0):g} train samples/client")
        if r.get("data_mode") != "synthetic_per_client":
            text += "; pooled data (fallback)"
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring for what is measured.")
    p.add_argument("--populations", type=int, nargs="+",
                   default=[10_000, 100_000, 1_000_000, 10_000_000])
    p.add_argument("--per-round", type=int, nargs="+", default=[100, 1_000, 10_000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--executors", type=int, default=2,
                   help="fedray executors (Flower gets CPUs/executors CPUs per client actor)")
    p.add_argument("--reduce", choices=["driver", "executors"], default="driver",
                   help="fedray's runtime.reduce: where the uploads are summed")
    p.add_argument("--vectorize", action="store_true",
                   help="also run fedray with runtime.vectorize=on and the vectorized "
                        "single-process bound, side by side")
    p.add_argument("--cohort-size", type=int, default=None,
                   help="runtime.cohort_size of the vectorized rows (and the vectorized "
                        "bound's cohorts); default: unset, fedray's own rule "
                        "(max(256, ceil(K / 16)) here), which the bound then uses too")
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--no-pfl", action="store_true",
                   help="skip pfl-research (run when .venv-pfl exists: "
                        "bash benchmarks/setup_pfl_venv.sh)")
    p.add_argument("--flower-max-population", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="wall-clock cap per Flower configuration, seconds")
    p.add_argument("--fedray-timeout", type=float, default=7200.0,
                   help="wall-clock cap per fedray (and bound) configuration, seconds")
    p.add_argument("--bound-threads", type=int, default=1)
    p.add_argument("--min-free-gb", type=float, default=1.0,
                   help="stop a configuration when the machine has less memory available")
    p.add_argument("--max-rss-gb", type=float, default=None,
                   help="stop a configuration whose summed RSS exceeds this (default: off)")
    p.add_argument("--keep-runs", action="store_true", help="keep fedray's run directories")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "scale"))
    p.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is None:
        if args.rounds < 1 or args.executors < 1 or min(args.populations + args.per_round) < 1:
            p.error("--rounds, --executors, --populations and --per-round must be >= 1")
    return args


def machine() -> dict:
    import platform

    import psutil

    info = {"cpus": os.cpu_count(), "memory_gb": psutil.virtual_memory().total / GB,
            "python": platform.python_version(), "platform": platform.platform()}
    from provenance import git

    try:
        info["git_commit"] = git("rev-parse", "HEAD")
        info["git_dirty"] = bool(git("status", "--porcelain"))  # untracked files count here
    except OSError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        kind, spec_path = args.child
        with open(spec_path) as f:
            spec = json.load(f)
        {"fedray": child_fedray, "bound": child_bound, "vbound": child_vbound}[kind](spec)
        return 0

    from fedray.core.config import load_config

    args.out = os.path.abspath(args.out)
    os.makedirs(os.path.join(args.out, "work"), exist_ok=True)
    per_client_key = has_per_client_key()
    flower = not args.no_flower and os.path.exists(FLOWER_PY)
    pfl = not args.no_pfl and os.path.exists(PFL_PY)
    doc = {"meta": {"command": [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]],
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(),
                    "args": {k: v for k, v in vars(args).items() if k != "child"},
                    "data_mode": ("synthetic_per_client" if per_client_key
                                  else "pooled synthetic_samples (fallback)"),
                    "flower": flower or ("disabled" if args.no_flower else
                                         f"missing {FLOWER_PY}"),
                    "pfl": pfl or ("disabled" if args.no_pfl else f"missing {PFL_PY}")},
           "bounds": {}, "rows": []}
    rows, bounds = doc["rows"], doc["bounds"]
    json_path, md_path = (os.path.join(args.out, "scale.json"),
                          os.path.join(args.out, "scale.md"))
    gave_up: dict[tuple, str] = {}  # (system, [workers,] K) -> why larger N is not tried

    def save() -> None:
        _write_json(json_path, doc)
        with open(md_path, "w") as f:
            f.write(markdown(rows, bounds) + "\n")

    def skip(system: str, n: int, k: int, note: str) -> None:
        rows.append({"system": system, "population": n, "per_round": k, "skipped": True,
                     "ok": False, "note": note})

    def peer_row(row: dict, bkey: str, fed: dict | None) -> dict:
        """A peer's row in the table, its ratios against this (K, S)'s bounds."""
        row["bound_key"] = bkey
        if fed is not None and "vbound_key" in fed:
            row["vbound_key"] = fed["vbound_key"]
        rows.append(row)
        say(row)
        return row

    def say(row: dict) -> None:
        med = row.get("round_seconds_median")
        print(f"scale: {row['system']} N={row.get('population', '-')} K={row['per_round']}: "
              f"setup {_f(row.get('setup_seconds'), '{:.1f}')} s, s/round "
              f"{_f(med, '{:.3f}')}, peak {_f(row.get('peak_rss_gb'), '{:.2f}')} GB"
              + (f" — {row['note']}" if row.get("note") else ""), file=sys.stderr, flush=True)

    for n in sorted(set(args.populations)):
        for k in sorted(set(args.per_round)):
            if k > n:
                continue
            if not per_client_key and n > FALLBACK_MAX_POPULATION:
                skip("fedray", n, k, f"not run: this fedray has no data.synthetic_per_client "
                                     f"and the pooled fallback stops at "
                                     f"{FALLBACK_MAX_POPULATION:,}")
                fed = None
            elif ("fedray", k) in gave_up:
                skip("fedray", n, k, gave_up[("fedray", k)])
                fed = None
            else:
                load_config(None, fedray_overrides(n, k, args.rounds, args.seed,
                                                   args.executors, per_client_key,
                                                   args.reduce))
                fed = run_fedray(n, k, args, per_client_key)
                rows.append(fed)
                say(fed)
                if fed["timed_out"] or fed["memory_guard"]:
                    why = "timeout" if fed["timed_out"] else "memory guard"
                    gave_up[("fedray", k)] = f"not run: fedray was stopped at N={n:,} ({why})"
            samples = default_train_samples()
            if fed and fed.get("result_train_samples_mean"):
                samples = max(1, round(fed["result_train_samples_mean"]))
            bkey = f"K{k}-S{samples}"
            if bkey not in bounds:
                bounds[bkey] = run_bound(k, samples, args)
                say({**bounds[bkey], "population": "-"})
            if fed:
                fed["bound_key"] = bkey
            if args.vectorize and fed is not None:
                size = fedray_cohort(n, k, args, per_client_key)
                vkey = f"K{k}-S{samples}-C{size}"
                vec = run_fedray(n, k, args, per_client_key, size)
                rows.append(vec)
                say(vec)
                if vkey not in bounds:
                    bounds[vkey] = run_bound(k, samples, args, size)
                    say({**bounds[vkey], "population": "-"})
                fed["vbound_key"] = vec["vbound_key"] = vkey
                vec["bound_key"] = bkey
            if flower:
                if n > args.flower_max_population:
                    skip("flower", n, k, f"not run: N > --flower-max-population "
                                         f"({args.flower_max_population:,})")
                elif ("flower", k) in gave_up:
                    skip("flower", n, k, gave_up[("flower", k)])
                else:
                    fl = peer_row(run_flower(n, k, samples, args), bkey, fed)
                    if not fl["ok"]:
                        why = fl["note"].split(";")[0].split(" (")[0]
                        gave_up[("flower", k)] = (f"not run: Flower did not finish at "
                                                  f"N={n:,} ({why})")
            for workers in sorted({1, args.executors}) if pfl else ():
                key = ("pfl", workers, k)
                if key in gave_up:
                    skip(pfl_label(workers), n, k, gave_up[key])
                elif k % workers:
                    skip(pfl_label(workers), n, k,
                         f"not run: K is not a multiple of {workers} workers")
                else:
                    row = peer_row(run_pfl(n, k, samples, args, workers), bkey, fed)
                    if not row["ok"]:
                        gave_up[key] = (f"not run: pfl-research did not finish at N={n:,} "
                                        f"({row['note'].split(';')[0]})")
            save()
    doc["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    print(markdown(rows, bounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
