"""fedray's server optimizers against Flower's own strategies (FedAvgM with and without
momentum, FedAdam, FedYogi, FedAdagrad) on identical float64 inputs over six rounds.

Flower pins its own ray, so Flower runs in ``.venv-flower`` (conftest.flower_python: made
by ``benchmarks/setup_flower_venv.sh`` when missing) as ``tests/flower_server_opt_run.py``.
Agreement is ≤ 1e-12 once two conventions are set to Flower's: v_{-1} = 0
(``server.initial_accumulator=0``; Reddi et al.'s Algorithm 2, fedray's default, has
v_{-1} = τ²) and, for Adam, bias correction on (``server.bias_correction=true``; Flower
always applies it and counts t from server_round + 1, so the runner passes round t as
t − 1). fedray's defaults differ from Flower's by exactly those conventions, which the
last assertion shows."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import flower_process

from fedray.methods.fedavg.policy import FedAvgPolicy
from fedray.services.server_opt import SGD, Adagrad, Adam, Momentum, Yogi

SHAPES = [(4, 3), (3,), (2, 2, 2)]
ROUNDS, CLIENTS = 6, 5

FEDRAY = {  # the same hyperparameters as the runner's CASES, with Flower's conventions
    "sgd": lambda: SGD.of(lr=0.7),
    "momentum": lambda: Momentum.of(lr=0.5, momentum=0.9),
    "adam": lambda: Adam.of(lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, initial_accumulator=0.0,
                            bias_correction=True),
    "yogi": lambda: Yogi.of(lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, initial_accumulator=0.0),
    "adagrad": lambda: Adagrad.of(lr=0.1, beta1=0.0, tau=1e-3, initial_accumulator=0.0),
}


def inputs() -> dict[str, np.ndarray]:
    gen = np.random.default_rng(2021)
    data = {f"x0/{i}": gen.normal(size=s) for i, s in enumerate(SHAPES)}
    for t in range(1, ROUNDS + 1):
        data[f"n/{t}"] = gen.integers(1, 50, CLIENTS)
        for c in range(CLIENTS):
            for i, s in enumerate(SHAPES):
                data[f"delta/{t}/{c}/{i}"] = gen.normal(scale=0.1, size=s)
    return data


def fedray_run(data: dict[str, np.ndarray], make) -> list[dict[str, np.ndarray]]:
    policy = FedAvgPolicy(make())
    state = {str(i): data[f"x0/{i}"] for i in range(len(SHAPES))}
    out = []
    for t in range(1, ROUNDS + 1):
        ups = [(c, int(n), {str(i): data[f"delta/{t}/{c}/{i}"] for i in range(len(SHAPES))})
               for c, n in enumerate(data[f"n/{t}"])]
        state, _ = policy.aggregate(state, ups, t)
        out.append(state)
    return out


@pytest.mark.flower
@pytest.mark.timeout(3600)
def test_server_optimizers_agree_with_flower(flower_python, tmp_path):
    data = inputs()
    np.savez(tmp_path / "in.npz", **data)
    proc = flower_process(flower_python, "flower_server_opt_run.py", str(tmp_path / "in.npz"),
                          str(tmp_path / "out.npz"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    flower = np.load(tmp_path / "out.npz")
    worst = {}
    for name, make in FEDRAY.items():
        ours = fedray_run(data, make)
        worst[name] = max(float(np.max(np.abs(ours[t - 1][str(i)] - flower[f"{name}/{t}/{i}"])))
                          for t in range(1, ROUNDS + 1) for i in range(len(SHAPES)))
        moved = max(float(np.max(np.abs(ours[-1][str(i)] - data[f"x0/{i}"])))
                    for i in range(len(SHAPES)))
        assert moved > 1e-3, (name, moved)  # six real steps, not a no-op
    print("max |fedray - Flower| over 6 rounds:", worst)
    assert all(v <= 1e-12 for v in worst.values()), worst
    # fedray's defaults (Algorithm 2: v_{-1} = τ², no bias correction) are not Flower's
    paper = fedray_run(data, lambda: Adam.of(lr=0.05, tau=1e-3))
    assert np.max(np.abs(paper[-1]["0"] - flower[f"adam/{ROUNDS}/0"])) > 1e-6
