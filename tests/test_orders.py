"""ORDERS policy core against a straightforward independent reference (literal loops over
the text's formula), plus identities, extensions and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedray.core.config import ConfigError, build_dataclass, load_config
from fedray.methods.orders.policy import (
    OrdersParams,
    OrdersPolicy,
    OrdersState,
    orders_step,
    rank_coefficients,
    rank_weights,
)


def reference_round(prev, deltas, ids, rnd, mem, p):
    """The text, literally: python lists, sorted(), the difference sum term by term."""
    entries = []
    for d, cid in zip(deltas, ids, strict=True):
        if p["norm"] == "l1":
            n = sum(abs(float(v)) for v in d)
        else:
            n = math.sqrt(sum(float(v) * float(v) for v in d))
        n = max(n, p["min_norm"])
        hist = mem["norms"].setdefault(cid, [])
        hist.append(n)
        while len(hist) > p["window"]:
            hist.pop(0)
        rounds = [r for r in mem["rounds"].get(cid, []) if r > rnd - p["horizon"]] + [rnd]
        mem["rounds"][cid] = rounds
        thr = min(p["threshold"], rnd) if p["ramp"] else p["threshold"]
        if len(rounds) >= thr:
            entries.append((sum(hist) / len(hist), cid, d))
    entries.sort(key=lambda e: (-e[0], e[1]))
    big_n = len(entries)
    total = [0.0] * len(prev)
    for k in range(1, big_n + 1):
        if p["weighting"] == "inverse":
            w = 1.0 / k
        elif p["weighting"] == "smoothed_inverse":
            w = 1.0 / (k + p["alpha"])
        else:
            gamma = p["gamma"] if p["gamma"] is not None else big_n / 3.0
            w = 1.0 / (1.0 + math.exp(p["beta"] * (k - gamma)))
        if k <= p["freeze"]:
            w = 0.0
        cur = entries[k - 1][2]
        nxt = entries[k][2] if k < big_n else [0.0] * len(prev)
        for j in range(len(prev)):
            total[j] += w * (float(cur[j]) - float(nxt[j]))
    return [float(a) + b for a, b in zip(prev, total, strict=True)], [e[1] for e in entries]


CASES = [
    dict(weighting="sigmoid", beta=0.5, gamma=None, alpha=10.0, window=3, threshold=2,
         horizon=5, ramp=True, freeze=0, norm="l2", min_norm=1e-6),
    dict(weighting="inverse", beta=0.5, gamma=None, alpha=10.0, window=1, threshold=1,
         horizon=1, ramp=False, freeze=0, norm="l2", min_norm=1e-6),
    dict(weighting="smoothed_inverse", beta=0.5, gamma=None, alpha=3.0, window=2, threshold=3,
         horizon=4, ramp=True, freeze=1, norm="l1", min_norm=1e-6),
    dict(weighting="sigmoid", beta=0.3, gamma=2.0, alpha=10.0, window=5, threshold=2,
         horizon=3, ramp=False, freeze=2, norm="l2", min_norm=1e-6),
]


@pytest.mark.parametrize("case", CASES, ids=[c["weighting"] + str(i) for i, c in
                                              enumerate(CASES)])
def test_matches_reference_over_rounds(case):
    gen = np.random.default_rng(3)
    p = OrdersParams(weighting=case["weighting"], beta=case["beta"], gamma=case["gamma"],
                     offset=case["alpha"], smoothing_window=case["window"],
                     participation_threshold=case["threshold"],
                     participation_horizon=case["horizon"],
                     warmup="ramp" if case["ramp"] else "none", freeze_top=case["freeze"],
                     norm=case["norm"])
    num, dim = 9, 13
    prev = gen.normal(size=dim).astype(np.float32)
    ref_prev = [float(v) for v in prev]
    state, mem = OrdersState(), {"norms": {}, "rounds": {}}
    for rnd in range(1, 8):
        ids = np.sort(gen.choice(num, size=int(gen.integers(3, num + 1)), replace=False))
        deltas = (gen.normal(size=(ids.size, dim)) * gen.uniform(0.1, 2, size=(ids.size, 1))
                  ).astype(np.float32)
        if rnd == 4:
            deltas[1] = deltas[0]
            deltas[2] = -deltas[0]  # equal norms: tie broken by client id
        new, state, diag = orders_step(prev, deltas, ids, rnd, state, p)
        ref_new, ref_order = reference_round(ref_prev, deltas, ids.tolist(), rnd, mem, case)
        assert np.allclose(new, np.array(ref_new, dtype=np.float32), atol=2e-5)
        ranks = {cid: d["orders/rank"] for cid, d in diag["per_client"].items()}
        assert [c for c, _ in sorted(((c, r) for c, r in ranks.items() if not math.isnan(r)),
                                     key=lambda t: t[1])] == ref_order
        prev, ref_prev = new, [float(v) for v in new]


def test_telescoped_identity_and_negative_coefficients():
    gen = np.random.default_rng(0)
    d = gen.normal(size=(6, 5))
    for scheme in ["sigmoid", "inverse", "smoothed_inverse"]:
        w = rank_weights(6, OrdersParams(weighting=scheme))
        diff = sum(w[k] * (d[k] - (d[k + 1] if k < 5 else 0)) for k in range(6))
        c = rank_coefficients(w, "difference")
        assert np.allclose(c @ d, diff)
        assert math.isclose(c.sum(), w[-1])
        assert (c[1:] < 0).all()
        m = rank_coefficients(w, "rank_mean")
        assert (m >= 0).all() and math.isclose(m.sum(), 1.0)


def test_round_one_warmup_rule():
    p_ramp = OrdersParams()
    p_literal = OrdersParams(warmup="none")
    prev = np.zeros(4, np.float32)
    d = np.eye(3, 4, dtype=np.float32)
    ids = np.array([0, 1, 2])
    moved, _, diag = orders_step(prev, d, ids, 1, OrdersState(), p_ramp)
    assert diag["ranked"] == 3 and np.abs(moved).sum() > 0
    still, state, diag = orders_step(prev, d, ids, 1, OrdersState(), p_literal)
    assert diag["ranked"] == 0 and np.array_equal(still, prev)
    _, _, diag = orders_step(prev, d, ids, 2, state, p_literal)
    assert diag["ranked"] == 3


def test_participation_excludes_from_aggregate():
    p = OrdersParams(weighting="inverse", participation_threshold=2, participation_horizon=2,
                     warmup="none")
    prev = np.zeros(3, np.float32)
    state = OrdersState()
    _, state, _ = orders_step(prev, np.ones((1, 3), np.float32), np.array([0]), 1, state, p)
    d = np.array([[1, 0, 0], [0, 5, 0]], np.float32)
    new, _, diag = orders_step(prev, d, np.array([0, 1]), 2, state, p)
    assert diag["per_client"][1]["orders/eligible"] == 0.0
    assert np.allclose(new, [1, 0, 0])


def test_norm_variants_and_client_reported_norms():
    gen = np.random.default_rng(1)
    prev = gen.normal(size=8).astype(np.float32)
    d = gen.normal(size=(4, 8)).astype(np.float32)
    ids = np.arange(4)
    base = OrdersParams(warmup="ramp")
    _, _, a = orders_step(prev, d, ids, 1, OrdersState(), base)
    _, _, b = orders_step(prev, d, ids, 1, OrdersState(), base,
                          norms=np.linalg.norm(d, axis=1))
    assert [a["per_client"][i]["orders/rank"] for i in ids] == \
        [b["per_client"][i]["orders/rank"] for i in ids]
    _, _, n = orders_step(prev, d, ids, 1, OrdersState(), OrdersParams(norm="normalized"))
    assert math.isclose(n["per_client"][0]["orders/norm"],
                        np.linalg.norm(d[0]) / np.linalg.norm(prev), rel_tol=1e-5)
    mask = np.zeros(8, bool)
    mask[-3:] = True
    _, _, k = orders_step(prev, d, ids, 1, OrdersState(), OrdersParams(norm="key_layer"),
                          key_mask=mask)
    assert math.isclose(k["per_client"][2]["orders/norm"], np.linalg.norm(d[2, -3:]),
                        rel_tol=1e-5)
    _, _, z = orders_step(prev, np.zeros_like(d), ids, 1, OrdersState(), base)
    assert z["per_client"][0]["orders/norm"] == base.min_norm


def _near_tie(seed=0, dim=1000):
    """Two float32 updates equal but for one entry moved by one float32 ulp: their L2 norms
    differ by ~1e-9 relative — under float32 resolution (a float32 sum ties them), well
    over float64's. Returns the rows (smaller first) and their exactly rounded norms."""
    d = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    big = d.copy()
    j = int(np.argmax(np.abs(d)))
    big[j] = np.nextafter(d[j], np.float32(np.sign(d[j]) * np.inf))
    exact = [math.sqrt(math.fsum(float(v) ** 2 for v in r)) for r in (d, big)]
    assert exact[0] < exact[1] and (exact[1] - exact[0]) / exact[0] < 1e-8
    return d, big, exact


