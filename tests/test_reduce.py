"""``runtime.reduce=executors``: linear rules summed where the uploads are made — the same
bits for any executor count, the driver's result up to float64 rounding, the same bytes,
and refused where the server needs each upload."""

from __future__ import annotations

import glob
import os
import sys
import tempfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from ray import cloudpickle as ray_cloudpickle
from test_favor_policies import overrides as favor_overrides
from test_favor_policies import tiny  # noqa: F401 — the tiny Qwen2 + ASCE fixture
from test_runtime import assert_bitwise_equal, final_state

from fedray.core.spec import ConfigError
from fedray.methods.base import StackRow, accumulate, accumulate_rows, stack_runs, stack_slice
from fedray.methods.fedavg.method import FedAvg
from fedray.methods.fedavg.policy import weighted_mean
from fedray.runtime import run_experiment
from fedray.runtime.dispatch import combine, even_groups, summation_groups
from fedray.runtime.jobs import Partial

ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

# 24 clients, all sampled: 8 groups of 3
BASE = {"clients.num_clients": 24, "clients.fraction": 1.0, "local.momentum": 0.5,
        "local.keep_optimizer_state": "true", "rounds": 3}
MARKS = os.path.join(tempfile.gettempdir(), "fedray-test-transient")


class TransientFedAvg(FedAvg):
    """Clients 4 and 10 fail their first attempt of each round, then succeed (a marker file
    per run, round and client, on the machine all executors share)."""

    name = "transient-fedavg"

    def client_update(self, ctx, broadcast):
        if ctx.client_id in (4, 10):
            mark = f"{MARKS}-{ctx.seed}-{ctx.round}-{ctx.client_id}"
            if not os.path.exists(mark):
                open(mark, "w").close()
                raise RuntimeError("transient")
        return super().client_update(ctx, broadcast)


def tiers(n: int) -> str:
    return f"[{{name: default, executors: {n}, num_cpus: 0.5}}]"


@pytest.mark.ray
@pytest.mark.parametrize("method, cls", [
    ({"algorithm.name": "fedavg"}, TransientFedAvg),
    ({"algorithm.name": "fedavgm", "algorithm.weighted": False}, None)])
def test_the_same_bits_for_any_executor_count_and_the_drivers_result(ray_session, tiny_cfg,
                                                                      tmp_path, method, cls):
    """With transient client errors too: the retried clients' sums come after the first
    pass's groups, whichever executor ran what."""
    runs = {}
    for name, extra in (("driver", {"runtime.reduce": "driver"}),
                        ("ex1", {"runtime.reduce": "executors", "runtime.tiers": tiers(1)}),
                        ("ex3", {"runtime.reduce": "executors", "runtime.tiers": tiers(3)})):
        for mark in glob.glob(f"{MARKS}-*"):
            os.unlink(mark)
        cfg = tiny_cfg(**{**BASE, **method, **extra})
        run_experiment(cfg, str(tmp_path / name), progress=False, algorithm_cls=cls)
        if cls is not None:
            clients = pq.read_table(tmp_path / name / "clients.parquet").to_pandas()
            retried = clients[clients["client_id"].isin([4, 10])]
            assert (retried["attempts"] == 2).all() and (retried["status"] == "ok").all()
        runs[name] = (final_state(tmp_path / name),
                      pq.read_table(tmp_path / name / "rounds.parquet").to_pandas())
    assert_bitwise_equal(runs["ex1"][0], runs["ex3"][0])
    driver, reduced = runs["driver"][0], runs["ex3"][0]
    for k in driver:
        np.testing.assert_allclose(reduced[k], driver[k], rtol=0, atol=1e-6)
    for col in ("upload_bytes", "download_bytes", "ok", "rejected"):  # one byte ledger
        assert list(runs["driver"][1][col]) == list(runs["ex3"][1][col]), col


