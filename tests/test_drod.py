"""DROD and the sub-model baselines end to end: client updates, tiers on Ray, bytes per tier,
determinism across executor counts, resume with replay buffers, every CL objective."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import full_and_resumed, run_job

from fedray.core import checkpoint
from fedray.core.config import ConfigError, load_config
from fedray.core.registry import build_method
from fedray.core.storage import Storage
from fedray.data import build_data
from fedray.methods.base import ClientContext
from fedray.methods.drod.method import balanced_split, od_choices
from fedray.models.sliceable import held
from fedray.observe.metrics import read_metrics
from fedray.runtime import run_experiment
from fedray.wire.payload import Payload

TIERS = ("[{name: t100, executors: 1, num_cpus: 0.25, capacity: 1.0},"
         " {name: t025, executors: 1, num_cpus: 0.25, capacity: 0.251},"
         " {name: t006, executors: 1, num_cpus: 0.25, capacity: 0.064}]")


def drod_cfg(**extra):
    base = {"name": "drod-test", "rounds": 4, "seed": 3, "clients.num_clients": 6,
            "data.partition": "dirichlet", "data.alpha": 0.5, "data.local_test_fraction": 0.2,
            "model.name": "sliceable_resnet18", "model.width": 8,
            "algorithm.name": "drod", "local.batch_size": 8, "local.epochs": 1,
            "local.lr": 0.05, "continual.tasks": 2, "continual.rounds_per_task": 2,
            "continual.class_order": "[0,1,2,3,4,5,6,7,8,9]", "continual.buffer_total": 30,
            "eval.every": 2, "eval.clients": "none", "runtime.tiers": TIERS,
            "runtime.placement_timeout_s": 60}
    base.update(extra)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def final_state(run_dir):
    return checkpoint.read(Storage(str(run_dir)))["server"]["params"]


def context(cfg, data, alg, cid, round, resident, state=None):
    x, y = data.client_arrays(cid, round)
    xt, yt = data.client_arrays(cid, round, "test")
    return ClientContext(cid, round, cfg.seed, cfg.tier_of(cid), x, y, xt, yt, resident,
                         state=state)


def test_client_update_trains_nested_sub_models_deterministically():
    cfg = drod_cfg()
    data = build_data(cfg)
    alg = build_method(cfg)
    res = alg.build_resident(data.input_shape, data.num_classes, "cpu")
    g = alg.init_global_state(res, cfg.seed)
    pol = alg.make_policy()
    for cid in (0, 1, 2):
        tier = cfg.tier_of(cid)
        sent = pol.broadcast(g, 1, tier)
        out = alg.client_update(context(cfg, data, alg, cid, 1, res), sent)
        names = dict(held(res.arch, res.hw, res.tiers[tier].geometry))
        assert set(out.upload) == set(names)  # only the tier's sub-model travels
        assert all(out.upload[k].shape == s for k, s in names.items())
        again = alg.client_update(context(cfg, data, alg, cid, 1, res), sent)
        assert all(np.array_equal(out.upload[k], again.upload[k]) for k in out.upload)
        nested = [r for r in res.grid if r.geometry.within(res.tiers[tier].geometry)]
        own = res.tiers[tier]
        assert all(r.s <= own.s and r.s * r.b <= own.s * own.b + 1e-12 for r in nested)
        assert len(nested) == {"t100": 3, "t025": 2, "t006": 1}[tier]
        steps = int(out.metrics["steps"])
        picks = od_choices(cfg.seed, 1, cid, steps, len(nested))
        assert out.metrics["sub_param_ratio"] == pytest.approx(
            np.mean([nested[i].param_ratio for i in picks]))
        assert len(out.state["buffer"]["y"]) == 5 and out.state["buffer"]["n"] == 5
    # a lower tier's whole sub-model is the prefix of the broadcast of a higher tier
    hi, lo = pol.broadcast(g, 1, "t100"), pol.broadcast(g, 1, "t006")
    for k, v in lo.items():
        assert np.array_equal(v, hi[k][tuple(slice(0, n) for n in v.shape)])


def test_ordered_dropout_draws_depend_on_round_client_and_step_only():
    a = od_choices(0, 3, 1, 200, 3)
    assert np.array_equal(a, od_choices(0, 3, 1, 200, 3))
    assert np.array_equal(a[:50], od_choices(0, 3, 1, 50, 3))  # step t: same draw
    assert not np.array_equal(a, od_choices(0, 4, 1, 200, 3))
    assert not np.array_equal(a, od_choices(0, 3, 2, 200, 3))
    counts = np.bincount(a, minlength=3)
    assert counts.min() > 40  # uniform over the nested sub-models


@pytest.mark.parametrize("algorithm, extra, small", [
    ("shortcut_fjord", {}, 0.5),  # the small tier's blocks 5 and 7 are identities, s = 1
    ("depth_fedavg", {"model.exits": "true"}, 0.6),  # cut inside the last stage: fc kept
])
def test_tier_of_state_needs_the_exact_key_set_not_a_subset(algorithm, extra, small):
    """Tiers listed small to large, the small tier's tensors a same-shaped subset of the full
    model's: the full broadcast must still be read (and evaluated) as the full tier."""
    import torch

    from fedray.methods.drod.method import data_shape
    from fedray.models.sliceable import SliceableResNet
    from fedray.models.training import set_state

    tiers = (f"[{{name: small, executors: 1, num_cpus: 0.25, capacity: {small}}},"
             " {name: full, executors: 1, num_cpus: 0.25, capacity: 1.0}]")
    cfg = drod_cfg(**{"algorithm.name": algorithm, "runtime.tiers": tiers, **extra})
    alg = build_method(cfg)
    shape, classes = data_shape(cfg)
    res = alg.build_resident(shape, classes, "cpu")
    held_small = dict(held(res.arch, res.hw, res.tiers["small"].geometry))
    held_full = dict(held(res.arch, res.hw, res.tiers["full"].geometry))
    assert set(held_small) < set(held_full)  # the ladder this bug needs
    assert all(held_full[k] == s for k, s in held_small.items())
    g = alg.init_global_state(res, cfg.seed)
    pol = alg.make_policy()
    for tier in ("small", "full"):
        sent = pol.broadcast(g, 1, tier)
        assert res.tier_of_state({k: v for k, v in sent.items()
                                  if not k.startswith("bic.")}) == tier
    with pytest.raises(ValueError, match="no tier"):  # neither tier's exact key set
        res.tier_of_state({k: v for k, v in pol.broadcast(g, 1, "full").items()
                           if k in held_small and k != next(iter(held_small))})
    # the full broadcast is scored by the full model, not by the small tier's sub-model
    sent = pol.broadcast(g, 1, "full")
    x = np.random.default_rng(0).standard_normal((4, *shape)).astype(np.float32)
    full = SliceableResNet(res.arch, res.hw, res.tiers["full"].geometry, all_heads=False)
    set_state(full, sent)
    full.eval()
    with torch.no_grad():
        want = full(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(alg.logits(res, sent, x), want, rtol=1e-5, atol=1e-5)


def run_client_rounds(method, rounds, **extra):
    """Rounds 1..rounds of client 0 (tier t100) alone, carrying its state, the server
    applying its update each round; returns [(broadcast, output)] per round."""
    cfg = drod_cfg(**{"continual.method": method, **extra})
    data = build_data(cfg)
    alg = build_method(cfg)
    res = alg.build_resident(data.input_shape, data.num_classes, "cpu")
    g = alg.init_global_state(res, cfg.seed)
    pol = alg.make_policy()
    state, out = None, []
    for r in range(1, rounds + 1):
        sent = pol.broadcast(g, r, "t100")
        o = alg.client_update(context(cfg, data, alg, 0, r, res, state), sent)
        g, _ = pol.aggregate(g, [(0, o.num_samples, o.upload)], r)
        state = o.state
        out.append((sent, o))
    return out


def test_task_boundaries_of_ewc_bic_and_derpp():
    """2 tasks x 2 rounds: EWC's Fisher is estimated at round 2 on the broadcast weights
    and its anchor is round 3's broadcast (the model that finished task 0); BiC's teacher
    likewise, and its correction is fitted once, at task 1's last round, for task 1's
    classes only; DER++ stores logits for every exemplar."""
    ewc = run_client_rounds("ewc", 4)
    assert "fisher" not in ewc[0][1].state and "fisher" in ewc[1][1].state
    sent3, out3 = ewc[2]
    assert out3.state["anchor_task"] == 1
    assert all(np.array_equal(out3.state["anchor"][k], sent3[k]) for k in sent3)
    assert all((v >= 0).all() for v in out3.state["fisher"].values())
    assert sum(float(v.sum()) for v in out3.state["fisher"].values()) > 0
    bic = run_client_rounds("bic", 4)
    assert [("bic_alpha" in o.metrics) for _, o in bic] == [False, False, False, True]
    up = bic[3][1].upload
    assert not up["bic.scale"][:5].any() and up["bic.scale"][5:].any()
    assert np.array_equal(bic[2][1].state["anchor"]["fc.weight"], bic[2][0]["fc.weight"])
    derpp = run_client_rounds("derpp", 1)
    buf = derpp[0][1].state["buffer"]
    assert buf["logits"].shape == (5, 10) and np.abs(buf["logits"][:buf["n"]]).sum() > 0


def test_bic_validation_split_is_class_balanced():
    from fedray.methods.drod.continual.buffer import ReservoirBuffer

    gen = np.random.default_rng(0)
    buf = ReservoirBuffer(12)
    yb = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    buf.add(np.arange(12.0)[:, None], yb, gen)
    x, y = balanced_split(np.zeros((7, 1)), np.array([2, 2, 3, 3, 3, 3, 2]), buf,
                          np.array([0, 1]), gen)
    assert sorted(np.unique(y, return_counts=True)[1]) == [2, 2, 2, 2]  # old 0, 1; new 2, 3
    assert balanced_split(np.zeros((2, 1)), np.array([2, 3]), None, np.array([0]),
                          gen)[1].size == 0  # no old exemplars: nothing to balance


def test_bad_drod_configs_fail_before_any_ray_work():
    with pytest.raises(ConfigError, match="algorithm.theta"):
        drod_cfg(**{"algorithm.theta": 1.5})
    with pytest.raises(ConfigError, match="capacity"):
        drod_cfg(**{"runtime.tiers": "[{name: a, capacity: 0.0}]"})
    with pytest.raises(ConfigError, match="clients.tiers"):
        drod_cfg(**{"clients.tiers": "[t100, t100, t025, nope, t006, t006]"})
    with pytest.raises(ConfigError, match="model.name"):
        drod_cfg(**{"model.name": "resnet18"})
    with pytest.raises(ConfigError, match="model.exits"):
        drod_cfg(**{"algorithm.name": "depth_fedavg"})
    with pytest.raises(ConfigError, match="algorithm.rule"):
        drod_cfg(**{"algorithm.rule": "rolling"})
    with pytest.raises(ConfigError, match="grid"):
        drod_cfg(**{"algorithm.grid": "[0.5, 0]"})


@pytest.mark.ray
def test_three_tiers_on_ray_bytes_per_tier_and_per_task_scores(ray_session, tmp_path):
    cfg = drod_cfg()
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    rounds = read_metrics(str(tmp_path / "run")).to_pandas()
    clients = read_metrics(str(tmp_path / "run"), "clients").to_pandas()
    assert (clients["status"] == "ok").all()
    alg = build_method(cfg)
    g = final_state(tmp_path / "run")
    pol = alg.make_policy()
    sizes = {}
    for tier in ("t100", "t025", "t006"):
        want = Payload.encode(pol.broadcast(g, 4, tier)).nbytes
        mine = clients[clients["tier"] == tier]
        assert (mine["upload_bytes"] == want).all() and (mine["download_bytes"] == want).all()
        assert (rounds[f"tier/{tier}/upload_bytes"] == want * len(mine) / 4).all()
        sizes[tier] = want
        last = rounds[rounds["round"] == 4].iloc[0]
        for t in (0, 1):
            for kind in ("class_il", "task_il"):
                assert 0 <= last[f"tier/{tier}/task{t}/{kind}"] <= 1
    assert sizes["t100"] > 3 * sizes["t025"]
    assert sizes["t025"] > 3 * sizes["t006"]
    fleet = np.mean([rounds[f"tier/{t}/accuracy"].iloc[-1] for t in ("t100", "t025", "t006")])
    assert rounds["global_accuracy"].iloc[-1] == pytest.approx(fleet)


@pytest.mark.ray
def test_same_result_with_any_executor_count_and_after_resume(ray_session, tmp_path):
    cfg = drod_cfg(rounds=4)
    two = drod_cfg(**{"runtime.tiers": TIERS.replace("executors: 1, num_cpus: 0.25, "
                                                     "capacity: 1.0",
                                                     "executors: 2, num_cpus: 0.25, "
                                                     "capacity: 1.0")})
    full, _ = full_and_resumed(cfg, tmp_path, stop_after=3)
    run_experiment(two, str(tmp_path / "two"), progress=False)
    a, b, c = (final_state(tmp_path / d) for d in ("full", "cut", "two"))
    for k in a:
        assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]), k