@pytest.mark.parametrize("big_first", [True, False])
def test_norms_closer_than_float32_are_ranked_by_true_norm(big_first):
    """Whatever the ids, the larger true norm ranks first — not a float32 tie broken by id —
    both when the server computes the norms and when clients report them on the wire."""
    small, big, exact = _near_tie()
    ids = np.array([3, 8])
    rows = [big, small] if big_first else [small, big]
    big_id, small_id = (3, 8) if big_first else (8, 3)
    deltas = np.stack(rows)
    prev = np.zeros(small.size, np.float32)
    p = OrdersParams(weighting="inverse")
    _, _, diag = orders_step(prev, deltas, ids, 1, OrdersState(), p)
    pc = diag["per_client"]
    assert pc[big_id]["orders/rank"] == 1.0 and pc[small_id]["orders/rank"] == 2.0
    assert math.isclose(pc[big_id]["orders/norm"], exact[1], rel_tol=1e-14)
    assert math.isclose(pc[small_id]["orders/norm"], exact[0], rel_tol=1e-14)
    # client-reported norms, encoded as the ORDERS client uploads them, through the payload
    from fedray.methods.orders.policy import encode_norm, update_norms
    from fedray.wire.payload import Payload

    for codec in ("fp32", "bf16", "int8"):
        ups = []
        for cid, row in zip(ids.tolist(), rows, strict=True):
            norm = update_norms(row[None, :], p, prev)[0]
            sent = Payload.encode({"w": row, "orders.norm": encode_norm(norm)}, codec)
            ups.append((cid, 1, sent.decode()))
        _, diag = OrdersPolicy(p, seed=0).aggregate({"w": prev}, ups, 1)
        pc = diag["per_client"]
        assert pc[big_id]["orders/rank"] == 1.0, codec
        assert pc[big_id]["orders/norm"] > pc[small_id]["orders/norm"], codec
        assert math.isclose(pc[big_id]["orders/norm"], exact[1], rel_tol=1e-14), codec


