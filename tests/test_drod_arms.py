"""The DROD paper's remaining arms, each by its defining rule: FIARSE's magnitude mask,
FjORD's self-distillation (w/ KD), Ordered Dropout over depth, ScaleFL's equal-ratio split
with self-distilled exits, Shortcut x FedAvg's fixed sub-model — and each on Ray."""

from __future__ import annotations

import numpy as np
import pytest
from test_drod import context, drod_cfg, run_clean

from fedray.core.config import ConfigError
from fedray.core.registry import build_method
from fedray.data import build_data
from fedray.methods.drod.method import data_shape, fiarse_masks, od_choices
from fedray.models.sliceable import held, held_count
from fedray.observe.metrics import read_metrics
from fedray.wire.payload import Payload


def setup(**extra):
    cfg = drod_cfg(**extra)
    data = build_data(cfg)
    alg = build_method(cfg)
    res = alg.build_resident(data.input_shape, data.num_classes, "cpu")
    return cfg, data, alg, res, alg.init_global_state(res, cfg.seed), alg.make_policy()


def first_client(cfg, tier):
    return next(c for c in range(cfg.clients.num_clients) if cfg.tier_of(c) == tier)


def test_fiarse_mask_is_the_top_magnitudes_and_follows_the_global_weights():
    w = np.array([[0.5, -2.0, 0.1], [3.0, -0.2, 0.0]], np.float32)
    m = fiarse_masks({"blocks.0.conv1.weight": w, "blocks.0.norm1.weight": w[0]}, 0.5)
    assert set(m) == {"blocks.0.conv1.weight"}  # norms and biases are never masked
    assert m["blocks.0.conv1.weight"].tolist() == [[True, True, False], [True, False, False]]
    assert fiarse_masks({"a": w}, 1.0) == {}

    cfg, data, alg, res, g, pol = setup(**{"algorithm.name": "fiarse"})
    name = "blocks.3.conv1.weight"
    sent = pol.broadcast(g, 1, "t006")
    mask = sent[name] != 0
    keep = res.keep["t006"]
    assert mask.sum() == int(np.ceil(keep * mask.size))
    # the sub-model holds ρ of the full model's parameters: unmasked tensors + kept weights
    total = sum(int(np.count_nonzero(v)) if v.ndim >= 2 else v.size for v in sent.values())
    assert total / held_count(res.arch, res.hw) == pytest.approx(0.064, rel=0.01)
    assert res.ladder.param_ratio("t006") == pytest.approx(total / held_count(res.arch, res.hw),
                                                           rel=1e-3)
    # importance follows training: a dropped weight that grows past the threshold is in
    idx = tuple(np.argwhere(~mask)[0])
    sl = tuple(slice(0, n) for n in sent[name].shape)
    g2 = {k: v.copy() for k, v in g.items()}
    g2[name][sl][idx] = 100.0
    assert pol.broadcast(g2, 2, "t006")[name][idx] == np.float32(100.0)


def test_fiarse_uploads_kept_entries_and_averages_each_over_its_holders():
    cfg, data, alg, res, g, pol = setup(**{"algorithm.name": "fiarse"})
    name = "blocks.3.conv1.weight"
    ups = []
    for tier in ("t100", "t006"):
        cid = first_client(cfg, tier)
        sent = pol.broadcast(g, 1, tier)
        out = alg.client_update(context(cfg, data, alg, cid, 1, res), sent)
        masks = fiarse_masks({k: v for k, v in sent.items()}, res.keep[tier])
        for k, m in masks.items():  # only the kept entries travel, flat
            assert out.upload[k].shape == (int(m.sum()),)
        assert np.abs(out.upload[name]).sum() > 0
        local = res.model(res.tiers[tier].geometry).state_dict()
        for k, m in masks.items():  # entries outside the mask are never trained: still 0
            assert not local[k].numpy()[~m].any(), k
        assert out.metrics["sub_param_ratio"] == pytest.approx(
            {"t100": 1.0, "t006": 0.064}[tier], rel=0.01)
        # bytes: the exact upload, smaller than the dense sub-model's
        dense = {k: v for k, v in sent.items()}
        if masks:
            assert Payload.encode(out.upload).nbytes < Payload.encode(dense).nbytes
        ups.append((cid, out.num_samples, out.upload, masks))
    new, _ = pol.aggregate(g, [u[:3] for u in ups], 1)
    (c_hi, n_hi, up_hi, _), (c_lo, n_lo, up_lo, m_lo) = ups
    lo_shape = m_lo[name].shape
    sl = tuple(slice(0, n) for n in lo_shape)
    step = new[name][sl].astype(np.float64) - g[name][sl]
    dense_lo = np.zeros(lo_shape)
    dense_lo[m_lo[name]] = up_lo[name]
    hi = up_hi[name][sl]
    want = np.where(m_lo[name], (n_hi * hi + n_lo * dense_lo) / (n_hi + n_lo), hi)
    np.testing.assert_allclose(step, want, rtol=1e-5, atol=1e-7)


