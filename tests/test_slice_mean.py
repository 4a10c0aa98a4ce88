"""Per-coordinate aggregation over the clients that hold each coordinate (DROD §3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedray.methods.drod.selection import gather, selection
from fedray.methods.drod.slice_mean import SliceMeanPolicy
from fedray.models.sliceable import Arch

ARCH = Arch(1, 3, blocks=(1, 1), width=2)
HW = (4, 4)
GEOMS = {"big": ARCH.full(), "small": ARCH.geometry(0.5, 1.0)}
TIER = {0: "big", 1: "small", 2: "big"}


def global_state(seed=0):
    from fedray.models.sliceable import held

    gen = np.random.default_rng(seed)
    return {k: gen.standard_normal(s).astype(np.float32)
            for k, s in held(ARCH, HW, ARCH.full())}


def test_small_case_by_hand():
    """fc.weight (3 x 4): column 0 is held by all three clients, column 3 only by the two
    big ones; the stem of the small tier is channel 0 only."""
    g = global_state()
    pol = SliceMeanPolicy(ARCH, HW, GEOMS, TIER.get)
    ups = []
    for cid, n in ((0, 2), (1, 1), (2, 1)):
        sub = pol.broadcast(g, 1, TIER[cid])
        ups.append((cid, n, {k: np.full_like(v, float(cid + 1)) for k, v in sub.items()}))
    assert ups[1][2]["fc.weight"].shape == (3, 2) and ups[0][2]["fc.weight"].shape == (3, 4)
    new, metrics = pol.aggregate(g, ups, 1)
    d = new["fc.weight"] - g["fc.weight"]
    assert np.allclose(d[:, :2], (2 * 1 + 1 * 2 + 1 * 3) / 4)
    assert np.allclose(d[:, 2:], (2 * 1 + 1 * 3) / 3)
    db = new["stem.conv.weight"] - g["stem.conv.weight"]
    assert np.allclose(db[:1], 7 / 4) and np.allclose(db[1:], 5 / 3)
    assert np.allclose(new["fc.bias"] - g["fc.bias"], 7 / 4)
    assert metrics["coverage"] == 1.0


def reference(g, updates, tier_of, weighted):
    """Coordinate by coordinate: the weighted mean update of the clients whose prefix
    shape contains the coordinate."""
    out = {}
    for k, v in g.items():
        new = v.astype(np.float64).copy()
        for idx in itertools.product(*map(range, v.shape)):
            num = den = 0.0
            for _, n, up in updates:
                if k in up and all(i < s for i, s in zip(idx, up[k].shape, strict=True)):
                    w = n if weighted else 1
                    num += w * float(up[k][idx])
                    den += w
            if den:
                new[idx] += num / den
        out[k] = new.astype(np.float32)
    return out


@pytest.mark.parametrize("weighted", [True, False])
def test_matches_a_coordinate_by_coordinate_reference(weighted):
    g = global_state(1)
    gen = np.random.default_rng(2)
    pol = SliceMeanPolicy(ARCH, HW, GEOMS, TIER.get, weighted=weighted)
    ups = [(cid, int(gen.integers(1, 9)), {k: gen.standard_normal(v.shape).astype(np.float32)
                                           for k, v in pol.broadcast(g, 3, TIER[cid]).items()})
           for cid in (0, 1, 2)]
    new, _ = pol.aggregate(g, ups, 3)
    want = reference(g, ups, TIER.get, weighted)
    for k in g:
        assert np.allclose(new[k], want[k], atol=1e-6), k


def test_coordinates_nobody_holds_keep_their_value():
    g = global_state(3)
    pol = SliceMeanPolicy(ARCH, HW, GEOMS, TIER.get)
    up = {k: np.ones_like(v) for k, v in pol.broadcast(g, 1, "small").items()}
    new, metrics = pol.aggregate(g, [(1, 5, up)], 1)
    assert np.array_equal(new["fc.weight"][:, 2:], g["fc.weight"][:, 2:])
    assert np.allclose(new["fc.weight"][:, :2], g["fc.weight"][:, :2] + 1)
    assert 0 < metrics["coverage"] < 1


def test_rolling_windows_aggregate_where_they_landed():
    """FedRolex: in round 1 the small tier holds stream channel 1 (window of 1 rolled by
    one), so its update lands there and channel 0 is averaged over the big clients only."""
    g = global_state(4)
    pol = SliceMeanPolicy(ARCH, HW, GEOMS, TIER.get, rule="rolling")
    sel = selection(ARCH, GEOMS["small"], "rolling", 1)
    assert sel["s0"].tolist() == [1]
    sent = pol.broadcast(g, 1, "small")
    assert np.array_equal(sent["stem.conv.weight"], g["stem.conv.weight"][1:2])
    direct = gather(ARCH, HW, g, GEOMS["small"], sel)
    assert all(np.array_equal(sent[k], direct[k]) for k in direct)
    ups = [(0, 1, {k: np.zeros_like(v) for k, v in pol.broadcast(g, 1, "big").items()}),
           (1, 1, {k: np.ones_like(v) for k, v in sent.items()})]
    new, _ = pol.aggregate(g, ups, 1)
    d = new["stem.conv.weight"] - g["stem.conv.weight"]
    assert np.allclose(d[1], 0.5) and np.allclose(d[0], 0.0)