def test_client_reported_norm_travels_in_float64():
    """The ORDERS client's norm reaches the policy as the float64 norm of its float32 update,
    under every upload codec, for 8 bytes on the wire (no Ray: a real tiny client update)."""
    from fedray.core.registry import build_method
    from fedray.data import build_federated
    from fedray.methods.base import ClientContext
    from fedray.wire.payload import CODECS, Payload

    cfg = load_config(None, ["algorithm.name=orders", "clients.num_clients=4",
                             "model.hidden=[16]", "local.epochs=1"])
    alg = build_method(cfg)
    data = build_federated(cfg.data, 4, cfg.seed)
    res = alg.build_resident(data.input_shape, data.num_classes, "cpu")
    x, y = data.client_arrays(0, 1, "train")
    xt, yt = data.client_arrays(0, 1, "test")
    g = alg.init_global_state(res, cfg.seed)
    out = alg.client_update(ClientContext(0, 1, cfg.seed, "default", x, y, xt, yt, res), g)
    delta = np.concatenate([out.upload[k].reshape(-1) for k in g])
    exact = math.sqrt(math.fsum(float(v) ** 2 for v in delta))
    assert math.isclose(out.metrics["update_norm"], exact, rel_tol=1e-14)
    for codec in CODECS:
        one = Payload.encode({"orders.norm": out.upload["orders.norm"]}, codec)
        assert sum(b.nbytes for b in one.buffers) == 8 and one.nbytes == \
            len(one.header) + 8, codec
        decoded = Payload.encode(out.upload, codec).decode()
        _, diag = OrdersPolicy(alg.params, seed=0).aggregate(g, [(0, 1, decoded)], 1)
        assert diag["per_client"][0]["orders/norm"] == out.metrics["update_norm"], codec


