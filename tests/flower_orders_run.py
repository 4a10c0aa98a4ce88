"""End-to-end check of :class:`fedray.integrations.flower.OrdersStrategy` in Flower's own
simulation (``flwr.simulation.run_simulation``).

Run with the Flower venv's interpreter and the repo root on ``PYTHONPATH``::

    PYTHONPATH=. .venv-flower/bin/python tests/flower_orders_run.py

3 rounds, 6 clients (all sampled), Linear(20, 3) on seeded synthetic data, 1 local epoch,
``OrdersParams(weighting="inverse", participation_threshold=1)``. Checks:

* ``all_replies``: every round aggregated all 6 replies, and ORDERS ranked all 6;
* ``replay_equal``: the final global arrays equal an offline replay of ``orders_step`` on
  (θ_{t−1}, Δθ, ids) recorded here independently of the strategy's own flattening
  (a fresh ``OrdersState``, ids = rank of the node id among the sorted node ids seen);
* ``sent_is_aggregated``: the arrays sent in round t+1 are the ones aggregated in round t;
* ``model_moved``: the final arrays differ from the initial ones.

One JSON line goes to stdout; everything else (Flower, Ray) to stderr. Exit code 0 only if
all checks pass.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.pop("RAY_ADDRESS", None)  # Flower starts its own Ray; never join another one

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402,I001
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

from fedray.integrations.flower import OrdersStrategy  # noqa: E402
from fedray.methods.orders.policy import OrdersParams, OrdersState, orders_step  # noqa: E402

CLIENTS, ROUNDS, SEED = 6, 3, 0
IN, OUT, SAMPLES, BATCH, LR = 20, 3, 64, 16, 0.1


def make_model() -> nn.Module:
    return nn.Linear(IN, OUT)


def client_data(client: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded synthetic data; clients differ in size of their input shift, so their update
    norms (and hence ORDERS' ranking) differ."""
    gen = np.random.default_rng([SEED, client])
    x = gen.standard_normal((SAMPLES, IN)).astype(np.float32) * (1.0 + 0.5 * client)
    y = gen.integers(0, OUT, size=SAMPLES)
    return torch.from_numpy(x), torch.from_numpy(y)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    client = int(context.node_config["partition-id"])
    round_ = int(msg.content["config"]["server-round"])
    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = client_data(client)
    gen = torch.Generator().manual_seed(SEED * 1_000_003 + client * 1_009 + round_)
    opt = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["lr"]))
    loss_fn = nn.CrossEntropyLoss()
    total, steps = 0.0, 0
    perm = torch.randperm(SAMPLES, generator=gen)  # 1 local epoch
    for start in range(0, SAMPLES, BATCH):
        idx = perm[start:start + BATCH]
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        total, steps = total + float(loss.item()), steps + 1
    return Message(content=RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"train_loss": total / steps, "num-examples": SAMPLES}),
    }), reply_to=msg)


class RecordingOrders(OrdersStrategy):
    """Records each round's inputs, flattened here independently of the strategy."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rounds: list[dict] = []
        self.seen: set[int] = set()

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        names = list(self.current_arrays)
        prev = np.concatenate([self.current_arrays[k].ravel() for k in names]).astype(
            np.float32)
        nodes = [m.metadata.src_node_id for m in replies]
        self.seen.update(nodes)
        rank = {n: i for i, n in enumerate(sorted(self.seen))}
        rows = sorted(zip(nodes, replies, strict=True), key=lambda t: rank[t[0]])
        deltas = np.stack([
            np.concatenate([m.content["arrays"][k].numpy().astype(np.float32).ravel()
                            for k in names]) - prev for _, m in rows])
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.rounds.append({
            "round": server_round, "replies": len(replies), "names": names, "prev": prev,
            "deltas": deltas, "ids": np.array([rank[n] for n, _ in rows], dtype=np.int64),
            "out": None if arrays is None else np.concatenate(
                [arrays[k].numpy().astype(np.float32).ravel() for k in names]),
            "metrics": None if metrics is None else dict(metrics),
        })
        return arrays, metrics


def main() -> int:
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)  # stdout is for the one JSON line only
    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(1)

    params = OrdersParams(weighting="inverse", participation_threshold=1)
    strategy = RecordingOrders(params, fraction_train=1.0, fraction_evaluate=0.0,
                               min_train_nodes=CLIENTS, min_evaluate_nodes=0,
                               min_available_nodes=CLIENTS)
    torch.manual_seed(SEED)
    initial = ArrayRecord(make_model().state_dict())
    initial_flat = np.concatenate([a.numpy().astype(np.float32).ravel()
                                   for a in initial.values()])
    final: dict = {}

    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        final["result"] = strategy.start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS,
                                         train_config=ConfigRecord({"lr": LR}))

    t0 = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    seconds = time.perf_counter() - t0

    recs = strategy.rounds
    result = final.get("result")
    final_flat = None if result is None else np.concatenate(
        [result.arrays[k].numpy().astype(np.float32).ravel() for k in result.arrays.keys()])

    all_replies = len(recs) == ROUNDS and all(
        r["replies"] == CLIENTS and r["metrics"] is not None
        and r["metrics"].get("orders/ranked") == CLIENTS for r in recs)
    state, replay = OrdersState(), None
    for r in recs:
        replay, state, _ = orders_step(r["prev"], r["deltas"], r["ids"], r["round"], state,
                                       params)
    replay_equal = bool(final_flat is not None and replay is not None
                        and np.array_equal(final_flat, replay))
    sent_is_aggregated = bool(len(recs) == ROUNDS and all(
        a["out"] is not None and np.array_equal(a["out"], b["prev"])
        for a, b in zip(recs, recs[1:], strict=False)) and np.array_equal(recs[0]["prev"],
                                                                          initial_flat))
    moved = 0.0 if final_flat is None else float(np.linalg.norm(final_flat - initial_flat))
    model_moved = bool(moved > 0)
    ok = all_replies and replay_equal and sent_is_aggregated and model_moved

    out = {
        "ok": ok, "all_replies": all_replies, "replay_equal": replay_equal,
        "sent_is_aggregated": sent_is_aggregated, "model_moved": model_moved,
        "replies_per_round": [r["replies"] for r in recs],
        "ranked_per_round": [r["metrics"] and r["metrics"].get("orders/ranked") for r in recs],
        "coefficient_sum_per_round": [r["metrics"] and r["metrics"].get(
            "orders/coefficient_sum") for r in recs],
        "update_norm_per_round": [r["metrics"] and r["metrics"].get("orders/update_norm")
                                  for r in recs],
        "replay_max_abs_diff": None if final_flat is None or replay is None
        else float(np.max(np.abs(final_flat - replay))),
        "moved_l2": moved, "client_ids": sorted(strategy.client_ids.values()),
        "seconds": round(seconds, 3),
    }
    os.write(result_fd, (json.dumps(out) + "\n").encode())
    os.close(result_fd)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
