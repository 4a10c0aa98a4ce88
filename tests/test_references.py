"""Every local-SGD method against its plain-PyTorch reference (``tests/reference/``), over
3 rounds with unequal clients (one smaller than a batch, one with no samples, so zero
steps), in both engine modes: one client at a time and the round's clients as one
vectorized cohort. The fedray side is the method's own hooks and server policy, in this
process, as an executor runs them (the runtime around them has its own suites)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import tiny_overrides
from reference import fedavg, feddyn, fedprox

from fedray.core import registry
from fedray.core.config import load_config
from fedray.core.registry import make_method
from fedray.methods.base import ClientContext

ROUNDS, SEED, SHAPE, CLASSES = 3, 11, (6,), 3
SIZES = {0: 37, 1: 5, 2: 0, 3: 21}  # batch 8: 5 is smaller than a batch, 0 takes no step
LOCAL = {"lr": 0.1, "epochs": 2, "batch_size": 8, "momentum": 0.0, "weight_decay": 1e-3}


def clients():
    gen = np.random.default_rng(3)
    out = {}
    for c, n in SIZES.items():
        x = gen.normal(size=(n, *SHAPE)).astype(np.float32)
        out[c] = (x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1))
    return out


def fedray_run(algo, cohort, **extra):
    """θ after ROUNDS rounds of ``algo`` through its own hooks and policy, every client
    taking part, client states carried from round to round."""
    overrides = {"algorithm.name": algo, "seed": SEED, "clients.num_clients": len(SIZES),
                 "model.hidden": "[16]", **{f"local.{k}": v for k, v in LOCAL.items()},
                 **extra}
    cfg = load_config(None, tiny_overrides(**overrides))
    method = make_method(registry.method(algo), cfg)
    model = method.build_resident(SHAPE, CLASSES, "cpu")
    theta = theta0 = method.init_global_state(model, SEED)
    policy, states, data = method.make_policy(), {}, clients()
    for t in range(1, ROUNDS + 1):
        ctxs = [ClientContext(c, t, SEED, "default", x, y, x[:0], y[:0], model,
                              state=states.get(c)) for c, (x, y) in sorted(data.items())]
        outs = method.cohort_update(ctxs, theta) if cohort else \
            [method.client_update(ctx, theta) for ctx in ctxs]
        for ctx, out in zip(ctxs, outs, strict=True):
            states[ctx.client_id] = out.state
        updates = [(ctx.client_id, out.num_samples, {k: np.array(v) for k, v in
                                                     out.upload.items()})
                   for ctx, out in zip(ctxs, outs, strict=True)]
        theta, _ = policy.aggregate(theta, updates, t)
    return model, theta0, theta


def gap(got, want):
    """The largest difference over every tensor, relative to the largest entry."""
    scale = max(float(np.abs(v).max()) for v in want.values())
    return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max())
               for k in want) / scale


CASES = {
    "fedavg": ({}, lambda m, t: fedavg.run(m, t, clients(), rounds=ROUNDS, seed=SEED,
                                           local=LOCAL)),
    "fedavgm": ({"server.momentum": 0.5}, lambda m, t: fedavg.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL,
        server=fedavg.Server("momentum", momentum=0.5))),
    "fedadam": ({"server.lr": 0.05}, lambda m, t: fedavg.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL,
        server=fedavg.Server("adam", lr=0.05))),
    "fedyogi": ({"server.lr": 0.05}, lambda m, t: fedavg.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL,
        server=fedavg.Server("yogi", lr=0.05))),
    "fedprox": ({"algorithm.mu": 0.3}, lambda m, t: fedprox.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL, mu=0.3)),
    "feddyn": ({"algorithm.alpha": 0.1}, lambda m, t: feddyn.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL, alpha=0.1,
        population=len(SIZES))),
}


@pytest.mark.parametrize("cohort", [False, True], ids=["per-client", "cohort"])
@pytest.mark.parametrize("algo", list(CASES))
def test_method_equals_its_plain_pytorch_reference(algo, cohort):
    extra, reference = CASES[algo]
    model, theta0, got = fedray_run(algo, cohort, **extra)
    want = reference(copy.deepcopy(model), theta0)
    assert gap(got, theta0) > 1e-3  # three rounds moved the model
    assert gap(got, want) < 1e-6, gap(got, want)


def test_kept_client_momentum_is_the_same_in_both_engine_modes():
    """Momentum buffers a client keeps between its rounds (``local.keep_optimizer_state``),
    carried through the engine's client state, one client at a time and as a cohort."""
    kept = {"local.momentum": 0.9, "local.keep_optimizer_state": "true"}
    _, _, seq = fedray_run("fedavg", False, **kept)
    _, _, vec = fedray_run("fedavg", True, **kept)
    assert gap(vec, seq) < 1e-6
