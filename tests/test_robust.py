"""Byzantine-robust aggregation (issue #30, the defences): every rule on updates whose
result is worked out by hand, the assumptions each rule states, the config checks before
Ray, and FedAvg with robust rules through Ray — bitwise across executor counts and across
``--resume`` (centered clipping's carried aggregate included), each client's weight in
its row."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import full_and_resumed
from test_runtime import final_state, run_outputs, runs_across_executors

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.methods.robust import RobustConfig, RobustRule, rules


def col(*v):
    return np.asarray(v, np.float64)[:, None]


def test_median_odd_and_even_and_who_entered_it():
    out = rules.median(col(5, -3, 1, 100, 2))
    assert out.aggregate.tolist() == [2.0] and out.kept.tolist() == [0, 0, 0, 0, 1]
    out = rules.median(col(4, 1, 3, 100))  # the mean of the two middle values
    assert out.aggregate.tolist() == [3.5] and out.kept.tolist() == [1, 0, 1, 0]


def test_trimmed_mean_cuts_floor_beta_n_at_each_end_per_coordinate():
    x = np.array([[1, 10], [2, -50], [3, 20], [100, 30], [-100, 40]], np.float64)
    out = rules.trimmed_mean(x, 0.2)  # floor(0.2 * 5) = 1 cut at each end
    assert out.aggregate.tolist() == [2.0, 20.0]
    # kept = the share of coordinates the client entered
    assert out.kept.tolist() == [1.0, 0.5, 1.0, 0.5, 0.0]
    assert rules.trimmed_mean(x, 0.19).aggregate.tolist() == x.mean(0).tolist()  # floor: 0


def test_krum_and_multi_krum_pick_the_cluster():
    x = col(0.0, 0.1, -0.1, 0.2, 10.0)  # f = 1: n = 5 > 2f + 2
    # scores over n - f - 2 = 2 nearest: 0.0 → 0.01 + 0.01 = 0.02 (the lowest)
    out = rules.krum(x, 1)
    assert out.aggregate.tolist() == [0.0] and out.kept.tolist() == [1, 0, 0, 0, 0]
    out = rules.multi_krum(x, 1)  # m = n - f = 4: the mean of the cluster
    assert out.aggregate[0] == pytest.approx(0.05) and out.kept.tolist() == [1, 1, 1, 1, 0]
    assert rules.multi_krum(x, 1, 2).aggregate[0] == pytest.approx(0.05)  # 0.0 and 0.1


def test_bulyan_iterated_krum_then_the_beta_closest_to_the_median():
    """n = 7, f = 1 on a line: Krum picks 2, 3, 1, 4, 0 (ties to the lower id; the last
    rounds count one neighbour), θ = 5; the β = 3 values closest to their median 2 are
    1, 2, 3: the aggregate is 2 and the outlier is out."""
    out = rules.bulyan(col(0, 1, 2, 3, 4, 5, 100), 1)
    assert out.aggregate.tolist() == [2.0]
    assert out.kept[5] == 0 and out.kept[6] == 0 and out.kept[0] == 0


def test_norm_bound_and_centered_clipping():
    x = np.array([[3.0, 4.0], [0.0, 1.0]])
    out = rules.norm_bound(x, 1.0)
    assert np.allclose(out.aggregate, [0.3, 0.9]) and out.kept.tolist() == [0.2, 1.0]
    assert np.allclose(rules.norm_bound(x, 1.0, np.array([1.0, 3.0])).aggregate, [0.15, 0.95])
    cc = rules.centered_clip(np.array([[3.0, 4.0], [0.0, 0.0]]), 1.0, 1, None)
    assert np.allclose(cc.aggregate, [0.3, 0.4]) and cc.kept.tolist() == [0.2, 1.0]
    # two iterations from a start: v ← v + mean clip(x − v)
    v = np.array([1.0, 0.0])
    for _ in range(2):
        z = np.array([[3.0, 4.0], [0.0, 0.0]]) - v
        v = v + (z * np.minimum(1, 1 / np.linalg.norm(z, axis=1))[:, None]).mean(0)
    got = rules.centered_clip(np.array([[3.0, 4.0], [0.0, 0.0]]), 1.0, 2, np.array([1.0, 0]))
    assert np.allclose(got.aggregate, v)


@pytest.mark.parametrize("rule, n, f, ok", [
    ("krum", 5, 1, True), ("krum", 4, 1, False), ("multi_krum", 6, 2, False),
    ("bulyan", 7, 1, True), ("bulyan", 6, 1, False), ("bulyan", 11, 2, True),
])
def test_each_rule_states_its_assumption(rule, n, f, ok):
    why = rules.requirement(rule, n, f)
    assert (why is None) == ok
    x = np.random.default_rng(0).normal(size=(n, 3))
    if not ok:
        with pytest.raises(ValueError, match=rule):
            getattr(rules, rule)(x, f)


def test_the_rule_object_keeps_tensor_shapes_and_reports_each_client():
    cfg = RobustConfig(rule="multi_krum", f=1)
    rule = RobustRule(cfg)
    ups = [(c, 10, {"w": np.full((2, 2), v, np.float32), "b": np.array([v], np.float32)})
           for c, v in zip([3, 5, 8, 9, 11], [0.0, 0.1, -0.1, 0.2, 10.0], strict=True)]
    state, metrics = rule.combine(ups, weighted=True)
    assert state["w"].shape == (2, 2) and state["w"].dtype == np.float64
    assert np.allclose(state["w"], 0.05) and np.allclose(state["b"], 0.05)
    assert metrics["robust_excluded"] == 1.0
    assert metrics["per_client"][11] == {"robust_kept": 0.0}
    assert metrics["per_client"][3] == {"robust_kept": 1.0}


def test_a_round_with_too_few_reporters_is_skipped_not_fudged():
    """A fleet can leave fewer reporters than the rule needs: the model and the server
    optimizer stay, the round says so, every reporter's weight is 0."""
    from fedray.methods.fedavg.policy import FedAvgPolicy

    policy = FedAvgPolicy(robust=RobustRule(RobustConfig(rule="krum", f=1)))
    g = {"w": np.zeros(2, np.float32)}
    ups = [(c, 5, {"w": np.full(2, c, np.float32)}) for c in range(4)]  # 4 <= 2f + 2
    new, metrics = policy.aggregate(g, ups, 1)
    assert new is g and metrics["robust_skipped"] == 1.0
    assert metrics["per_client"] == {c: {"robust_kept": 0.0} for c in range(4)}
    new, metrics = policy.aggregate(g, [*ups, (4, 5, {"w": np.full(2, 1.5, np.float32)})], 1)
    assert metrics["robust_skipped"] == 0.0 and np.allclose(new["w"], 1.5)