def one_step_update(algorithm, tier, smaller, **extra):
    """A one-step client update of ``tier`` at a (round) whose Ordered Dropout draw is the
    ``smaller``-th sub-model of the tier's grid."""
    cfg, data, alg, res, g, pol = setup(**{"algorithm.name": algorithm,
                                           "local.max_steps": 1, **extra})
    cid = first_client(cfg, tier)
    rnd = next(r for r in range(1, 50) if od_choices(cfg.seed, r, cid, 1, 3)[0] == smaller)
    sent = pol.broadcast(g, rnd, tier)
    return alg.client_update(context(cfg, data, alg, cid, rnd, res), sent), res


def test_fjord_kd_trains_the_largest_model_even_when_a_smaller_one_is_drawn():
    plain, res = one_step_update("fjord", "t100", 0)
    kd, _ = one_step_update("fjord", "t100", 0, **{"algorithm.kd": "true"})
    small = dict(held(res.arch, res.hw, res.grid[0].geometry))
    name = "blocks.7.conv2.weight"  # last block: outside the smallest width in both axes
    sl = tuple(slice(0, n) for n in small[name])
    outside = np.ones(plain.upload[name].shape, bool)
    outside[sl] = False
    assert np.all(plain.upload[name][outside] == 0)  # w/o KD only the drawn width trains
    assert np.abs(kd.upload[name][outside]).sum() > 0  # w/ KD the tier's own model trains too
    assert not np.allclose(kd.upload[name][sl], plain.upload[name][sl])  # and distils
    # the distillation term itself acts: α and T change the drawn sub-model's update
    ce_only, _ = one_step_update("fjord", "t100", 0, **{"algorithm.kd": "true",
                                                        "algorithm.kd_alpha": 0.0})
    hot, _ = one_step_update("fjord", "t100", 0, **{"algorithm.kd": "true",
                                                    "algorithm.kd_temperature": 4.0})
    assert not np.allclose(ce_only.upload[name][sl], kd.upload[name][sl])
    assert not np.allclose(hot.upload[name][sl], kd.upload[name][sl])
    # with α = 0 the outside coordinates see only the teacher's CE: the same as with α > 0
    np.testing.assert_allclose(ce_only.upload[name][outside], kd.upload[name][outside],
                               rtol=1e-5, atol=1e-8)


def test_depth_fjord_samples_a_depth_and_trains_its_exit_head():
    out, res = one_step_update("depth_fjord", "t100", 0, **{"model.exits": "true"})
    depth = res.grid[0].geometry.depth
    assert res.depths["t100"] == tuple(r.geometry.depth for r in res.grid[:-1])
    head = f"exits.{res.arch.stage_of[depth - 1]}.weight"
    assert head in out.upload and np.abs(out.upload[head]).sum() > 0  # the drawn exit trains
    assert np.all(out.upload[f"blocks.{depth}.conv1.weight"] == 0)  # blocks past it do not
    assert np.all(out.upload["fc.weight"] == 0)


def test_scalefl_cuts_width_and_depth_at_one_ratio_and_trains_every_exit():
    cfg, data, alg, res, g, pol = setup(**{"algorithm.name": "scalefl", "model.exits": "true",
                                           "local.max_steps": 1})
    for tier, rho in (("t025", 0.251), ("t006", 0.064)):
        r = res.tiers[tier]
        assert r.s == pytest.approx(rho ** (1 / 3), abs=1 / 64)
        assert r.geometry.depth == round(rho ** (1 / 3) * res.arch.num_blocks)
    assert res.depths["t100"] == (res.tiers["t006"].geometry.depth,
                                  res.tiers["t025"].geometry.depth)
    cid = first_client(cfg, "t100")
    out = alg.client_update(context(cfg, data, alg, cid, 1, res), pol.broadcast(g, 1, "t100"))
    exits = [f"exits.{res.arch.stage_of[d - 1]}.weight" for d in res.depths["t100"]]
    for k in [*exits, "fc.weight"]:  # the final head and every early exit learn
        assert np.abs(out.upload[k]).sum() > 0, k
    # self-distillation acts on the early exits: α changes them
    cfg0, data0, alg0, res0, g0, pol0 = setup(**{"algorithm.name": "scalefl",
                                                 "model.exits": "true", "local.max_steps": 1,
                                                 "algorithm.kd_alpha": 0.0})
    ce = alg0.client_update(context(cfg0, data0, alg0, cid, 1, res0),
                            pol0.broadcast(g0, 1, "t100"))
    assert not np.allclose(ce.upload[exits[0]], out.upload[exits[0]])


