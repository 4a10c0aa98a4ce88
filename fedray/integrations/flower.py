"""ORDERS as a Flower strategy (message API, ``flwr.serverapp.strategy``, Flower 1.2x-1.4x).

:class:`OrdersStrategy` is Flower's ``FedAvg`` with the train aggregation replaced by
fedray's ORDERS policy core, :func:`fedray.methods.orders.policy.orders_step` — the same function
fedray's own ``OrdersPolicy`` calls, not a re-implementation. Node sampling, message
construction, reply validation, evaluation and the aggregation of the clients' metrics stay
Flower's (``FedAvg``'s). Each round the strategy keeps θ_{t−1} (the arrays it sent in
``configure_train``), flattens every reply's Δθ_i = θ_i − θ_{t−1} in the order of the sent
arrays' keys, runs ``orders_step`` with its own :class:`~fedray.methods.orders.policy.OrdersState`
and returns θ_t plus the clients' aggregated metrics and ORDERS' round diagnostics
(``orders/ranked``, ``orders/coefficient_sum``, ``orders/update_norm``, ...).

Flower pins its own ray, so this module runs in a separate virtualenv with the ``flower``
extra (flwr[simulation], torch, numpy, pyyaml): ``bash benchmarks/setup_flower_venv.sh``
creates ``.venv-flower``; put the fedray checkout on its ``PYTHONPATH``. Only this module
imports ``flwr``; nothing else in fedray does.

Usage (inside a ``ServerApp``'s main; clients reply with ``"arrays"`` and a MetricRecord
holding ``"num-examples"``, as for ``FedAvg``)::

    from flwr.app import ArrayRecord, ConfigRecord
    from fedray.integrations.flower import OrdersStrategy
    from fedray.methods.orders.policy import OrdersParams

    strategy = OrdersStrategy(
        OrdersParams(weighting="inverse", participation_threshold=1),
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=6, min_available_nodes=6,
    )
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=3, train_config=ConfigRecord({"lr": 0.05}))
    model.load_state_dict(result.arrays.to_torch_state_dict())

Client ids: ORDERS keeps per-client memory (norm window, participation) keyed by an
integer id and ranks ties by ascending id. Flower's node ids are large unsigned integers,
so each node gets a small stable id on first sight: the number of nodes seen before it,
new nodes of one round numbered in ascending node-id order (with every node sampled in
round 1 this is a node's rank among the sorted node ids). Rows go to ``orders_step`` in
ascending id order. :attr:`OrdersStrategy.client_ids` holds the mapping.

Clients may report their update norm (ORDERS' "one extra float") as the metric
``"orders.norm"``; with ``params.client_norms`` (the default) and every reply carrying it
the server uses those instead of recomputing them. With ``params.hierarchical`` the tier of
each client is read from the metric ``"orders.tier"`` (an integer) when every reply has it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from fedray.core.seeding import rng
from fedray.methods.orders.policy import OrdersParams, OrdersState, key_layer_mask, orders_step

NORM_KEY = "orders.norm"
TIER_KEY = "orders.tier"
# Round-level diagnostics of orders_step put into the returned MetricRecord (when finite).
ROUND_METRICS = ("ranked", "excluded", "coefficient_sum", "negative_coefficients",
                 "update_norm", "smoothed_norm_mean", "norm_skewness", "noise_scale_min",
                 "noise_scale_max", "noise_scale_mean")


class OrdersStrategy(FedAvg):
    """Flower ``FedAvg`` whose train aggregation is ORDERS (:func:`orders_step`).

    Parameters
    ----------
    params : OrdersParams, optional
        ORDERS' knobs (default: ``OrdersParams()``); validated here.
    seed : int (default: 0)
        Seed of the Laplace noise on the ranked norms (``params.dp_b0 > 0``), drawn from
        ``fedray.core.seeding.rng(seed, round, -1, "orders-dp")`` as in fedray's ``OrdersPolicy``.
    **fedavg_kwargs
        ``FedAvg``'s keyword arguments (``fraction_train``, ``min_train_nodes``,
        ``weighted_by_key``, ``train_metrics_aggr_fn``, ...).

    Attributes
    ----------
    state : OrdersState
        ORDERS' server memory, replaced after every aggregated round.
    client_ids : dict[int, int]
        Flower node id -> the integer client id given to ``orders_step``.
    last_diagnostics : dict | None
        The full diagnostics of the last ``orders_step`` call (``per_client`` is keyed by
        the client id of :attr:`client_ids`).
    """

    def __init__(self, params: OrdersParams | None = None, *, seed: int = 0,
                 **fedavg_kwargs: Any) -> None:
        super().__init__(**fedavg_kwargs)
        self.params = params if params is not None else OrdersParams()
        self.params.validate()
        self.seed = seed
        self.state = OrdersState()
        self.client_ids: dict[int, int] = {}
        self.current_arrays: dict[str, np.ndarray] | None = None
        self.last_diagnostics: dict[str, Any] | None = None

    def summary(self) -> None:
        """Log FedAvg's summary plus the ORDERS parameters."""
        super().summary()
        log(INFO, "\t└──> ORDERS: %s", self.params)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """FedAvg's configure_train; keeps the sent arrays as θ_{t−1}."""
        self.current_arrays = {k: np.array(a.numpy(), copy=True) for k, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def _client_id(self, node_ids: Iterable[int]) -> list[int]:
        for node in sorted(n for n in set(node_ids) if n not in self.client_ids):
            self.client_ids[node] = len(self.client_ids)
        return [self.client_ids[n] for n in node_ids]

    def _reported(self, contents: list[RecordDict], key: str) -> list[float] | None:
        values = []
        for content in contents:
            metrics = next(iter(content.metric_records.values()))
            if key not in metrics:
                return None
            values.append(metrics[key])
        return values

    def orders_step(self, prev: np.ndarray, deltas: np.ndarray, client_ids: np.ndarray,
                    server_round: int, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """Run :func:`orders_step` on one round's flat inputs and keep the new state.

        ``prev`` (P,) float32, ``deltas`` (N, P) float32 in ascending ``client_ids``;
        ``kwargs`` are ``orders_step``'s (``norms``, ``tiers``, ``rng``, ``key_mask``).
        Returns (θ_t flat float32, diagnostics). A seam for subclasses (e.g. recording).
        """
        new, self.state, diag = orders_step(prev, deltas, client_ids, server_round,
                                            self.state, self.params, **kwargs)
        return new, diag

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """ORDERS over the valid replies' arrays; the clients' metrics as in FedAvg."""
        valid, _ = self._check_and_log_replies(list(replies), is_train=True)
        if not valid:
            return None, None
        if self.current_arrays is None:
            log(WARNING, "aggregate_train: no arrays were sent this round; skipping")
            return None, None
        names = list(self.current_arrays)
        prev_arrays = self.current_arrays
        contents = [msg.content for msg in valid]
        for msg in valid:
            record = next(iter(msg.content.array_records.values()))
            if set(record.keys()) != set(names) or any(
                    tuple(record[k].shape) != prev_arrays[k].shape for k in names):
                log(WARNING, "aggregate_train: reply of node %d does not match the sent "
                    "arrays' keys/shapes; skipping aggregation", msg.metadata.src_node_id)
                return None, None

        ids = np.asarray(self._client_id([msg.metadata.src_node_id for msg in valid]),
                         dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        prev = np.concatenate([prev_arrays[k].reshape(-1) for k in names]).astype(np.float32)
        deltas = np.empty((len(valid), prev.size), dtype=np.float32)
        for row, j in enumerate(order):
            record = next(iter(contents[j].array_records.values()))
            flat = np.concatenate([np.asarray(record[k].numpy(), dtype=np.float32).reshape(-1)
                                   for k in names])
            np.subtract(flat, prev, out=deltas[row])

        kwargs: dict[str, Any] = {"rng": rng(self.seed, server_round, -1, "orders-dp")}
        norms = self._reported(contents, NORM_KEY) if self.params.client_norms else None
        if norms is not None:
            kwargs["norms"] = np.asarray(norms, dtype=np.float64)[order]
        tiers = self._reported(contents, TIER_KEY) if self.params.hierarchical else None
        if tiers is not None:
            kwargs["tiers"] = np.asarray(tiers, dtype=np.int64)[order]
        if self.params.norm == "key_layer":
            kwargs["key_mask"] = key_layer_mask(prev_arrays, self.params.key_layers)
        new, diag = self.orders_step(prev, deltas, ids[order], server_round, **kwargs)
        self.last_diagnostics = diag

        out, offset = {}, 0
        for k in names:
            ref = prev_arrays[k]
            out[k] = Array(np.ascontiguousarray(
                new[offset:offset + ref.size].reshape(ref.shape).astype(ref.dtype)))
            offset += ref.size
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        for key in ROUND_METRICS:
            value = diag.get(key)
            if value is not None and math.isfinite(value):
                metrics[f"orders/{key}"] = float(value)
        return ArrayRecord(out), metrics

