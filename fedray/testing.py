"""What a method's own tests call: run a registered method (fedray's or a plugin's) for a
few rounds in this process, through its own client hooks and server policy exactly as an
executor and the driver call them, one client at a time or as vectorized cohorts — to hold
it to a plain-PyTorch reference of your own, in both engine modes.

    from fedray.testing import local_rounds, relative_gap

    run = local_rounds("feddyn", clients, rounds=3, input_shape=(6,), num_classes=3,
                       cohort=True, overrides={"algorithm.alpha": 0.1})
    assert relative_gap(run.final, my_reference(run.model, run.start)) < 1e-6

No Ray: the runtime around the hooks (sampling, transport, checkpoints, byte ledger) has
its own suites; ``tests/test_conformance.py`` runs a method through it once its smallest
config joins ``SMALLEST``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.methods.base import ClientContext, State

__all__ = ["Rounds", "local_rounds", "relative_gap"]


@dataclass
class Rounds:
    """:func:`local_rounds`' result: the resident model, θ₀, θ after the last round, each
    round's server metrics and the clients' states after the last round."""

    model: Any
    start: State
    final: State
    metrics: list[dict[str, Any]] = field(default_factory=list)
    states: dict[int, Any] = field(default_factory=dict)


def local_rounds(algorithm: str, clients: Mapping[int, tuple[np.ndarray, np.ndarray]], *,
                 rounds: int, input_shape: tuple[int, ...], num_classes: int,
                 cohort: bool = False, seed: int = 0,
                 overrides: Mapping[str, Any] | None = None) -> Rounds:
    """``rounds`` rounds of ``algorithm`` in which every client of ``clients``
    ({client id: (x, y)}, any sizes, empty included) takes part in client-id order: the
    policy's broadcast to its ``client_update`` (or, with ``cohort``, one
    ``cohort_update`` of all of them), the uploads handed to its policy's ``aggregate``,
    each client's state carried to its next round. ``overrides`` are config keys
    (``{"algorithm.alpha": 0.1, "local.lr": 0.05}``)."""
    from fedray.core import registry
    from fedray.core.config import load_config
    from fedray.core.registry import make_method

    keys = {"algorithm.name": algorithm, "seed": seed, "clients.num_clients": len(clients),
            **(overrides or {})}
    cfg = load_config(None, [f"{k}={v}" for k, v in keys.items()])
    method = make_method(registry.method(algorithm), cfg)
    model = method.build_resident(tuple(input_shape), num_classes, "cpu")
    theta = start = method.init_global_state(model, seed)
    policy, states, metrics = method.make_policy(), {}, []
    for t in range(1, rounds + 1):
        ctxs = [ClientContext(c, t, seed, "default", x, y, x[:0], y[:0], model,
                              state=states.get(c)) for c, (x, y) in sorted(clients.items())]
        sent = policy.broadcast(theta, t, "default")
        outs = method.cohort_update(ctxs, sent) if cohort else \
            [method.client_update(ctx, sent) for ctx in ctxs]
        updates = []
        for ctx, out in zip(ctxs, outs, strict=True):
            states[ctx.client_id] = out.state
            updates.append((ctx.client_id, out.num_samples,
                            {k: np.array(v) for k, v in out.upload.items()}))
        theta, round_metrics = policy.aggregate(theta, updates, t)
        metrics.append(round_metrics)
    return Rounds(model, start, theta, metrics, states)


def relative_gap(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """The largest absolute difference over every tensor of ``want``, relative to its
    largest entry (a missing tensor raises ``KeyError``)."""
    scale = max(float(np.abs(v).max()) for v in want.values())
    return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max())
               for k in want) / scale