def test_groups_are_near_equal_runs_in_client_order():
    assert even_groups(list(range(50)), 8) == [list(range(a, b)) for a, b in zip(
        [0, 7, 14, 20, 26, 32, 38, 44], [7, 14, 20, 26, 32, 38, 44, 50], strict=True)]
    assert even_groups([3, 5], 8) == [[3], [5]]
    sizes = [len(g) for g in even_groups(list(range(1001)), 8)]
    assert sum(sizes) == 1001 and max(sizes) - min(sizes) == 1


def test_summation_groups_hold_full_cohorts_where_the_sample_allows():
    """8 groups by default; with cohorts min(8, ⌈n / cohort⌉) groups, each about a cohort
    or more; chunk_size, when set, decides alone; an empty sample has no group."""
    ids = list(range(1000))
    assert summation_groups(ids, None) == even_groups(ids, 8)
    assert [len(g) for g in summation_groups(ids, None, 256)] == [250] * 4
    assert [len(g) for g in summation_groups(ids, None, 100)] == [125] * 8
    assert [len(g) for g in summation_groups(ids[:40], None, 256)] == [40]
    assert summation_groups(ids, 300, 256) == even_groups(ids, 4)
    assert sum(summation_groups(ids, None, 256), []) == ids
    assert summation_groups([], None, 256) == summation_groups([], None) == []


def test_partials_are_added_in_group_order_whatever_order_they_came_in():
    rng = np.random.default_rng(0)
    groups = [((p, c), Partial({"w": rng.standard_normal(5).astype(np.float32)
                                * 10.0 ** (3 * c)}, float(c + 1)))
              for p, c in ((1, 0), (1, 4), (1, 9), (2, 4))]
    expected: dict = {}
    for _, part in groups:
        accumulate(expected, part.total, 1.0)
    for order in ([3, 2, 1, 0], [2, 0, 3, 1]):
        total, weight = combine([groups[i] for i in order])
        assert weight == 1 + 5 + 10 + 5
        assert np.array_equal(total["w"], expected["w"])
    a: dict = {}
    accumulate(a, {"w": np.array([1.5], np.float32)}, 3.0)
    accumulate(a, {"w": np.array([0.25], np.float32)}, 2.0)
    assert a["w"].dtype == np.float64 and a["w"][0] == 5.0


