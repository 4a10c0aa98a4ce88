"""ORDERS, client side: FedAvg's local SGD; the upload is the update Δθ_i plus its norm
(``orders.norm``, one float — the text's only extra communication). The server side is
:mod:`fedray.policies.orders`."""

from __future__ import annotations

import numpy as np

from fedray.algorithms.base import ClientContext, ClientOutput
from fedray.algorithms.fedavg import FedAvg
from fedray.policies.orders import OrdersParams, OrdersPolicy, key_layer_names, update_norms


class Orders(FedAvg):
    """Norm-rank difference aggregation (ORDERS) with smoothing and participation rules."""

    name = "orders"
    Params = OrdersParams

    def client_update(self, ctx: ClientContext, broadcast) -> ClientOutput:
        out = super().client_update(ctx, broadcast)
        p = self.params
        names = list(broadcast)
        delta = np.concatenate([out.upload[k].reshape(-1) for k in names])[None, :]
        prev = np.concatenate([np.asarray(broadcast[k]).reshape(-1) for k in names])
        mask = None
        if p.norm == "key_layer":
            keep = set(key_layer_names(names, p.key_layers))
            mask = np.concatenate([np.full(np.size(broadcast[k]), k in keep) for k in names])
        norm = update_norms(delta, p, prev, mask)[0]
        upload = dict(out.upload)
        upload["orders.norm"] = np.array([norm], dtype=np.float32)
        out.upload = upload
        out.metrics["update_norm"] = float(norm)
        return out

    def make_policy(self) -> OrdersPolicy:
        tier_of = [self.cfg.tier_of(c) for c in range(self.cfg.clients.num_clients)]
        return OrdersPolicy(self.params, self.cfg.seed, tier_of)
