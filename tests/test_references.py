"""Every local-SGD method against its plain-PyTorch reference (``tests/reference/``), over
3 rounds with unequal clients (one smaller than a batch, one with no samples, so zero
steps), in both engine modes: one client at a time and the round's clients as one
vectorized cohort. The fedray side is :func:`fedray.testing.local_rounds`: the method's own
hooks and server policy, in this process, as an executor and the driver call them (the
runtime around them has its own suites)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from reference import fedavg, feddyn, fednova, fedprox, moon, orders, scaffold

from fedray.testing import local_rounds
from fedray.testing import relative_gap as gap

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
    """(model, θ₀, θ) after ROUNDS rounds of ``algo`` through its own hooks and policy."""
    run = local_rounds(algo, clients(), rounds=ROUNDS, input_shape=SHAPE,
                       num_classes=CLASSES, cohort=cohort, seed=SEED,
                       overrides={"model.hidden": "[16]",
                                  **{f"local.{k}": v for k, v in LOCAL.items()}, **extra})
    return run.model, run.start, run.final


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
    "scaffold": ({"server.optimizer": "sgd", "server.lr": 0.5}, lambda m, t: scaffold.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL, population=len(SIZES),
        server_lr=0.5)),
    "fednova": ({"local.momentum": 0.5}, lambda m, t: fednova.run(
        m, t, clients(), rounds=ROUNDS, seed=SEED, local={**LOCAL, "momentum": 0.5})),
    "orders": ({}, lambda m, t: orders.run(m, t, clients(), rounds=ROUNDS, seed=SEED,
                                           local=LOCAL)),
    "moon": ({"algorithm.contrastive_weight": 2.0, "algorithm.temperature": 0.5},
             lambda m, t: moon.run(m, t, clients(), rounds=ROUNDS, seed=SEED, local=LOCAL,
                                   mu=2.0, tau=0.5)),
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
