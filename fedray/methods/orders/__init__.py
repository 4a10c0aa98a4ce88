"""ORDERS — norm-rank difference aggregation (papers/orders-norm-rank-aggregation.zh.txt):
the client half (:mod:`.method`), the pure-numpy server step (:mod:`.policy`, also used by
the Flower strategy in :mod:`fedray.integrations.flower`) and the report diagnostics
(:mod:`.diagnostics`)."""

from fedray.methods.orders.method import Orders
from fedray.methods.orders.policy import (
    OrdersParams,
    OrdersPolicy,
    OrdersState,
    orders_step,
    orders_update,
)

__all__ = ["Orders", "OrdersParams", "OrdersPolicy", "OrdersState", "orders_step",
           "orders_update"]
