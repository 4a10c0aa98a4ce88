"""Top-k and PowerSGD compressors with error feedback: hand-computed cases and exact bytes."""

import math

import numpy as np
import pytest

from fedray.wire.compression import (
    index_dtype,
    payload_values,
    powersgd_compress,
    powersgd_decompress,
    powersgd_is_compressed,
    topk_compress,
    topk_decompress,
    topk_k,
)
from fedray.wire.payload import Payload


def f32(x):
    return np.array(x, dtype=np.float32)


def body_bytes(upload):
    """What Payload.encode counts for ``upload``, less its JSON header."""
    p = Payload.encode(upload, "fp32")
    return p.nbytes - len(p.header)


# ------------------------------------------------------------------------------------ top-k


def test_topk_hand_computed_two_rounds():
    m = f32([[1, -5, 3], [4, -2, 6]])
    up, err, shapes, qmem = topk_compress({"w": m}, None, 1 / 3)
    assert set(up) == {"w.values", "w.indices"} and qmem == {} and shapes == {"w": (2, 3)}
    assert up["w.indices"].dtype == np.uint16
    np.testing.assert_array_equal(up["w.indices"], [1, 5])
    np.testing.assert_array_equal(up["w.values"], f32([-5, 6]))
    np.testing.assert_array_equal(err["w"], f32([[1, 0, 3], [4, -2, 0]]))
    np.testing.assert_array_equal(topk_decompress(up, shapes)["w"], f32([[0, -5, 0], [0, 0, 6]]))
    assert m[0, 1] == -5  # the caller's update is not modified

    # round 2: M = ones + error = [[2, 1, 4], [5, -1, 1]] -> keeps 5 (index 3) and 4 (index 2)
    up2, err2, _, _ = topk_compress({"w": np.ones((2, 3), np.float32)}, err, 1 / 3)
    np.testing.assert_array_equal(up2["w.indices"], [2, 3])
    np.testing.assert_array_equal(up2["w.values"], f32([4, 5]))
    np.testing.assert_array_equal(err2["w"], f32([[2, 1, 0], [0, -1, 1]]))


def test_topk_ties_keep_lowest_index():
    up, err, _, _ = topk_compress({"v": f32([1, 3, -3, 3])}, None, 0.5)
    np.testing.assert_array_equal(up["v.indices"], [1, 2])
    np.testing.assert_array_equal(up["v.values"], f32([3, -3]))
    np.testing.assert_array_equal(err["v"], f32([1, 0, 0, 3]))
    up, _, _, _ = topk_compress({"v": f32([2, -2, 2, 1, -2])}, None, 0.4)
    np.testing.assert_array_equal(up["v.indices"], [0, 1])


def test_topk_density_one_is_lossless():
    g = np.random.default_rng(0)
    t = {"w": g.normal(size=(5, 7)).astype(np.float32), "s": f32(2.5)}
    up, err, shapes, _ = topk_compress(t, None, 1.0)
    dense = topk_decompress(up, shapes)
    for k in t:
        np.testing.assert_array_equal(dense[k], t[k])
        assert not err[k].any()


def test_topk_k_and_index_dtype():
    assert topk_k(30, 0.1) == 3  # 0.1 * 30 == 3.0000000000000004 in float
    assert topk_k(10, 0.01) == 1 and topk_k(6, 1 / 3) == 2 and topk_k(7, 1 / 3) == 3
    assert topk_k(0, 0.5) == 0
    with pytest.raises(ValueError):
        topk_k(10, 0.0)
    assert index_dtype(65536) == np.uint16 and index_dtype(65537) == np.uint32


def test_topk_bytes_match_payload_and_survive_the_wire():
    g = np.random.default_rng(1)
    t = {"conv": g.normal(size=(8, 3, 3, 3)).astype(np.float32),
         "big": g.normal(size=(65537,)).astype(np.float32),
         "b": g.normal(size=(7,)).astype(np.float32), "s": f32(1.0)}
    up, _, shapes, _ = topk_compress(t, None, 0.01)
    assert up["conv.indices"].dtype == np.uint16 and up["big.indices"].dtype == np.uint32
    count = payload_values("topk", shapes, density=0.01)
    ks = [math.ceil(0.01 * 216), math.ceil(0.01 * 65537), 1, 1]
    assert count.values == count.indices == sum(ks)
    # float32 values, indices at their own width: uint32 for the 65,537-entry tensor only
    index_bytes = 2 * ks[0] + 4 * ks[1] + 2 * ks[2] + 2 * ks[3]
    assert body_bytes(up) == count.nbytes == sum(ks) * 4 + index_bytes
    decoded = Payload.encode(up, "fp32").decode()
    direct = topk_decompress(up, shapes)
    for k, v in topk_decompress(decoded, shapes).items():
        np.testing.assert_array_equal(v, direct[k])