def test_hierarchical_is_tier_mean_weighted_by_ranked_count():
    gen = np.random.default_rng(2)
    prev = np.zeros(5, np.float32)
    d = gen.normal(size=(5, 5)).astype(np.float32)
    ids = np.arange(5)
    tiers = np.array(["a", "b", "a", "b", "a"])
    p = OrdersParams(hierarchical=True, weighting="inverse")
    new, _, _ = orders_step(prev, d, ids, 1, OrdersState(), p, tiers=tiers)
    flat = OrdersParams(weighting="inverse")
    ua, _, _ = orders_step(prev, d[[0, 2, 4]], ids[[0, 2, 4]], 1, OrdersState(), flat)
    ub, _, _ = orders_step(prev, d[[1, 3]], ids[[1, 3]], 1, OrdersState(), flat)
    assert np.allclose(new, 3 / 5 * ua + 2 / 5 * ub, atol=1e-6)


def test_laplace_noise_scales_and_determinism():
    prev = np.zeros(4, np.float32)
    d = np.random.default_rng(4).normal(size=(6, 4)).astype(np.float32)
    ids = np.arange(6)
    p = OrdersParams(dp_b0=0.01, dp_clip=5.0, weighting="inverse")
    a, _, da = orders_step(prev, d, ids, 1, OrdersState(), p, rng=np.random.default_rng(9))
    b, _, db = orders_step(prev, d, ids, 1, OrdersState(), p, rng=np.random.default_rng(9))
    assert np.array_equal(a, b)
    scales = sorted(v["orders/noise_scale"] for v in da["per_client"].values())
    assert np.allclose(scales, [0.01 * k for k in range(1, 7)])
    assert "epsilon_max" not in da  # the scale follows the rank: no ε holds (docstring)
    loud = OrdersParams(dp_b0=100.0, weighting="inverse")
    _, _, dl = orders_step(prev, d, ids, 1, OrdersState(), loud, rng=np.random.default_rng(1))
    true_order = np.argsort(-np.linalg.norm(d, axis=1))
    noisy_order = sorted(ids, key=lambda c: dl["per_client"][c]["orders/rank"])
    assert list(true_order) != noisy_order


def test_a_frozen_rank_under_noise_releases_nothing_of_its_norm():
    """freeze_top gives w_k = 0, so b_k = b_0 / w_k = ∞: the noisy norm is the formula's
    limit, ±∞ by the draw's sign (it was the exact norm, no noise at all)."""
    prev = np.zeros(4, np.float32)
    d = np.random.default_rng(4).normal(size=(6, 4)).astype(np.float32)
    ids = np.arange(6)
    p = OrdersParams(dp_b0=0.01, freeze_top=2, weighting="inverse", participation_threshold=1)
    seen = set()
    for seed in range(8):
        _, _, diag = orders_step(prev, d, ids, 1, OrdersState(), p,
                                 rng=np.random.default_rng(seed))
        rows = diag["per_client"].values()
        frozen = [r for r in rows if math.isinf(r["orders/noise_scale"])]
        assert len(frozen) == 2 and all(math.isinf(r["orders/noisy_norm"]) for r in frozen)
        assert all(math.isfinite(r["orders/noisy_norm"]) for r in rows if r not in frozen)
        by_rank = sorted(rows, key=lambda r: r["orders/rank"])
        assert [r["orders/noisy_norm"] for r in by_rank] == sorted(
            (r["orders/noisy_norm"] for r in rows), reverse=True)
        seen |= {r["orders/noisy_norm"] for r in frozen}
    assert seen == {math.inf, -math.inf}


def test_freeze_top_and_maturity_map():
    p = OrdersParams(freeze_top=2, weighting="inverse", participation_threshold=1)
    prev = np.zeros(3, np.float32)
    state = OrdersState()
    d = np.diag([3.0, 2.0, 1.0]).astype(np.float32)
    new, state, diag = orders_step(prev, d, np.arange(3), 1, state, p)
    assert diag["per_client"][0]["orders/weight"] == 0.0
    assert np.allclose(new, [0, 0, 1 / 3])  # w = (0, 0, 1/3): c = (0, 0, 1/3)
    for rnd in range(2, 6):
        _, state, diag = orders_step(prev, d * rnd, np.arange(3), rnd, state, p)
    m = diag["per_client"][0]
    assert m["orders/maturity_slope"] > 0 and np.isfinite(m["orders/maturity_curvature"])
    assert m["orders/maturity_steady"] > 0