def cfg_of(*extra):
    return load_config(None, ["clients.num_clients=6", "clients.per_round=5", *extra])


def refused(extra: list[str], path: str, rule: str) -> None:
    """``cfg_of(*extra)`` fails with one line at ``path`` stating ``rule``."""
    with pytest.raises(ConfigError) as e:
        cfg_of(*extra)
    assert e.value.path == path and rule in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("extra, path, rule", [
    (["robust.rule=krum", "robust.f=2"], "robust.f", "n > 2f + 2"),
    (["robust.rule=bulyan", "robust.f=1"], "robust.f", "n >= 4f + 3"),
    (["robust.rule=multi_krum", "robust.f=1", "robust.m=5"], "robust.m", "m <= n - f"),
    (["robust.rule=median", "runtime.reduce=executors"], "runtime.reduce", "every upload"),
    (["robust.rule=median", "algorithm.name=orders"], "robust.rule", "'robust'"),
    (["robust.rule=median", "dp.enabled=true", "dp.noise_multiplier=1.0"], "robust.rule",
     "dp.enabled"),
    (["robust.rule=trimmed_mean", "robust.trim=0.5"], "robust.trim", "< 0.5"),
])
def test_bad_robust_configs_are_one_line_before_ray(extra, path, rule):
    refused(extra, path, rule)


@pytest.mark.ray
def test_robust_fedavg_is_bitwise_across_executors_and_resume(ray_session, tiny_cfg,
                                                              tmp_path):
    """Multi-Krum (f = 1 of 6) with an executor count change, centered clipping (its carried
    aggregate in the checkpoint) across a resume; each client's weight in its row."""
    _, outputs = runs_across_executors(tiny_cfg, tmp_path, [1, 2],
                                       **{"robust.rule": "multi_krum", "robust.f": 1})
    clients = outputs[0]["clients"]
    kept = clients.groupby("round")["robust_kept"]
    assert (kept.apply(lambda k: int((k == 0).sum())) == 1).all()  # m = n - f = 5 of 6
    plain = tiny_cfg(**{"runtime.tiers": "[{name: default, executors: 1, num_cpus: 0.5}]"})
    from fedray.runtime import run_experiment

    run_experiment(plain, str(tmp_path / "plain"), progress=False)
    a, b = final_state(tmp_path / "r0"), final_state(tmp_path / "plain")
    assert any(not np.array_equal(a[k], b[k]) for k in a)  # the rule did act
    cc = tiny_cfg(**{"robust.rule": "centered_clip", "robust.tau": 0.05, "rounds": 3})
    full_and_resumed(cc, tmp_path / "cc", stop_after=2)
    x, y = final_state(tmp_path / "cc" / "full"), final_state(tmp_path / "cc" / "cut")
    assert all(np.array_equal(x[k], y[k]) for k in x)
    rows = run_outputs(tmp_path / "cc" / "full")["clients"]
    assert rows["robust_kept"].between(0, 1).all() and rows["robust_kept"].lt(1).any()
