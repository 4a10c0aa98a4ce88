"""FedAvgM (server momentum), the method added as its own package to prove the plugin
layout: the policy's algebra, β = 0 = FedAvg, and a real run that resumes bitwise."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.config import ConfigError, keys, load_config
from fedray.methods.fedavg.policy import FedAvgPolicy
from fedray.methods.fedavgm import FedAvgMPolicy


def updates(seed: int):
    gen = np.random.default_rng(seed)
    return [(c, int(n), {"w": gen.normal(size=(3, 2)).astype(np.float32),
                         "b": gen.normal(size=2).astype(np.float32)})
            for c, n in enumerate(gen.integers(1, 20, 4))]


def test_momentum_follows_the_recursion_and_beta_zero_is_fedavg():
    g = {"w": np.zeros((3, 2), np.float32), "b": np.ones(2, np.float32),
         "frozen": np.full(3, 7.0, np.float32)}
    pol, ref = FedAvgMPolicy(0.5, 0.9), FedAvgPolicy(0.5)
    state, plain, v = dict(g), dict(g), {k: 0.0 for k in ("w", "b")}
    for r in range(1, 4):
        ups = updates(r)
        mean = {k: sum(n * u[k].astype(np.float64) for _, n, u in ups) /
                sum(n for _, n, _ in ups) for k in ("w", "b")}
        v = {k: 0.9 * v[k] + mean[k] for k in v}
        expect = {k: (state[k].astype(np.float64) + 0.5 * v[k]).astype(np.float32) for k in v}
        state, metrics = pol.aggregate(state, ups, r)
        for k in v:
            assert np.array_equal(state[k], expect[k])
        assert np.array_equal(state["frozen"], g["frozen"])  # not uploaded: untouched
        assert metrics["velocity_norm"] > 0
        plain, _ = ref.aggregate(plain, ups, r)
    assert not np.allclose(state["w"], plain["w"])  # momentum changed the trajectory
    zero, plain = FedAvgMPolicy(0.5, 0.0), dict(g)
    state = dict(g)
    for r in range(1, 4):
        state, _ = zero.aggregate(state, updates(r), r)
        plain, _ = FedAvgPolicy(0.5).aggregate(plain, updates(r), r)
        assert all(np.array_equal(state[k], plain[k]) for k in g)
    restored = FedAvgMPolicy(0.5, 0.9)
    restored.load_state_dict(pol.state_dict())
    a, _ = pol.aggregate(dict(g), updates(9), 4)
    b, _ = restored.aggregate(dict(g), updates(9), 4)
    assert all(np.array_equal(a[k], b[k]) for k in g)


def test_registered_with_its_knobs():
    cfg = load_config(None, ["algorithm.name=fedavgm", "algorithm.momentum=0.5"])
    assert cfg.algorithm["momentum"] == 0.5
    assert any(k == "algorithm.momentum" and "[fedavgm]" in h for k, _, h in keys())
    with pytest.raises(ConfigError, match="algorithm.momentum"):
        load_config(None, ["algorithm.name=fedavgm", "algorithm.momentum=1.0"])


@pytest.mark.ray
def test_fedavgm_learns_and_resumes_bitwise(ray_session, tiny_cfg, tmp_path):
    from conftest import full_and_resumed

    from fedray import checkpoint
    from fedray.storage import Storage

    cfg = tiny_cfg(**{"algorithm.name": "fedavgm", "algorithm.momentum": 0.5, "rounds": 4})
    full, resumed = full_and_resumed(cfg, tmp_path)
    assert full["final_global_accuracy"] > 0.2
    a = checkpoint.read(Storage(str(tmp_path / "full")))
    b = checkpoint.read(Storage(str(tmp_path / "cut")))
    assert all(np.array_equal(a["server"]["params"][k], b["server"]["params"][k])
               for k in a["server"]["params"])
    assert set(a["policy"]["velocity"]) == set(a["server"]["params"])