@pytest.mark.parametrize("side_by_side", [True, False])
@pytest.mark.parametrize("block_bytes", [1, 200, 1 << 23])
def test_stacked_rows_add_as_one_client_after_another(block_bytes, side_by_side,
                                                       monkeypatch):
    """accumulate_rows gives the bits of accumulate called row by row: a sum that holds
    some tensors already and not others (a missing one starts at its first term, so a
    -0.0 term stays -0.0), a scalar and an integer tensor, weights far apart, rows taken
    one at a time or in blocks, or row by row (uploads above SIDE_BY_SIDE numbers); a
    shape that differs from the sum's raises before anything is added."""
    from fedray.methods import base

    if not side_by_side:
        monkeypatch.setattr(base, "SIDE_BY_SIDE", 0)
    gen = np.random.default_rng(3)
    k = 7
    stacked = {"w": (gen.standard_normal((k, 4, 3)) * 10.0 ** gen.integers(-6, 6, (k, 1, 1))
                     ).astype(np.float32),
               "b": gen.standard_normal((k, 5)).astype(np.float32),
               "s": gen.standard_normal(k).astype(np.float32),
               "n": gen.integers(-9, 9, (k, 2)),
               "z": np.full((k, 2), -0.0, np.float32)}
    weights = [float(x) for x in gen.uniform(0.5, 3e4, k)]
    start = {"b": gen.standard_normal(5), "w": gen.standard_normal((4, 3))}
    want = {n: v.copy() for n, v in start.items()}
    for i in range(k):
        accumulate(want, {n: v[i] for n, v in stacked.items()}, weights[i])
    got = {n: v.copy() for n, v in start.items()}
    accumulate_rows(got, stacked, weights, block_bytes=block_bytes)
    assert got.keys() == want.keys()
    for n, v in want.items():
        assert got[n].dtype == v.dtype == np.float64 and got[n].shape == v.shape, n
        assert got[n].tobytes() == v.tobytes(), n
    assert np.signbit(got["z"]).all()
    before = {n: v.copy() for n, v in got.items()}
    with pytest.raises(ValueError, match="'b' has shape"):
        accumulate_rows(got, {"w": stacked["w"], "b": stacked["b"][:, :4]}, weights)
    with pytest.raises(ValueError, match="3 rows for 7 weights"):
        accumulate_rows(got, {"w": stacked["w"][:3]}, weights)
    assert all(got[n].tobytes() == v.tobytes() for n, v in before.items())
    accumulate_rows(got, {"w": stacked["w"][:0]}, [])
    assert all(got[n].tobytes() == v.tobytes() for n, v in before.items())


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_a_term_added_in_blocks_has_the_bits_of_the_whole_term(block, monkeypatch):
    """add_weighted, in blocks through its scratch buffer, gives acc + float64(v)·w as
    forming the whole term first does, bit for bit: float32, float64 and integer values,
    weights far apart, a -0.0 term on a -0.0 sum, sizes that are not a multiple of the
    block; a strided value takes the whole-term path. accumulate and weighted_mean, which
    add through it, give the loop's bits; accumulate still checks every tensor first."""
    from fedray.methods import base

    monkeypatch.setattr(base, "TERM_BLOCK", block)
    gen = np.random.default_rng(11)
    values = [(gen.standard_normal((37, 5)) * 10.0 ** gen.integers(-8, 8, (37, 1))
               ).astype(np.float32), gen.standard_normal((37, 5)),
              gen.integers(-50, 50, (37, 5)), np.full((37, 5), -0.0, np.float32)]
    for value, weight in zip(values, (3e-7, 1234.5, 0.1, 2.0), strict=True):
        start = gen.standard_normal((37, 5))
        start[0, 0] = -0.0
        want = start + np.multiply(value, weight, dtype=np.float64)
        got = start.copy()
        base.add_weighted(got, value, weight)
        assert got.tobytes() == want.tobytes()
        strided = start.copy()
        base.add_weighted(strided[:, ::2], value[:, ::2], weight)
        assert strided[:, ::2].tobytes() == want[:, ::2].tobytes()
        assert strided[:, 1::2].tobytes() == start[:, 1::2].tobytes()
    buf = gen.standard_normal(200)
    want = buf[1:] + np.multiply(buf[:-1], 0.5, dtype=np.float64)
    base.add_weighted(buf[1:], buf[:-1], 0.5)  # overlapping: the whole term first, as before
    assert buf[1:].tobytes() == want.tobytes()
    updates = [(c, int(gen.integers(1, 40)), {"w": gen.standard_normal((9, 13)).astype(
        np.float32), "b": gen.standard_normal(3).astype(np.float32)}) for c in range(6)]
    want = loop_mean(updates)
    assert all(weighted_mean(updates)[k].tobytes() == v.tobytes() for k, v in want.items())
    acc: dict = {}
    for _, n, d in updates:
        accumulate(acc, d, float(n))
    before = {k: v.copy() for k, v in acc.items()}
    with pytest.raises(ValueError, match="'b' has shape"):
        accumulate(acc, {"w": updates[0][2]["w"], "b": np.zeros(4, np.float32)}, 1.0)
    with pytest.raises(TypeError):
        accumulate(acc, {"w": updates[0][2]["w"], "b": np.array(["x", "y", "z"])}, 1.0)
    assert all(acc[k].tobytes() == v.tobytes() for k, v in before.items())


def loop_mean(updates, weighted=True):
    """The client-by-client float64 mean weighted_mean replaces: the oracle."""
    counts = np.array([n for _, n, _ in updates], dtype=np.float64)
    w = counts / counts.sum() if weighted else np.full(len(updates), 1.0 / len(updates))
    out = {k: np.zeros(np.shape(v)) for k, v in updates[0][2].items()}
    for k in out:
        for wi, (_, _, d) in zip(w, updates, strict=True):
            out[k] += wi * np.asarray(d[k])
    return out


