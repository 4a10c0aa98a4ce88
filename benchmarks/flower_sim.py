"""Flower simulation-engine baseline on the same workload as fedray's benchmark.

Runs FedAvg with ``flwr.simulation.run_simulation`` (a Message-API ``ClientApp`` and a
``ServerApp`` driving ``flwr.serverapp.strategy.FedAvg``, the idiomatic API of Flower
1.2x-1.4x) on:

* model: MLP 784-256-10 (Linear(784, 256), ReLU, Linear(256, 10)), 203,530 parameters;
* each client: 256 seeded synthetic samples (float32, 784 features, 10 classes),
  batch 32, 1 local epoch (8 steps), SGD lr 0.05, cross-entropy;
* every client sampled every round, no federated or centralized evaluation;
* one CPU per client actor (``client_resources={"num_cpus": 1, "num_gpus": 0}``),
  ``torch.set_num_threads(1)`` in the client.

It needs its own virtualenv (flwr[simulation] pins its own ray); create it with
``bash benchmarks/setup_flower_venv.sh`` and run::

    .venv-flower/bin/python benchmarks/flower_sim.py --clients 10 --rounds 5 [--seed 0]

Exactly one JSON line goes to stdout at the end::

    {"clients": N, "rounds": R, "round_seconds": [...], "e2e_seconds": ...,
     "flwr_version": ..., "torch_version": ...}

``round_seconds`` are the differences between consecutive timestamps taken at the end
of the strategy's ``aggregate_train`` (Flower's Message-API name for ``aggregate_fit``);
round 1 is measured from the start of the first ``configure_train`` (``configure_fit``).
``e2e_seconds`` is the wall time of the ``run_simulation`` call, Ray start included.
Everything else (Flower and Ray logs, anything a library prints) goes to stderr.

Scale mode (opt-in, used by ``benchmarks/scale.py``): ``--per-round K`` samples K of the N
clients each round (FedAvg ``fraction_train=K/N``, ``min_train_nodes=K``), and
``--features F --hidden H --classes C --samples S`` change the MLP to F-H-C and each client's
data to S samples drawn on demand from (seed, client id) inside the client (nothing per
client is held anywhere), e.g. the population benchmark's MLP 32-32-10 on 20 samples::

    .venv-flower/bin/python benchmarks/flower_sim.py --clients 100000 --per-round 1000 \\
        --features 32 --hidden 32 --samples 20 --rounds 3 --ray-local

FEMNIST-shaped mode (opt-in, used by ``benchmarks/sim_overhead.py --workload femnist``):
``--leaf-root DIR`` trains LEAF's FEMNIST CNN (batch 10, lr 0.05) on the LEAF-format
directory ``benchmarks/femnist_workload.py`` writes, client i on the i-th writer in sorted
id order (the files read once per client actor), all N clients every round.

``--ray-local`` starts a fresh local Ray (``address="local"``) instead of letting
``ray.init`` join one it finds via ``/tmp/ray/ray_current_cluster``. In scale mode the JSON
line also carries ``per_round``, the shape, ``parameters``, ``setup_seconds`` (start of
``run_simulation`` to the moment the first client began training, by the wall clock its
actor reports: Flower starts Ray and its client actors while round 1 is already under way),
``first_configure_seconds`` (to the first ``configure_train``), ``import_seconds`` and
``replies_per_round``; and a line ``FLOWER_ROUND {"round": r, "seconds": s, "replies": k}``
goes to stderr as each round ends (so a caller that stops a run at a time limit still learns
how far it got). Without these flags everything is as described above.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

_T_MODULE = time.perf_counter()  # before flwr and torch are imported (scale mode reports it)

# No telemetry round trips (there is no network here, and they are not part of the
# workload); set before flwr is imported. Override from the environment if wanted.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
# Keep Ray quiet about things that do not matter for a timing run.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import flwr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

IN_FEATURES = 784
HIDDEN = 256
NUM_CLASSES = 10
SAMPLES_PER_CLIENT = 256
BATCH_SIZE = 32
LOCAL_EPOCHS = 1
LR = 0.05
EXPECTED_PARAMS = 203_530


def make_model(features: int = IN_FEATURES, hidden: int = HIDDEN,
               classes: int = NUM_CLASSES) -> nn.Module:
    """MLP features-hidden-classes (784-256-10 unless scale mode changes it)."""
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def client_data(seed: int, client_id: int, samples: int = SAMPLES_PER_CLIENT,
                features: int = IN_FEATURES, classes: int = NUM_CLASSES
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic synthetic data of one client, seeded by (seed, client id)."""
    gen = np.random.default_rng([seed, client_id])
    x = gen.standard_normal((samples, features), dtype=np.float32)
    y = gen.integers(0, classes, size=samples, dtype=np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


# --------------------------------------------------------------------------- client

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One local epoch of SGD on this client's synthetic data."""
    t_start_wall = time.time()  # scale mode reports it: when the first client began
    torch.set_num_threads(1)
    config = msg.content["config"]
    seed = int(config["seed"])
    client_id = int(context.node_config["partition-id"])
    # the shape keys are sent in scale mode only; the defaults are the anchor workload
    features = int(config.get("features", IN_FEATURES))
    hidden = int(config.get("hidden", HIDDEN))
    classes = int(config.get("classes", NUM_CLASSES))
    samples = int(config.get("samples", SAMPLES_PER_CLIENT))

    batch_size = BATCH_SIZE
    if "leaf_root" in config:  # the FEMNIST-shaped workload: LEAF's files, LEAF's CNN
        import femnist_workload as fw

        model = fw.leaf_cnn()
        x, y = map(torch.from_numpy, fw.client_train(str(config["leaf_root"]), client_id))
        samples, batch_size = len(y), fw.BATCH_SIZE
    else:
        model = make_model(features, hidden, classes)
        x, y = client_data(seed, client_id, samples, features, classes)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    # Deterministic shuffling per (seed, client, round).
    gen = torch.Generator().manual_seed(seed * 1_000_003 + client_id * 1_009
                                        + int(config["server-round"]))
    opt = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    total_loss = 0.0
    steps = 0
    for _ in range(LOCAL_EPOCHS):
        perm = torch.randperm(samples, generator=gen)
        for start in range(0, samples, batch_size):
            idx = perm[start:start + batch_size]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total_loss += float(loss.item())
            steps += 1

    metrics = {"train_loss": total_loss / max(steps, 1), "num-examples": samples}
    if "samples" in config:  # scale mode
        metrics["train-start-wall"] = t_start_wall
    content = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord(metrics),
    })
    return Message(content=content, reply_to=msg)