def run_clean(cfg, run_dir):
    """Run ``cfg`` on Ray into ``run_dir``; every client ok and the final state finite.
    Returns (the clients' metrics, the final global state)."""
    summary = run_experiment(cfg, str(run_dir), progress=False)
    assert summary["client_failures"] == 0
    clients = read_metrics(str(run_dir), "clients").to_pandas()
    assert (clients["status"] == "ok").all()
    g = final_state(run_dir)
    assert all(np.isfinite(v).all() for v in g.values())
    return clients, g


@pytest.mark.ray
@pytest.mark.parametrize("algorithm,method", [
    ("drod", "bic"), ("fjord", "derpp"), ("depth_fedavg", "ewc"), ("fedrolex", "er"),
    ("shortcut_fjord", "none"), ("heterofl", "er")])
def test_every_method_and_objective_runs_on_ray(ray_session, tmp_path, algorithm, method):
    extra = {"algorithm.name": algorithm, "continual.method": method, "rounds": 4}
    if algorithm == "depth_fedavg":
        extra["model.exits"] = "true"
    cfg = drod_cfg(**extra)
    clients, g = run_clean(cfg, tmp_path / "run")
    if method == "bic":
        fitted = clients.groupby("round")["bic_alpha"].apply(lambda v: v.notna().all())
        assert fitted.tolist() == [False, False, False, True]  # once, at task 1's end
        assert not np.allclose(g["bic.scale"][5:], 1.0)  # task 1's classes corrected
        assert np.allclose(g["bic.scale"][:5], 1.0)


@pytest.mark.ray
def test_drod_split_cifar100_job_smoke(ray_session, tmp_path):
    summary = run_job(ray_session, "drod_split_cifar100.py", "--smoke", "--run-dir",
                      str(tmp_path / "job"))
    assert summary["algorithm"] == "drod" and summary["rounds"] == 5
    cl = summary["continual"]
    assert set(cl) == {"t100", "t025", "t006", "fleet"}
    assert cl["t006"]["tasks_completed"] == 5
    assert cl["fleet"]["class_il_acc"] == pytest.approx(
        np.mean([cl[t]["class_il_acc"] for t in ("t100", "t025", "t006")]))