def test_topk_indices_exact_beyond_float32_integer_range():
    m = np.zeros(2**24 + 3, np.float32)
    m[-1] = 5.0
    up, _, shapes, _ = topk_compress({"e": m}, None, 1 / m.size)
    assert up["e.indices"].dtype == np.uint32
    dense = topk_decompress(Payload.encode(up, "int8").decode(), shapes)["e"]
    assert dense[-1] == 5.0 and dense[:-1].sum() == 0


def test_topk_error_feedback_loses_nothing_and_stays_bounded():
    n, density, rounds = 20, 0.1, 300
    u = ((np.arange(n) - 9.5) / 4).astype(np.float32)  # multiples of 1/8: sums are exact
    err, dec_sum, norms = None, np.zeros(n), []
    for _ in range(rounds):
        up, err, shapes, _ = topk_compress({"u": u}, err, density)
        dec_sum += topk_decompress(up, shapes)["u"]
        norms.append(np.linalg.norm(err["u"]))
    gap = rounds * u.astype(np.float64) - dec_sum
    np.testing.assert_array_equal(gap, err["u"])  # telescoping: the gap IS the final error
    assert np.linalg.norm(gap) <= np.linalg.norm(err["u"].astype(np.float64))
    # top-k is a delta = k/n contraction: ||e|| <= sqrt(1-delta) / (1 - sqrt(1-delta)) ||u||
    c = math.sqrt(1 - topk_k(n, density) / n)
    assert max(norms) <= c / (1 - c) * np.linalg.norm(u)
    assert np.linalg.norm(gap) / np.linalg.norm(rounds * u) < 0.05


# --------------------------------------------------------------------------------- PowerSGD


def test_powersgd_rank1_matrix_is_exact():
    m = np.outer(f32([1, 2, 3, 4]), f32([1, -1, 2]))
    up, err, shapes, qmem = powersgd_compress({"w": m}, None, 1, None, seed=0, round=0, client=0)
    assert up["w.P"].shape == (4, 1) and up["w.Q"].shape == (3, 1)
    np.testing.assert_allclose(powersgd_decompress(up, shapes)["w"], m, atol=1e-6)
    np.testing.assert_allclose(err["w"], 0, atol=1e-6)
    np.testing.assert_array_equal(qmem["w"], up["w.Q"])