# --------------------------------------------------------------------------- server

class TimedFedAvg(FedAvg):
    """FedAvg that records wall-clock timestamps for per-round timing."""

    def __init__(self, *args, report_rounds: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.t_first_configure: float | None = None
        self.t_aggregate: list[float] = []
        self.replies_per_round: list[int] = []
        self.first_train_wall: float | None = None  # scale mode: earliest client start
        self.report_rounds = report_rounds  # scale mode: one FLOWER_ROUND line per round

    def configure_train(self, server_round, arrays, config, grid):
        if self.t_first_configure is None:
            self.t_first_configure = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        if self.report_rounds and self.first_train_wall is None:
            starts = [float(m.content["metrics"]["train-start-wall"]) for m in replies
                      if not m.has_error() and "train-start-wall" in m.content["metrics"]]
            self.first_train_wall = min(starts, default=None)
        result = super().aggregate_train(server_round, replies)
        if len(replies) != self.min_train_nodes or result[0] is None:
            raise RuntimeError(
                f"round {server_round}: {len(replies)} replies, expected "
                f"{self.min_train_nodes} (or aggregation failed)")
        self.t_aggregate.append(time.perf_counter())
        self.replies_per_round.append(len(replies))
        if self.report_rounds:
            seconds = self.round_seconds()[-1]
            print("FLOWER_ROUND " + json.dumps({"round": int(server_round),
                                                "seconds": round(seconds, 6),
                                                "replies": len(replies)}),
                  file=sys.stderr, flush=True)
        return result

    def round_seconds(self) -> list[float]:
        if self.t_first_configure is None:
            return []
        stamps = [self.t_first_configure, *self.t_aggregate]
        return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def make_server_app(strategy: TimedFedAvg, num_rounds: int, seed: int,
                    shape: dict[str, int] | None = None,
                    leaf_root: str | None = None) -> ServerApp:
    """``shape`` (scale mode): features, hidden, classes and samples, sent to the clients;
    ``leaf_root`` (the FEMNIST-shaped workload): the LEAF directory the clients read."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(seed)
        if leaf_root is not None:
            import femnist_workload as fw

            model, config = fw.leaf_cnn(), {"lr": fw.LR, "leaf_root": leaf_root}
        else:
            model = make_model(**{k: v for k, v in (shape or {}).items() if k != "samples"})
            config = {"lr": LR, **(shape or {})}
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=num_rounds,
            train_config=ConfigRecord({"seed": seed, **config}),
        )

    return server_app


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, required=True, help="number of clients N")
    p.add_argument("--rounds", type=int, default=5, help="number of FedAvg rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-cpus-per-client", type=float, default=1.0,
                   help="Ray CPUs per client actor (Flower's default is 1)")
    p.add_argument("--log-level", default="WARNING",
                   help="level of the 'flwr' logger (logs go to stderr)")
    p.add_argument("--leaf-root", default=None,
                   help="the FEMNIST-shaped workload: train LEAF's CNN on the LEAF directory "
                        "benchmarks/femnist_workload.py writes (client i = i-th writer)")
    scale = p.add_argument_group("scale mode (opt-in; see the module docstring)")
    scale.add_argument("--per-round", type=int, default=None,
                       help="clients sampled per round (default: all N)")
    scale.add_argument("--features", type=int, default=None,
                       help=f"input features (default {IN_FEATURES})")
    scale.add_argument("--hidden", type=int, default=None,
                       help=f"hidden width (default {HIDDEN})")
    scale.add_argument("--classes", type=int, default=None,
                       help=f"classes (default {NUM_CLASSES})")
    scale.add_argument("--samples", type=int, default=None,
                       help=f"training samples per client (default {SAMPLES_PER_CLIENT})")
    scale.add_argument("--ray-local", action="store_true",
                       help="start a fresh local Ray (address='local') instead of joining "
                            "one found via /tmp/ray/ray_current_cluster")
    return p.parse_args(argv)


def scale_mode(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.per_round, args.features, args.hidden,
                                       args.classes, args.samples))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clients < 1 or args.rounds < 1:
        raise SystemExit("--clients and --rounds must be >= 1")
    scaled = scale_mode(args)
    per_round = args.clients if args.per_round is None else args.per_round
    if not 1 <= per_round <= args.clients:
        raise SystemExit("--per-round must be in 1..--clients")
    shape = {"features": args.features or IN_FEATURES, "hidden": args.hidden or HIDDEN,
             "classes": args.classes or NUM_CLASSES,
             "samples": args.samples or SAMPLES_PER_CLIENT}
    if min(shape.values()) < 1 or shape["classes"] < 2:
        raise SystemExit("--features, --hidden, --samples must be >= 1 and --classes >= 2")

    # Keep stdout for the one JSON line: point fd 1 at stderr for the whole run (this
    # also catches prints from Ray and its workers), and write the result to a saved
    # copy of the original stdout.
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)

    logging.getLogger("flwr").setLevel(args.log_level.upper())
    torch.set_num_threads(1)
    leaf_root = os.path.abspath(args.leaf_root) if args.leaf_root else None
    if leaf_root is not None:
        if scaled:
            raise SystemExit("--leaf-root is its own workload: no scale-mode flags with it")
        # the client actors import femnist_workload (this folder) when they train
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")])
        import femnist_workload as fw

        n_params, expected = sum(p.numel() for p in fw.leaf_cnn().parameters()), \
            fw.EXPECTED_PARAMS
    else:
        n_params, expected = sum(p.numel() for p in make_model(
            shape["features"], shape["hidden"], shape["classes"]).parameters()), \
            EXPECTED_PARAMS
    if not scaled:
        assert n_params == expected, n_params

    strategy = TimedFedAvg(
        # FedAvg samples max(int(N * fraction_train), min_train_nodes) = K nodes
        fraction_train=per_round / args.clients,
        fraction_evaluate=0.0,
        min_train_nodes=per_round,
        min_evaluate_nodes=0,
        min_available_nodes=args.clients,
        report_rounds=scaled,
    )
    server_app = make_server_app(strategy, args.rounds, args.seed,
                                 shape if scaled else None, leaf_root)
    backend_config: dict = {
        "client_resources": {"num_cpus": args.num_cpus_per_client, "num_gpus": 0.0},
    }
    if args.ray_local:
        backend_config["init_args"] = {"address": "local"}

    t0, t0_wall = time.perf_counter(), time.time()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.clients,
        backend_config=backend_config,
    )
    e2e = time.perf_counter() - t0

    rounds = strategy.round_seconds()
    if len(rounds) != args.rounds:
        raise SystemExit(f"expected {args.rounds} timed rounds, got {len(rounds)}")
    out = {
        "clients": args.clients,
        "rounds": args.rounds,
        "round_seconds": [round(s, 6) for s in rounds],
        "e2e_seconds": round(e2e, 6),
        "flwr_version": flwr.__version__,
        "torch_version": torch.__version__,
        "workload": "femnist" if leaf_root else "mlp",
        "parameters": n_params,
    }
    if scaled:
        out.update({
            "per_round": per_round, **shape, "parameters": n_params,
            "setup_seconds": (None if strategy.first_train_wall is None
                              else round(strategy.first_train_wall - t0_wall, 6)),
            "first_configure_seconds": round(strategy.t_first_configure - t0, 6),
            "import_seconds": round(t0 - _T_MODULE, 6),
            "replies_per_round": strategy.replies_per_round,
        })
    os.write(result_fd, (json.dumps(out) + "\n").encode())
    os.close(result_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