@pytest.mark.parametrize("side_by_side", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_the_mean_of_stacked_rows_is_the_client_by_client_mean(weighted, side_by_side,
                                                               monkeypatch):
    """weighted_mean over cohorts' rows (StackRow: long runs added as the stack's slice,
    runs cut by a left-out client, a run too short to slice, a second stack, plain
    uploads between them) gives the bits of the loop over clients and tensors."""
    gen = np.random.default_rng(5)
    stacks = [{"w": gen.standard_normal((n, 6, 4)).astype(np.float32),
               "b": gen.standard_normal((n, 6)).astype(np.float32)} for n in (9, 12)]
    stacks[0]["b"][2] = -0.0
    rows = [StackRow(stacks[0], r) for r in (0, 1, 2, 3, 4, 6, 7, 8)] + \
        [StackRow(stacks[1], r) for r in (0, 1)] + \
        [{"w": gen.standard_normal((6, 4)).astype(np.float32),
          "b": gen.standard_normal(6).astype(np.float32)}] + \
        [StackRow(stacks[1], r) for r in range(2, 12)]
    updates = [(c, int(gen.integers(1, 50)), d) for c, d in enumerate(rows)]
    want = loop_mean(updates, weighted)
    from fedray.methods import base
    from fedray.methods.fedavg import policy

    if not side_by_side:  # a large model's rows: added with accumulate, row by row
        monkeypatch.setattr(base, "SIDE_BY_SIDE", 0)

    sliced = []
    monkeypatch.setattr(policy, "accumulate_rows", lambda acc, stacked, w: (
        sliced.append(len(w)), accumulate_rows(acc, stacked, w)))
    got = weighted_mean(updates, weighted)
    assert sliced == [5, 10]  # the two long runs; the rest one by one
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].tobytes() == v.tobytes(), k
    plain = [(c, n, {k: np.array(d[k]) for k in d}) for c, n, d in updates]
    assert all(weighted_mean(plain, weighted)[k].tobytes() == v.tobytes()
               for k, v in want.items())
    row = rows[5]
    assert len(row) == 2 and list(row) == ["w", "b"] and dict(row).keys() == {"w", "b"}
    assert np.shares_memory(row["w"], stacks[0]["w"]) and np.array_equal(row["b"],
                                                                          stacks[0]["b"][6])


def test_consecutive_rows_of_one_stack_are_its_slice():
    """stack_slice: rows r..r+n-1 of one stack are its slice (a view, no copy); a gap, a
    second stack, a plain upload or nothing at all is not. stack_runs cuts a list into
    such runs, any other upload a run of its own."""
    stack = {"w": np.arange(24, dtype=np.float32).reshape(6, 4), "b": np.arange(6.0)}
    other = {k: v.copy() for k, v in stack.items()}
    got = stack_slice([StackRow(stack, r) for r in (2, 3, 4)])
    assert got.keys() == {"w", "b"} and np.shares_memory(got["w"], stack["w"])
    assert np.array_equal(got["w"], stack["w"][2:5]) and np.array_equal(got["b"], [2, 3, 4])
    for bad in ([StackRow(stack, 0), StackRow(stack, 2)],
                [StackRow(stack, 0), StackRow(other, 1)],
                [StackRow(stack, 0), {"w": stack["w"][1], "b": stack["b"][1]}],
                [{"w": stack["w"][0], "b": stack["b"][0]}], []):
        assert stack_slice(bad) is None
    plain = {"w": stack["w"][0], "b": stack["b"][0]}
    assert stack_runs([StackRow(stack, 0), StackRow(stack, 1), plain, StackRow(stack, 2),
                       StackRow(other, 3), StackRow(other, 4), StackRow(stack, 5)]) == \
        [(0, 2), (2, 3), (3, 4), (4, 6), (6, 7)]