def test_policy_state_roundtrip_resumes_exactly():
    gen = np.random.default_rng(5)
    g = {"w": gen.normal(size=(3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    ups = [[(c, 10, {"w": gen.normal(size=(3, 2)).astype(np.float32),
                     "b": gen.normal(size=2).astype(np.float32)}) for c in range(4)]
           for _ in range(4)]
    a = OrdersPolicy(OrdersParams(), seed=0)
    ga = g
    for r in range(4):
        ga, _ = a.aggregate(ga, ups[r], r + 1)
    b = OrdersPolicy(OrdersParams(), seed=0)
    gb = g
    for r in range(2):
        gb, _ = b.aggregate(gb, ups[r], r + 1)
    c = OrdersPolicy(OrdersParams(), seed=0)
    c.load_state_dict(b.state_dict())
    for r in range(2, 4):
        gb, _ = c.aggregate(gb, ups[r], r + 1)
    for k in ga:
        assert np.array_equal(ga[k], gb[k])


BAD = [
    ({"beta": 0}, "algorithm.beta", "> 0"),
    ({"smoothing_window": 0}, "algorithm.smoothing_window", ">= 1"),
    ({"participation_threshold": 6}, "algorithm.participation_threshold", "at most"),
    ({"gamma": 0.5}, "algorithm.gamma", ">= 1"),
    ({"gamma": 50.0}, "algorithm.gamma", "[1, N]"),
    ({"weighting": "exp"}, "algorithm.weighting", "sigmoid"),
    ({"norm": "l3"}, "algorithm.norm", "key_layer"),
]


@pytest.mark.parametrize("bad,field,allowed", BAD, ids=[b[1] for b in BAD])
def test_bad_inputs(bad, field, allowed):
    sets = ["algorithm.name=orders", "clients.num_clients=10"]
    sets += [f"algorithm.{k}={v}" for k, v in bad.items()]
    with pytest.raises(ConfigError) as e:
        load_config(None, sets)
    assert e.value.path == field and allowed in str(e.value)


def test_params_build_from_dict():
    p = build_dataclass(OrdersParams, {"weighting": "inverse", "key_layers": ["fc.weight"]})
    assert p.weighting == "inverse" and p.key_layers == ["fc.weight"]


@pytest.mark.ray
def test_orders_end_to_end_on_ray_with_resume(ray_session, tiny_cfg, tmp_path):
    """`algorithm=orders` through the real runtime: per-client diagnostics land in the
    metrics, and stopping after round 2 then resuming gives the uninterrupted state."""
    import pyarrow.parquet as pq
    from conftest import full_and_resumed

    from fedray.core import checkpoint
    from fedray.core.storage import Storage

    cfg = tiny_cfg(**{"algorithm.name": "orders", "algorithm.combine": "rank_mean",
                      "rounds": 4, "clients.fraction": 0.67, "eval.local_before_after": "true",
                      "eval.finetune_epochs": 1})
    full_and_resumed(cfg, tmp_path)

    def final(d):
        return checkpoint.read(Storage(str(d)))

    a, b = final(tmp_path / "full"), final(tmp_path / "cut")
    assert all(np.array_equal(a["server"]["params"][k], b["server"]["params"][k])
               for k in a["server"]["params"])
    assert a["policy"]["state"]["norms"] == b["policy"]["state"]["norms"]
    clients = pq.read_table(tmp_path / "full" / "clients.parquet").to_pandas()
    trained = clients[clients["sampled"]]
    assert trained["orders/norm"].notna().all() and (trained["orders/norm"] > 0).all()
    assert np.allclose(trained["orders/norm"], trained["update_norm"], rtol=1e-5)
    rounds = pq.read_table(tmp_path / "full" / "rounds.parquet").to_pandas()
    assert rounds["policy/ranked"].iloc[0] == 4 and rounds["personalized_accuracy_ft"].notna().all()
    assert clients["ft_accuracy"].notna().any()