def test_shortcut_fedavg_trains_only_its_fixed_sub_model():
    cfg, data, alg, res, g, pol = setup(**{"algorithm.name": "shortcut_fedavg"})
    for tier in ("t025", "t006"):
        cid = first_client(cfg, tier)
        out = alg.client_update(context(cfg, data, alg, cid, 1, res), pol.broadcast(g, 1, tier))
        assert out.metrics["sub_param_ratio"] == pytest.approx(res.tiers[tier].param_ratio)
        assert set(out.upload) == dict(held(res.arch, res.hw, res.tiers[tier].geometry)).keys()


@pytest.mark.parametrize("algorithm,method,extra", [
    ("scalefl", "bic", {"model.exits": "true"}),
    ("depth_fjord", "ewc", {"model.exits": "true", "algorithm.kd": "true"}),
    ("fiarse", "derpp", {}), ("fiarse", "ewc", {})])
def test_new_arms_under_every_continual_objective(algorithm, method, extra):
    """Across the task boundary (rounds 1–4, task 1 from round 3), one client per tier,
    its state threaded: every update finite, BiC/EWC/DER++ state where it belongs."""
    cfg, data, alg, res, g, pol = setup(**{"algorithm.name": algorithm,
                                           "continual.method": method,
                                           "local.max_steps": 2, **extra})
    for tier in ("t100", "t006"):
        cid, state = first_client(cfg, tier), None
        for rnd in range(1, 5):
            out = alg.client_update(context(cfg, data, alg, cid, rnd, res, state),
                                    pol.broadcast(g, rnd, tier))
            state = out.state
            assert all(np.isfinite(v).all() for v in out.upload.values())
        if method == "ewc":
            assert "fisher" in state and state["anchor_task"] == 1
            for k, m in (fiarse_masks(pol.broadcast(g, 2, tier), res.keep[tier]).items()
                         if res.keep else []):
                assert not state["fisher"][k][~m].any()  # no pull outside the mask
        if method == "bic":
            assert "bic_alpha" in out.metrics
        if method == "derpp":
            assert len(state["buffer"]["y"]) > 0


def test_bad_arm_configs_name_their_key():
    with pytest.raises(ConfigError, match="algorithm.kd"):
        drod_cfg(**{"algorithm.name": "heterofl", "algorithm.kd": "true"})
    with pytest.raises(ConfigError, match="model.exits"):
        drod_cfg(**{"algorithm.name": "scalefl"})
    with pytest.raises(ConfigError, match="algorithm.rule"):
        drod_cfg(**{"algorithm.name": "scalefl", "model.exits": "true",
                    "algorithm.rule": "od"})
    with pytest.raises(ConfigError, match="algorithm.fiarse_share"):
        drod_cfg(**{"algorithm.name": "fiarse", "algorithm.fiarse_share": 1.0})


@pytest.mark.ray
@pytest.mark.parametrize("algorithm,extra", [
    ("fiarse", {"algorithm.axis": "shortcut"}),
    ("scalefl", {"model.exits": "true"}),
    ("depth_fjord", {"model.exits": "true", "algorithm.kd": "true"}),
    ("shortcut_fedavg", {})])
def test_new_arms_run_on_ray_with_exact_bytes(ray_session, tmp_path, algorithm, extra):
    cfg = drod_cfg(**{"algorithm.name": algorithm, "continual.method": "er", **extra})
    clients, g = run_clean(cfg, tmp_path / "run")
    pol = build_method(cfg).make_policy()
    res = build_method(cfg).build_resident(*data_shape(cfg), "cpu")
    for tier in ("t100", "t025", "t006"):  # the download is the tier's broadcast, exactly
        mine = clients[clients["tier"] == tier]
        sent = pol.broadcast(g, 4, tier)
        assert (mine["download_bytes"] == Payload.encode(sent).nbytes).all(), tier
        # the upload: the sub-model's update, FIARSE's masked tensors as their kept entries
        masks = fiarse_masks(sent, res.keep[tier]) if res.keep else {}
        up = {k: np.zeros(int(masks[k].sum()) if k in masks else v.shape, np.float32)
              for k, v in sent.items()}
        assert (mine["upload_bytes"] == Payload.encode(up).nbytes).all(), tier
    rounds = read_metrics(str(tmp_path / "run")).to_pandas()
    assert 0 <= rounds["global_accuracy"].iloc[-1] <= 1