@pytest.mark.parametrize("extra, why", [
    ({"payload.transforms": "[topk]"}, "update transforms"),
    ({"dp.enabled": "true", "dp.noise_multiplier": 1.0}, "central DP"),
    ({"fleet.deadline_s": 100}, "fleet.availability"),
    ({"algorithm.name": "fedbuff", "algorithm.concurrency": 4}, "lacks the 'linear'"),
    ({"algorithm.name": "orders"}, "lacks the 'linear'"),
])
def test_refused_where_the_server_needs_each_upload(tiny_cfg, tmp_path, extra, why):
    """Refused when the config is loaded, before any Ray work or run directory."""
    with pytest.raises(ConfigError, match=why) as e:
        tiny_cfg(**{"runtime.reduce": "executors", **extra})
    assert "runtime.reduce" in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
def test_favor_shared_adapters_summed_on_the_executors(ray_session, tiny, tmp_path):  # noqa: F811
    """FAVoR's server (the uniform mean of the shared LoRA deltas, eqs. 14–15) is linear:
    reduced on the executors it gives the driver's adapters up to float64 rounding."""
    from fedray.core.config import load_config
    from fedray.data import build_data
    from fedray.data.authors import generate_corpus

    csv = generate_corpus(tmp_path / "a.csv", num_authors=5, seed=0, posts=(10, 12))
    states = {}
    for mode in ("driver", "executors"):
        cfg = load_config(None, favor_overrides(tiny, csv) + [
            "clients.num_clients=5", "clients.per_round=3", "rounds=2", "eval.clients=none",
            "eval.every=0", "runtime.tiers=[{name: lm, executors: 1, num_cpus: 0.5}]",
            "runtime.placement_timeout_s=300", f"runtime.reduce={mode}"])
        run_experiment(cfg, str(tmp_path / mode), progress=False, data=build_data(cfg))
        states[mode] = final_state(tmp_path / mode)
        rounds = pq.read_table(tmp_path / mode / "rounds.parquet").to_pandas()
        assert (rounds["ok"] == 3).all() and (rounds["policy/update_norm"] > 0).all()
    assert states["driver"].keys() == states["executors"].keys()
    for k, v in states["driver"].items():
        np.testing.assert_allclose(states["executors"][k], v, rtol=0, atol=1e-6)


def test_a_row_that_cannot_be_added_fails_its_client_alone():
    """A cohort's stack summed on its executor: the rows add in client order; a client
    whose row cannot be added (here its weight raises) becomes an error result alone, and
    the sum holds the others; a NaN row is named and left out."""
    from fedray.methods.base import ClientResult, Status
    from fedray.runtime.executor import ClientExecutor
    from fedray.runtime.jobs import StackedUploads
    from fedray.wire.payload import Payload

    class Rule:
        def weight(self, n):
            if n == 13:
                raise RuntimeError("bad weight")
            return float(n)

    gen = np.random.default_rng(0)
    w = gen.standard_normal((5, 3, 2)).astype(np.float32)
    w[3, 0, 0] = np.nan
    ids, samples = [4, 7, 9, 11, 12], [10, 13, 5, 6, 8]
    results = [ClientResult(c, 2, Status.OK, n, None, {}, upload_bytes=24, executor="t/0")
               for c, n in zip(ids, samples, strict=True)]
    ex = ClientExecutor.__new__(ClientExecutor)
    ex.name = "t/0"
    partial = Partial({}, 0.0)
    out = ex._reduce_stack(results, StackedUploads(ids, Payload.encode({"w": w}, "fp32")),
                           Rule(), partial)
    assert [r.status for r in out] == [Status.OK, Status.ERROR, Status.OK, Status.OK,
                                       Status.OK]
    assert "bad weight" in out[1].error and out[1].client_id == 7
    assert partial.nonfinite == [11] and partial.weight == 10 + 5 + 8
    ref = {}
    for i in (0, 2, 4):
        accumulate(ref, {"w": w[i]}, float(samples[i]))
    assert partial.total["w"].tobytes() == ref["w"].tobytes()