def test_powersgd_error_is_carried_to_next_round_hand_computed():
    m = f32([[3, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]])  # rank 2, compressed at rank 1
    q0 = {"w": f32([[1], [1], [0]])}
    up, err, shapes, qmem = powersgd_compress({"w": m}, None, 1, q0, seed=0, round=0, client=0)
    # M q0 = [3, 1, 0, 0] -> P = [3, 1, 0, 0]/sqrt(10); Q = Mᵀ P = [9, 1, 0]/sqrt(10)
    p = up["w.P"][:, 0] * np.sign(up["w.P"][0, 0])
    np.testing.assert_allclose(p, f32([3, 1, 0, 0]) / np.sqrt(10), atol=1e-6)
    approx = f32([[2.7, 0.3, 0], [0.9, 0.1, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_allclose(powersgd_decompress(up, shapes)["w"], approx, atol=1e-6)
    expected_err = f32([[0.3, -0.3, 0], [-0.9, 0.9, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_allclose(err["w"], expected_err, atol=1e-6)
    np.testing.assert_array_equal(err["w"], m - up["w.P"] @ up["w.Q"].T)

    # round 2 with a zero update: M = error (rank 1), warm-started from Q -> sent exactly
    zero = {"w": np.zeros_like(m)}
    up2, err2, _, _ = powersgd_compress(zero, err, 1, qmem, seed=0, round=1, client=0)
    p2 = up2["w.P"][:, 0] * np.sign(up2["w.P"][0, 0])
    np.testing.assert_allclose(p2, f32([1, -3, 0, 0]) / np.sqrt(10), atol=1e-6)
    np.testing.assert_allclose(powersgd_decompress(up2, shapes)["w"], expected_err, atol=1e-6)
    np.testing.assert_allclose(err2["w"], 0, atol=1e-6)


def test_powersgd_warm_start_reuses_q_and_not_the_rng():
    g = np.random.default_rng(2)
    m = {"w": g.normal(size=(12, 9)).astype(np.float32)}
    q = {"w": g.normal(size=(9, 2)).astype(np.float32)}
    a = powersgd_compress(m, None, 2, q, seed=0, round=3, client=1)
    b = powersgd_compress(m, None, 2, q, seed=99, round=7, client=5)
    for k in a.upload:
        np.testing.assert_array_equal(a.upload[k], b.upload[k])
    p, _ = np.linalg.qr(m["w"].astype(np.float64) @ q["w"])
    np.testing.assert_allclose(a.upload["w.P"], p, atol=1e-6)
    np.testing.assert_array_equal(a.q_memory["w"], a.upload["w.Q"])


def test_powersgd_zero_update_does_not_stall_warm_start():
    zero = {"w": np.zeros((6, 5), np.float32)}
    a = powersgd_compress(zero, None, 1, None, seed=0, round=0, client=0)
    assert not a.q_memory["w"].any() and not a.error["w"].any()
    m = {"w": np.ones((6, 5), np.float32)}  # rank 1: exact once Q is redrawn
    b = powersgd_compress(m, None, 1, a.q_memory, seed=0, round=1, client=0)
    np.testing.assert_allclose(b.error["w"], 0, atol=1e-6)


def test_powersgd_dense_passthrough():
    t = {"b": f32([1, 2, 3]), "s": f32(4.0), "small": np.ones((4, 3), np.float32)}
    assert not powersgd_is_compressed((4, 3), 2) and powersgd_is_compressed((4, 3), 1)
    up, err, shapes, qmem = powersgd_compress(t, None, 2, None, seed=0, round=0, client=0)
    assert set(up) == {"b", "s", "small"} and qmem == {}
    dense = powersgd_decompress(up, shapes)
    for k in t:
        np.testing.assert_array_equal(dense[k], t[k])
        assert not err[k].any()


def test_powersgd_p_is_orthonormal_and_bytes_match_payload():
    g = np.random.default_rng(3)
    t = {"fc": g.normal(size=(20, 10)).astype(np.float32),
         "conv": g.normal(size=(8, 3, 3, 3)).astype(np.float32),
         "small": g.normal(size=(4, 3)).astype(np.float32),
         "b": g.normal(size=(5,)).astype(np.float32)}
    up, _, shapes, _ = powersgd_compress(t, None, 2, None, seed=0, round=0, client=0)
    for name in ("fc", "conv"):
        p = up[name + ".P"].astype(np.float64)
        np.testing.assert_allclose(p.T @ p, np.eye(2), atol=1e-6)
    assert up["conv.P"].shape == (8, 2) and up["conv.Q"].shape == (27, 2)
    assert powersgd_decompress(up, shapes)["conv"].shape == (8, 3, 3, 3)
    count = payload_values("powersgd", shapes, rank=2)
    assert count.values == 2 * 30 + 2 * 35 + 12 + 5 and count.indices == 0
    assert body_bytes(up) == count.nbytes == 4 * count.values


def test_powersgd_determinism():
    g = np.random.default_rng(4)
    t = {"w": g.normal(size=(16, 6)).astype(np.float32)}
    a = powersgd_compress(t, None, 2, None, seed=7, round=2, client=3)
    b = powersgd_compress(t, None, 2, None, seed=7, round=2, client=3)
    c = powersgd_compress(t, None, 2, None, seed=7, round=2, client=4)
    for k in a.upload:
        np.testing.assert_array_equal(a.upload[k], b.upload[k])
    assert not np.allclose(np.abs(a.upload["w.P"]), np.abs(c.upload["w.P"]))


# ------------------------------------------------------------------------------- interface


def test_compressor_validation():
    with pytest.raises(ValueError, match="unknown compressor"):
        payload_values("randk", {"w": (3,)})
    with pytest.raises(ValueError):
        topk_compress({"w": f32([1])}, None, 1.5)
    with pytest.raises(ValueError):
        powersgd_compress({"w": f32([[1, 2], [3, 4]])}, None, 0, None, seed=0, round=0,
                          client=0)
    with pytest.raises(ValueError):
        payload_values("topk", {"w": (3,)})
    with pytest.raises(ValueError):
        topk_compress({"w": f32([1])}, None, 0.5, scope="global")  # type: ignore[arg-type]
