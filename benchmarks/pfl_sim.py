"""pfl-research (Apple's ``pfl``) baseline on the same workload as fedray's benchmark.

The workload of ``benchmarks/flower_sim.py``'s default mode, written the way pfl's own
examples and benchmarks are:

* model: MLP 784-256-10 (Linear(784, 256), ReLU, Linear(256, 10)), 203,530 parameters,
  wrapped in pfl's ``PyTorchModel`` (the module carries the ``loss``/``metrics`` methods pfl
  asks for), local optimizer ``torch.optim.SGD``, central optimizer ``torch.optim.SGD`` with
  lr 1.0 (pfl applies the averaged model difference as a negative gradient, so lr 1.0 makes
  the central step plain FedAvg);
* data: ``FederatedDataset.from_slices`` over per-client arrays (user id -> [x, y]), each
  client 256 seeded synthetic samples (float32, 784 features, 10 classes), drawn exactly as
  ``flower_sim.client_data`` draws them (``np.random.default_rng([seed, client id])``);
  ``MinimizeReuseUserSampler`` over the N user ids with cohort size N, so every client
  trains exactly once per round;
* algorithm: ``FederatedAveraging`` with ``NNAlgorithmParams(central_num_iterations=R,
  train_cohort_size=N, val_cohort_size=None)`` and ``NNTrainHyperParams(local_num_epochs=1,
  local_batch_size=32, local_learning_rate=0.05)``, on a ``SimulatedBackend`` with
  ``WeightByDatapoints`` (the weighting Flower's FedAvg uses: by number of examples);
  cross-entropy loss;
* no evaluation: pfl evaluates each user before and after local training whenever
  ``iteration % evaluation_frequency == 0``, which always includes iteration 0, so the
  algorithm here is ``FederatedAveraging`` with ``do_evaluation`` switched off in the central
  contexts it hands out (nothing else changed);
* on the CPU (``PFL_PYTORCH_DEVICE=cpu`` unless set; pfl would otherwise pick CUDA/MPS).

Differences that remain: pfl's ``Dataset`` iterates a user's data in stored order (Flower's
client reshuffles each round; the data are i.i.d. noise either way), and pfl prints its
metrics after every round (to stderr here).

FEMNIST-shaped mode (``--leaf-root DIR``, used by ``benchmarks/sim_overhead.py --workload
femnist``): LEAF's FEMNIST CNN, batch 10, lr 0.05, user i the i-th writer (sorted id order)
of the LEAF-format directory ``benchmarks/femnist_workload.py`` writes, each user's rows as
LEAF stores them.

pfl-research's CIFAR-10 benchmark (``--cifar-npz FILE``, used by ``benchmarks/gpu_check.py``'s
``pfl_cifar10``): pfl's ``simple_cnn`` (fedray's ``pfl_cnn``) on the images of an ``.npz``
(``x`` float32 (N, 3, 32, 32), ``y`` int64), user u the rows [50u, 50u + 50), ``--population``
users of which ``--clients`` a round, batch 10, lr 0.1, central SGD at lr 1.0 — the setup
of pfl-research's ``image_classification/configs/baseline.yaml``.

Scale mode (``--per-round K``, used by ``benchmarks/scale.py``): the population benchmark's
workload as ``flower_sim.py``'s scale mode has it. ``--clients N`` users, K of them a round,
MLP ``--features``-``--hidden``-``--classes`` (32-32-10 there), each user's ``--samples``
rows drawn on demand from (seed, user id) by pfl's ``make_dataset_fn`` (nothing per user is
held), batch 32, lr 0.05; ``MinimizeReuseUserSampler`` over the N ids, so every round trains
K distinct users (the next K in id order, as the bound does). K must be a multiple of W.

Modes:

* single process (default): pfl's simulator runs the clients one after another in this
  process, torch with its default thread count (``--threads`` to change it);
* ``--workers W`` (W >= 2): pfl's multi-worker simulation. This process (which imports
  neither torch nor pfl) launches ``torchrun --standalone --nproc_per_node W`` on this same
  file; each worker trains its share of the cohort (pfl splits it round-robin, so the cohort,
  N or in scale mode K, must be a multiple of W) and pfl all-reduces the summed updates over
  gloo. torchrun sets ``OMP_NUM_THREADS=1`` in each worker unless it is set.

Create the virtualenv with ``bash benchmarks/setup_pfl_venv.sh`` and run::

    .venv-pfl/bin/python benchmarks/pfl_sim.py --clients 10 --rounds 5 [--seed 0] [--workers 2]

Exactly one JSON line goes to stdout at the end::

    {"clients": N, "rounds": R, "round_seconds": [...], "e2e_seconds": ...,
     "pfl_version": ..., "torch_version": ..., "workers": W, ...}

``round_seconds`` are the differences between consecutive timestamps taken by a pfl
``TrainingProcessCallback``: round 1 from ``on_train_begin`` (just before the first central
iteration) to the first ``after_central_iteration``, each later round between consecutive
``after_central_iteration`` calls (rank 0's clock with W workers; the all-reduce at the end
of each round keeps the ranks in step). ``e2e_seconds`` is the wall time from the start of
the process that was invoked (read from ``/proc/self/stat``, so interpreter start-up counts;
with ``--workers`` it is the launching process, so torchrun, the workers' imports and
process-group set-up count) to the return of ``FederatedAveraging.run`` (with W workers, on
rank 0). Also reported: ``import_seconds`` (process start to torch and pfl imported),
``threads`` (torch's intra-op threads in the (rank-0) worker) and, with ``--workers``,
``exit_seconds`` (process start to torchrun's exit). Everything else (pfl's per-round
metrics, torchrun's logs) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_T_MODULE_WALL = time.time()

IN_FEATURES = 784
HIDDEN = 256
NUM_CLASSES = 10
SAMPLES_PER_CLIENT = 256
BATCH_SIZE = 32
LOCAL_EPOCHS = 1
LR = 0.05
CENTRAL_LR = 1.0
EXPECTED_PARAMS = 203_530
_T0_ENV = "PFL_SIM_T0_WALL"  # the launcher's process start, handed to the workers


def process_start_wall() -> float:
    """Wall-clock time at which this process started (Linux ``/proc``); falls back to the
    moment this module began executing."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        start = time.time() - age
        if 0.0 <= _T_MODULE_WALL - start < 120.0:
            return start
    except (OSError, ValueError, IndexError):
        pass
    return _T_MODULE_WALL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, required=True, help="number of clients N")
    p.add_argument("--rounds", type=int, default=5, help="number of FedAvg rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1,
                   help="1: single process; W >= 2: torchrun --nproc_per_node W")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads per process (default: torch's own)")
    p.add_argument("--leaf-root", default=None,
                   help="the FEMNIST-shaped workload: LEAF's CNN on the LEAF directory "
                        "benchmarks/femnist_workload.py writes (user i = i-th writer)")
    p.add_argument("--cifar-npz", default=None,
                   help="pfl-research's CIFAR-10 setup on these images (x, y; 50 a user)")
    p.add_argument("--population", type=int, default=None,
                   help="users to sample the cohort from (default: --clients)")
    scale = p.add_argument_group("scale mode (opt-in; see the module docstring)")
    scale.add_argument("--per-round", type=int, default=None,
                       help="users trained a round, of the --clients users")
    scale.add_argument("--features", type=int, default=32)
    scale.add_argument("--hidden", type=int, default=32)
    scale.add_argument("--classes", type=int, default=10)
    scale.add_argument("--samples", type=int, default=16, help="rows per user")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- launcher

def launch(args: argparse.Namespace, t0_wall: float) -> int:
    """Run this file under torchrun with ``args.workers`` processes; print rank 0's line."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun] if os.path.exists(torchrun) else [sys.executable, "-m",
                                                        "torch.distributed.run"]
    cmd += ["--standalone", "--nproc_per_node", str(args.workers), os.path.abspath(__file__),
            "--worker", "--clients", str(args.clients), "--rounds", str(args.rounds),
            "--seed", str(args.seed), "--workers", str(args.workers)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.leaf_root:
        cmd += ["--leaf-root", args.leaf_root]
    if args.cifar_npz:
        cmd += ["--cifar-npz", args.cifar_npz]
    if args.population:
        cmd += ["--population", str(args.population)]
    if args.per_round is not None:
        cmd += ["--per-round", str(args.per_round), "--features", str(args.features),
                "--hidden", str(args.hidden), "--classes", str(args.classes),
                "--samples", str(args.samples)]
    env = {**os.environ, _T0_ENV: repr(t0_wall)}
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    exit_s = time.time() - t0_wall
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.stdout.strip() and len(lines) != 1:
        print(out.stdout, file=sys.stderr)
    if out.returncode != 0 or len(lines) != 1:
        print(f"[pfl_sim] torchrun exited {out.returncode} with {len(lines)} result "
              "lines", file=sys.stderr)
        return out.returncode or 1
    result = json.loads(lines[0])
    result["exit_seconds"] = round(exit_s, 6)
    print(json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- worker

def client_data(np, seed: int, client_id: int):
    """Deterministic synthetic data of one client, as ``flower_sim.client_data``."""
    gen = np.random.default_rng([seed, client_id])
    x = gen.standard_normal((SAMPLES_PER_CLIENT, IN_FEATURES), dtype=np.float32)
    y = gen.integers(0, NUM_CLASSES, size=SAMPLES_PER_CLIENT, dtype=np.int64)
    return x, y


def simulate(args: argparse.Namespace, t0_wall: float) -> dict:
    """Build the pfl objects and run FedAvg; returns the result (meaningful on rank 0)."""
    os.environ.setdefault("PFL_PYTORCH_DEVICE", "cpu")
    import dataclasses

    import numpy as np
    import pfl
    import torch
    from pfl.aggregate.base import get_num_devices_weight_name
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.common_types import Population
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import MinimizeReuseUserSampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
    from torch import nn

    t_imported = time.time()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dist = get_default_framework_module().distributed
    if dist.world_size != args.workers:
        raise SystemExit(f"pfl sees world size {dist.world_size}, expected {args.workers}")

    class Net(nn.Module):
        """The workload's network (MLP 784-256-10, or LEAF's FEMNIST CNN) with the ``loss``
        and ``metrics`` methods PyTorchModel needs."""

        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net
            self.loss_fn = nn.CrossEntropyLoss()

        def forward(self, x):
            return self.net(x)

        def loss(self, x, y, eval=False):  # pfl passes ``eval`` by keyword
            self.eval() if eval else self.train()
            return self.loss_fn(self(x), y.long())  # pfl hands numpy labels over as float32

        @torch.no_grad()
        def metrics(self, x, y, eval=True):
            self.eval() if eval else self.train()
            loss = self.loss_fn(self(x), y.long()).item() * len(y)
            return {"loss": Weighted(loss, len(y))}

    class FedAvgNoEval(FederatedAveraging):
        """pfl's FederatedAveraging without the local evaluation of iteration 0."""

        def get_next_central_contexts(self, *a, **kw):
            contexts, model, metrics = super().get_next_central_contexts(*a, **kw)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(c, do_evaluation=False)
                                 for c in contexts)
            return contexts, model, metrics

    class RoundTimer(TrainingProcessCallback):
        """End-of-round timestamps, and a check that the whole cohort trained."""

        def __init__(self, expected_devices: int) -> None:
            self.expected = expected_devices
            self.stamps: list[float] = []

        def on_train_begin(self, *, model):
            self.stamps = [time.perf_counter()]
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.stamps.append(time.perf_counter())
            devices = aggregate_metrics[get_num_devices_weight_name(Population.TRAIN)]
            devices = getattr(devices, "overall_value", devices)
            if int(round(float(devices))) != self.expected:
                raise RuntimeError(f"round {central_iteration + 1}: {devices} clients "
                                   f"trained, expected {self.expected}")
            return False, Metrics()

    # Same global seed on every worker: pfl's samplers and the initial model must agree.
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    population = args.population or args.clients
    cohort = args.clients if args.per_round is None else args.per_round
    user_ids = range(population)  # itertools.cycle keeps only the ids drawn so far
    if args.per_round is not None:  # scale mode: each user's rows drawn when it is sampled
        f, s, c = args.features, args.samples, args.classes

        def make_user(uid):
            gen = np.random.default_rng([args.seed, uid])
            x = gen.standard_normal((s, f), dtype=np.float32)
            return Dataset([x, gen.integers(0, c, size=s, dtype=np.int64)], user_id=uid)

        train_data = FederatedDataset(make_user, MinimizeReuseUserSampler(user_ids))
        net = nn.Sequential(nn.Linear(f, args.hidden), nn.ReLU(),
                            nn.Linear(args.hidden, c))
        expected = f * args.hidden + args.hidden + args.hidden * c + c
        lr, batch = LR, BATCH_SIZE
    elif args.cifar_npz:  # pfl-research's CIFAR-10 benchmark: 50 images a user, simple_cnn
        with np.load(args.cifar_npz, allow_pickle=False) as z:
            x, y = z["x"].astype(np.float32), z["y"].astype(np.int64)
        if len(x) < 50 * population or x.shape[1:] != (3, 32, 32):
            raise SystemExit(f"{args.cifar_npz}: {len(x)} images of {x.shape[1:]}, need "
                             f"{50 * population} of (3, 32, 32)")
        user_data = {u: [x[50 * u:50 * u + 50], y[50 * u:50 * u + 50]]
                     for u in range(population)}
        net = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
                            nn.Linear(64 * 14 * 14, 128), nn.ReLU(), nn.Dropout(0.5),
                            nn.Linear(128, 10))
        expected, lr, batch = 1_626_442, 0.1, 10
    elif args.leaf_root:  # the FEMNIST-shaped workload: LEAF's files, LEAF's CNN
        import femnist_workload as fw

        rows = fw.read_train(args.leaf_root)[:args.clients]
        user_data = {c: list(xy) for c, xy in enumerate(rows)}
        net, expected, lr, batch = fw.leaf_cnn(), fw.EXPECTED_PARAMS, fw.LR, fw.BATCH_SIZE
    else:
        user_data = {c: list(client_data(np, args.seed, c)) for c in range(args.clients)}
        net = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(),
                            nn.Linear(HIDDEN, NUM_CLASSES))
        expected, lr, batch = EXPECTED_PARAMS, LR, BATCH_SIZE
    if args.per_round is None:
        train_data = FederatedDataset.from_slices(user_data,
                                                  MinimizeReuseUserSampler(user_ids))
    backend = SimulatedBackend(training_data=train_data, val_data=train_data,
                               postprocessors=[WeightByDatapoints()])

    module = Net(net)
    n_params = sum(p.numel() for p in module.parameters())
    assert n_params == expected, n_params
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(),
                                                           lr=CENTRAL_LR))
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=args.rounds, evaluation_frequency=args.rounds + 1,
        train_cohort_size=cohort, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_num_epochs=LOCAL_EPOCHS,
                                      local_learning_rate=lr,
                                      local_batch_size=batch)
    timer = RoundTimer(cohort)
    FedAvgNoEval().run(algorithm_params=algorithm_params, backend=backend, model=model,
                       model_train_params=train_params, callbacks=[timer])
    t_end = time.time()

    rounds = [b - a for a, b in zip(timer.stamps, timer.stamps[1:], strict=False)]
    if len(rounds) != args.rounds:
        raise SystemExit(f"expected {args.rounds} timed rounds, got {len(rounds)}")
    return {
        "clients": args.clients,
        "rounds": args.rounds,
        "round_seconds": [round(s, 6) for s in rounds],
        "e2e_seconds": round(t_end - t0_wall, 6),
        "workload": ("cifar10" if args.cifar_npz else "femnist" if args.leaf_root
                     else "scale" if args.per_round is not None else "mlp"),
        "per_round": cohort,
        "population": population,
        "parameters": n_params,
        "pfl_version": pfl.__version__,
        "torch_version": torch.__version__,
        "workers": dist.world_size,
        "import_seconds": round(t_imported - t0_wall, 6),
        "threads": torch.get_num_threads(),
        "rank0_clients_per_round": -(-cohort // dist.world_size),
        "_rank": dist.global_rank,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clients < 1 or args.rounds < 1 or args.workers < 1:
        raise SystemExit("--clients, --rounds and --workers must be >= 1")
    if args.population is not None and (args.population < args.clients or (
            not args.cifar_npz and args.population != args.clients)):
        raise SystemExit("--population must be >= --clients (and only differs from it with "
                         "--cifar-npz)")
    if args.per_round is not None and not (1 <= args.per_round <= args.clients and min(
            args.features, args.hidden, args.classes, args.samples) >= 1):
        raise SystemExit("--per-round must be in 1..--clients, the shape >= 1")
    if args.per_round is not None and (args.leaf_root or args.cifar_npz):
        raise SystemExit("--per-round (scale mode) takes neither --leaf-root nor --cifar-npz")
    cohort = args.clients if args.per_round is None else args.per_round
    if cohort % args.workers:
        raise SystemExit("the cohort (--per-round, else --clients) must be a multiple of "
                         "--workers (pfl deals it out round-robin; otherwise the ranks' user "
                         "samplers drift apart)")
    t0_wall = float(os.environ[_T0_ENV]) if args.worker else process_start_wall()
    if args.workers > 1 and not args.worker:
        return launch(args, t0_wall)

    # Keep stdout for the one JSON line: point fd 1 at stderr for the whole run (pfl prints
    # its metrics to stdout), and write the result to a saved copy of the original stdout.
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)
    result = simulate(args, t0_wall)
    sys.stdout.flush()
    if result.pop("_rank") == 0:
        os.write(result_fd, (json.dumps(result) + "\n").encode())
    os.close(result_fd)
    if args.worker:  # torchrun's workers now and then abort in their interpreter's teardown
        sys.stderr.flush()  # ("terminate called without an active exception", gloo's
        os._exit(0)  # threads), after training and the result: end them here instead
    return 0


if __name__ == "__main__":
    sys.exit(main())
