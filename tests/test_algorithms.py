"""FedAvg/FedProx without Ray: the policy against hand-computed values, the client update on
a real tiny model."""

import numpy as np
import pytest

from fedray.algorithms import make_algorithm
from fedray.algorithms.base import ClientContext
from fedray.algorithms.fedavg import FedAvgPolicy
from fedray.config import load_config
from fedray.data import build_federated


def test_fedavg_policy_hand_computed():
    g = {"w": np.array([1.0, 2.0], np.float32)}
    ups = [(0, 1, {"w": np.array([1.0, 0.0], np.float32)}),
           (3, 3, {"w": np.array([-1.0, 4.0], np.float32)})]
    new, m = FedAvgPolicy(server_lr=1.0).aggregate(g, ups, 1)
    assert np.allclose(new["w"], [1.0 + (1 * 1 - 3) / 4, 2.0 + 12 / 4])
    new, _ = FedAvgPolicy(server_lr=0.5, weighted=False).aggregate(g, ups, 1)
    assert np.allclose(new["w"], [1.0 + 0.5 * 0.0, 2.0 + 0.5 * 2.0])
    assert m["update_norm"] == pytest.approx(np.hypot(-0.5, 3.0))


def _ctx(cfg, algo, data, cid=0):
    resident = algo.build_resident(data.input_shape, data.num_classes, "cpu")
    x, y = data.client_arrays(cid, 1, "train")
    xt, yt = data.client_arrays(cid, 1, "test")
    return ClientContext(cid, 1, cfg.seed, "default", x, y, xt, yt, resident)


def _run(overrides):
    cfg = load_config(None, ["clients.num_clients=4", "model.hidden=[16]", "local.epochs=2",
                             *overrides])
    algo = make_algorithm(cfg)
    data = build_federated(cfg.data, 4, cfg.seed)
    ctx = _ctx(cfg, algo, data)
    g = algo.init_global_state(ctx.resident, cfg.seed)
    return algo, ctx, g, algo.client_update(ctx, g)


def test_client_update_is_deterministic_and_moves():
    _, _, g, a = _run([])
    _, _, _, b = _run([])
    assert a.num_samples > 0 and a.metrics["steps"] > 0
    for k in a.upload:
        assert np.array_equal(a.upload[k], b.upload[k])
    assert sum(float(np.abs(v).sum()) for v in a.upload.values()) > 0


def test_fedprox_mu_zero_equals_fedavg_and_mu_shrinks_update():
    _, _, _, avg = _run([])
    _, _, _, p0 = _run(["algorithm.name=fedprox", "algorithm.mu=0"])
    _, _, _, p1 = _run(["algorithm.name=fedprox", "algorithm.mu=5.0"])
    for k in avg.upload:
        assert np.array_equal(avg.upload[k], p0.upload[k])

    def norm(u):
        return np.sqrt(sum(float((v ** 2).sum()) for v in u.values()))

    assert norm(p1.upload) < norm(avg.upload)


def test_keep_optimizer_state_returns_momentum():
    _, _, _, out = _run(["local.momentum=0.9", "local.keep_optimizer_state=true"])
    assert out.state is not None and out.state["optimizer"]["state"]
    _, _, _, plain = _run(["local.momentum=0.9"])
    assert plain.state is None
