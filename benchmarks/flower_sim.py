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
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

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


def make_model() -> nn.Module:
    """MLP 784-256-10."""
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, NUM_CLASSES)
    )


def client_data(seed: int, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic synthetic data of one client, seeded by (seed, client id)."""
    gen = np.random.default_rng([seed, client_id])
    x = gen.standard_normal((SAMPLES_PER_CLIENT, IN_FEATURES), dtype=np.float32)
    y = gen.integers(0, NUM_CLASSES, size=SAMPLES_PER_CLIENT, dtype=np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


# --------------------------------------------------------------------------- client

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One local epoch of SGD on this client's synthetic data."""
    torch.set_num_threads(1)
    config = msg.content["config"]
    seed = int(config["seed"])
    client_id = int(context.node_config["partition-id"])

    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = client_data(seed, client_id)
    # Deterministic shuffling per (seed, client, round).
    gen = torch.Generator().manual_seed(seed * 1_000_003 + client_id * 1_009
                                        + int(config["server-round"]))
    opt = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    total_loss = 0.0
    steps = 0
    for _ in range(LOCAL_EPOCHS):
        perm = torch.randperm(SAMPLES_PER_CLIENT, generator=gen)
        for start in range(0, SAMPLES_PER_CLIENT, BATCH_SIZE):
            idx = perm[start:start + BATCH_SIZE]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total_loss += float(loss.item())
            steps += 1

    content = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({
            "train_loss": total_loss / max(steps, 1),
            "num-examples": SAMPLES_PER_CLIENT,
        }),
    })
    return Message(content=content, reply_to=msg)


# --------------------------------------------------------------------------- server

class TimedFedAvg(FedAvg):
    """FedAvg that records wall-clock timestamps for per-round timing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.t_first_configure: float | None = None
        self.t_aggregate: list[float] = []

    def configure_train(self, server_round, arrays, config, grid):
        if self.t_first_configure is None:
            self.t_first_configure = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        result = super().aggregate_train(server_round, replies)
        if len(replies) != self.min_train_nodes or result[0] is None:
            raise RuntimeError(
                f"round {server_round}: {len(replies)} replies, expected "
                f"{self.min_train_nodes} (or aggregation failed)")
        self.t_aggregate.append(time.perf_counter())
        return result

    def round_seconds(self) -> list[float]:
        if self.t_first_configure is None:
            return []
        stamps = [self.t_first_configure, *self.t_aggregate]
        return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def make_server_app(strategy: TimedFedAvg, num_rounds: int, seed: int) -> ServerApp:
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(seed)
        model = make_model()
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=num_rounds,
            train_config=ConfigRecord({"lr": LR, "seed": seed}),
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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clients < 1 or args.rounds < 1:
        raise SystemExit("--clients and --rounds must be >= 1")

    # Keep stdout for the one JSON line: point fd 1 at stderr for the whole run (this
    # also catches prints from Ray and its workers), and write the result to a saved
    # copy of the original stdout.
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)

    logging.getLogger("flwr").setLevel(args.log_level.upper())
    torch.set_num_threads(1)
    n_params = sum(p.numel() for p in make_model().parameters())
    assert n_params == EXPECTED_PARAMS, n_params

    strategy = TimedFedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=args.clients,
        min_evaluate_nodes=0,
        min_available_nodes=args.clients,
    )
    server_app = make_server_app(strategy, args.rounds, args.seed)
    backend_config = {
        "client_resources": {"num_cpus": args.num_cpus_per_client, "num_gpus": 0.0},
    }

    t0 = time.perf_counter()
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
    }
    os.write(result_fd, (json.dumps(out) + "\n").encode())
    os.close(result_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
