"""The fleet: the virtual clock against hand computation, availability, dropout, deadline,
over-commitment, report minimums, FedBuff/FedAsync, and bad trace files."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from fedray.core.config import ConfigError, load_config
from fedray.methods.base import AsyncUpdate
from fedray.methods.fedbuff import (
    FedAsyncPolicy,
    FedBuffPolicy,
    fedbuff_coefficients,
    fedbuff_weight,
)
from fedray.services.fleet import (
    Availability,
    Fleet,
    import_fedscale,
    read_availability,
    write_example,
)
from fedray.services.server_opt import SGD

POP = ["data.dataset=synthetic", "data.synthetic_per_client=20", "data.synthetic_features=16",
       "model.hidden=[16]", "eval.clients=none", "seed=3",
       "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"]


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def trace3(tmp_path):
    return write(tmp_path / "devices.csv",
                 "client_id,compute_ms_per_sample,down_kbps,up_kbps,latency_ms\n"
                 "0,10,8000,800,100\n1,40,1000,100,20\n2,2.5,64000,16000,0\n")


def test_simulated_time_is_the_formula_for_a_three_client_trace(trace3):
    cfg = load_config(None, ["clients.num_clients=3", f"fleet.trace={trace3}"])
    fleet = Fleet.of(cfg)
    t = fleet.seconds(np.arange(3), ["default"] * 3, download=np.array([100_000] * 3),
                      upload=np.array([50_000] * 3), samples=np.array([16, 16, 32]))
    # bytes * 8 / (kbps * 1000) + latency + samples * ms / 1000
    expected = [100_000 * 8 / 8e6 + 0.1 + 16 * 10 / 1000 + 50_000 * 8 / 8e5,
                100_000 * 8 / 1e6 + 0.02 + 16 * 40 / 1000 + 50_000 * 8 / 1e5,
                100_000 * 8 / 64e6 + 0.0 + 32 * 2.5 / 1000 + 50_000 * 8 / 16e6]
    assert t["total"].tolist() == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx([0.86, 5.46, 0.1175], rel=1e-12)


def test_tier_capacity_scales_compute_and_drawn_profiles_are_per_client():
    cfg = load_config(None, ["clients.num_clients=100", "runtime.tiers=[{name: full}, "
                             "{name: half, capacity: 0.5}]", "fleet.tier_speed={full: 2}"])
    fleet = Fleet.of(cfg, {"full": 1.0, "half": 0.5})
    ids = np.arange(100)
    tiers = [cfg.tier_of(c) for c in ids]
    a = fleet.profiles(ids, tiers)
    b = Fleet.of(cfg, {"full": 1.0, "half": 0.5}).profiles(ids[::-1], tiers[::-1])
    assert np.array_equal(a.compute_ms, b.compute_ms[::-1])  # a function of the client alone
    assert np.median(a.compute_ms[0::2]) < np.median(a.compute_ms[1::2])  # full is 2x faster
    t = fleet.seconds(np.array([1, 1]), ["half", "full"], np.zeros(2), np.zeros(2),
                      np.array([10, 10]))
    # the same device: the half sub-model costs half, the full tier's speed 2 halves again
    assert t["compute"][0] == pytest.approx(t["compute"][1] * 0.5 * 2)


def test_sub_model_methods_charge_their_budget_full_model_methods_do_not():
    from fedray.core.registry import make_method, method

    cfg = load_config(None, ["runtime.tiers=[{name: a}, {name: b, capacity: 0.25}]"])
    tier = cfg.runtime.tiers[1]
    assert make_method(method("fedavg"), cfg).compute_cost(tier) == 1.0
    cfg = load_config(None, ["runtime.tiers=[{name: a}, {name: b, capacity: 0.25}]",
                             "algorithm.name=heterofl", "model.name=sliceable_resnet18",
                             "model.width=8"])
    assert make_method(method("heterofl"), cfg).compute_cost(cfg.runtime.tiers[1]) == 0.25


def test_availability_intervals_period_and_sampling(tmp_path):
    path = write(tmp_path / "av.csv", "client_id,start_s,end_s\n0,0,10\n0,20,30\n2,5,6\n")
    av = read_availability(path, 4)
    ids = np.array([0, 1, 2, 3])
    assert av.online(ids, 0.0).tolist() == [True, True, False, True]
    assert av.online(ids, 5.5).tolist() == [True, True, True, True]
    assert av.online(ids, 15.0).tolist() == [False, True, False, True]
    assert av.online(ids, 30.0).tolist() == [False, True, False, True]
    assert av.online_until(np.array([0, 1]), 21.0).tolist() == [30.0, math.inf]
    wrapped = Availability(av.offsets, av.start, av.end, period=40.0)
    assert wrapped.online(np.array([0]), 45.0).tolist() == [True]
    assert wrapped.online_until(np.array([0]), 45.0).tolist() == [50.0]
    cfg = load_config(None, ["clients.num_clients=4", f"fleet.availability={path}"])
    assert av.next_start(0.0) == 5.0 and av.next_start(10.0) == 20.0
    # touching rows are one session; a session through the wrap continues after it
    joined = read_availability(write(tmp_path / "j.csv", "client_id,start_s,end_s\n"
                                     "0,0,10\n0,50,60\n0,60,100\n"), 1, period=100.0)
    assert joined.start.tolist() == [0, 50] and joined.end.tolist() == [10, 100]
    assert joined.online_until(np.array([0]), 55.0).tolist() == [110.0]
    assert math.isinf(av.next_start(25.0)) and wrapped.next_start(25.0) == 40.0
    fleet = Fleet.of(cfg)
    for r in range(1, 20):
        got = fleet.sample(r, 2, 15.0)
        assert set(got) <= {1, 3} and len(got) == 2  # only the online ones
    assert fleet.sample(1, 3, 15.0) == [1, 3]  # fewer online than asked: all of them


def test_dropout_is_a_function_of_seed_round_and_client():
    cfg = load_config(None, ["clients.num_clients=1000", "fleet.dropout=0.3"])
    fleet = Fleet.of(cfg)
    ids = np.arange(1000)
    d = fleet.dropped(5, ids)
    assert 0.25 < d.mean() < 0.35
    assert np.array_equal(d[::-1], fleet.dropped(5, ids[::-1]))
    assert not np.array_equal(d, fleet.dropped(6, ids))


def test_fedbuff_staleness_weights_against_hand_computation():
    assert fedbuff_weight([0, 1, 3, 8]).tolist() == pytest.approx([1, 2 ** -0.5, 0.5, 1 / 3])
    g = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    ups = [AsyncUpdate(0, 5, {"w": np.array([0.3, 0.0])}, 0, g),
           AsyncUpdate(1, 5, {"w": np.array([0.0, 0.6])}, 1, g),
           AsyncUpdate(2, 5, {"w": np.array([-0.9, 0.9])}, 3, g)]
    new, _ = FedBuffPolicy(4, 3, SGD.of(lr=2.0)).aggregate_async(g, ups, 1)
    hand = np.array([1.0, 2.0]) + 2.0 / 3 * (np.array([0.3, 0.0]) + 2 ** -0.5 * np.array(
        [0.0, 0.6]) + 0.5 * np.array([-0.9, 0.9]))
    assert new["w"].tolist() == pytest.approx(hand.astype(np.float32).tolist(), abs=1e-7)
    base = {"w": np.array([0.0, 0.0], dtype=np.float32)}
    cur = {"w": np.array([1.0, 1.0], dtype=np.float32)}
    new, m = FedAsyncPolicy(2, alpha=0.6, a=0.5).aggregate_async(
        cur, [AsyncUpdate(0, 1, {"w": np.array([0.5, -0.5])}, 3, base)], 4)
    mix = 0.6 * 4 ** -0.5
    assert m["mixing"] == pytest.approx(mix)
    assert new["w"].tolist() == pytest.approx([(1 - mix) + mix * 0.5, (1 - mix) - mix * 0.5])


def test_fedbuff_weighted_reducer_against_a_hand_computed_sequence():
    """algorithm.reducer=weighted (FLSim's default): θ ← θ + η Σ sΔ / Σ s, two server steps
    by hand; the default buffer reducer divides the same sum by K instead."""
    from fedray.core.registry import make_method, method

    g = {"w": np.array([1.0, -1.0], dtype=np.float32)}
    cfg = load_config(None, ["algorithm.name=fedbuff", "algorithm.reducer=weighted",
                             "algorithm.buffer_size=2", "server.optimizer=sgd",
                             "server.lr=0.5"])
    weighted = make_method(method("fedbuff"), cfg).make_policy()
    assert weighted.reducer == "weighted" and weighted.buffer_size == 2
    step1 = [AsyncUpdate(0, 5, {"w": np.array([0.4, 0.2])}, 0, g),
             AsyncUpdate(1, 5, {"w": np.array([-0.2, 0.6])}, 3, g)]
    s1 = [1.0, 0.5]  # s(0), s(3)
    hand1 = np.array([1.0, -1.0]) + 0.5 * (s1[0] * np.array([0.4, 0.2])
                                           + s1[1] * np.array([-0.2, 0.6])) / sum(s1)
    g1, m1 = weighted.aggregate_async(g, step1, 1)
    assert g1["w"].tolist() == pytest.approx(hand1.astype(np.float32).tolist(), abs=1e-7)
    assert m1["mean_weight"] == pytest.approx(1.0)
    step2 = [AsyncUpdate(2, 5, {"w": np.array([1.0, 0.0])}, 8, g1),
             AsyncUpdate(3, 5, {"w": np.array([0.0, -0.3])}, 1, g1)]
    s2 = [1 / 3, 2 ** -0.5]  # s(8), s(1)
    hand2 = hand1.astype(np.float32).astype(np.float64) + 0.5 * (
        s2[0] * np.array([1.0, 0.0]) + s2[1] * np.array([0.0, -0.3])) / sum(s2)
    g2, _ = weighted.aggregate_async(g1, step2, 2)
    assert g2["w"].tolist() == pytest.approx(hand2.astype(np.float32).tolist(), abs=1e-7)
    buffered, _ = FedBuffPolicy(4, 2, SGD.of(lr=0.5)).aggregate_async(g1, step2, 2)
    hand_buffer = hand1.astype(np.float32).astype(np.float64) + 0.5 * (
        s2[0] * np.array([1.0, 0.0]) + s2[1] * np.array([0.0, -0.3])) / 2
    assert buffered["w"].tolist() == pytest.approx(hand_buffer.astype(np.float32).tolist(),
                                                   abs=1e-7)
    assert fedbuff_coefficients([8, 1], "weighted").sum() == pytest.approx(1.0)
    assert fedbuff_coefficients([8, 1]).sum() == pytest.approx(np.mean(s2))


def test_the_example_trace_is_valid_and_fedscale_pickles_convert_safely(tmp_path):
    import pickle

    devices, avail = write_example(str(tmp_path / "ex"), num_clients=50)
    cfg = load_config(None, ["clients.num_clients=50", f"fleet.trace={devices}",
                             f"fleet.availability={avail}"])
    assert Fleet.of(cfg).trace.known.all()
    cap = {"7": {"computation": 162.0, "communication": 5648.1},
           "3": {"computation": 20.0, "communication": 100.0}}
    beh = {"7": {"duration": 100, "active": [0, 50], "inactive": [20, 80], "finish_time": 100,
                 "model": "x"}}
    (tmp_path / "cap.pkl").write_bytes(pickle.dumps(cap))
    (tmp_path / "beh.pkl").write_bytes(pickle.dumps(beh))
    out = import_fedscale(str(tmp_path / "cap.pkl"), str(tmp_path / "fs"),
                          str(tmp_path / "beh.pkl"))
    assert open(out[0]).read().splitlines()[1:] == ["0,20.0,100.0,100.0",
                                                     "1,162.0,5648.1,5648.1"]
    assert open(out[2]).read().splitlines()[1:] == ["1,0.0,20.0", "1,50.0,80.0"]

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"1": Evil()}))
    with pytest.raises(ConfigError, match="plain dicts, lists and numbers only"):
        import_fedscale(str(tmp_path / "evil.pkl"), str(tmp_path / "fs2"))
    assert not (tmp_path / "pwned").exists()


# (file contents, the field/row/column the message must name, the rule)
TRACE_CASES = [
    ("trace", "client_id,down_kbps,up_kbps\n0,1,1\n", "fleet.trace", "compute_ms_per_sample"),
    ("trace", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n0,5,100,100\n1,0,1,1\n",
     "row 2 column compute_ms_per_sample", "a number > 0"),
    ("trace", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n0,5,-100,100\n",
     "row 1 column down_kbps", "a number > 0"),
    ("trace", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n0,5,100,abc\n",
     "column up_kbps", "numbers in every row"),
    ("trace", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n0,5,1,1\n9,5,1,1\n",
     "row 2 column client_id", "a client id in 0..3"),
    ("trace", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n1,5,1,1\n1,5,1,1\n",
     "row 2 column client_id", "one row per client"),
    ("availability", "client_id,start_s\n0,1\n", "fleet.availability", "end_s"),
    ("availability", "client_id,start_s,end_s\n0,10,20\n0,5,8\n", "row 2 column start_s",
     "in time order"),
    ("availability", "client_id,start_s,end_s\n0,0,20\n0,15,30\n", "row 2 column start_s",
     "in time order"),
    ("availability", "client_id,start_s,end_s\n0,20,10\n", "row 1 column end_s",
     "an end after the row's start_s"),
    ("availability", "client_id,start_s,end_s\n-1,0,10\n", "row 1 column client_id",
     "a client id in 0..3"),
]


@pytest.mark.parametrize("key,content,where,rule", TRACE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TRACE_CASES)])
def test_bad_trace_files(tmp_path, key, content, where, rule):
    path = write(tmp_path / "t.csv", content)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["clients.num_clients=4", f"fleet.{key}={path}"])
    text = str(err.value)
    assert where in text and rule in text and path in text, text
    assert "\n" not in text


def test_a_bad_trace_on_the_command_line_is_one_json_error_and_no_run_dir(tmp_path):
    import json

    from typer.testing import CliRunner

    from fedray.front.cli import app

    bad = write(tmp_path / "t.csv", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n"
                                    "0,5,1,1\n2,-5,1,1\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("clients: {num_clients: 4}\n")
    res = CliRunner().invoke(app, ["run", str(cfg), "-s", f"fleet.trace={bad}", "-o",
                                   str(tmp_path / "run"), "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code != 0 and "row 2 column compute_ms_per_sample" in out["error"]
    assert not (tmp_path / "run").exists()


def test_a_deadline_no_client_can_meet(trace3):
    with pytest.raises(ConfigError, match="fleet.deadline_s.*a deadline some client can meet"):
        load_config(None, ["clients.num_clients=3", f"fleet.trace={trace3}",
                           "fleet.deadline_s=0.001"])


def test_bad_fleet_and_population_settings():
    cases = [(["fleet.tier_speed={gpu: 2}"], "fleet.tier_speed.gpu"),
             (["fleet.dropout=1"], "fleet.dropout"),
             (["clients.num_clients=4", "clients.per_round=2", "fleet.min_reports=3"],
              "fleet.min_reports"),
             (["clients.tier_fractions=[0.5]", "runtime.tiers=[{name: a}, {name: b}]"],
              "clients.tier_fractions"),
             (["data.synthetic_per_client=5"], "data.synthetic_per_client"),
             (["data.dataset=parquet", "data.root=/nonexistent"], "data.root"),
             (["algorithm.name=fedbuff", "fleet.deadline_s=10"], "fleet.deadline_s"),
             # an asynchronous rule keeps algorithm.concurrency clients in flight: the
             # sampling of synchronous rounds and their minimum would change nothing
             (["algorithm.name=fedbuff", "clients.fraction=0.5"], "clients.fraction"),
             (["algorithm.name=fedasync", "clients.per_round=3"], "clients.per_round"),
             (["algorithm.name=fedbuff", "runtime.min_accepted=2"], "runtime.min_accepted"),
             (["algorithm.name=fedbuff", "clients.num_clients=4",
               "algorithm.concurrency=5"], "algorithm.concurrency"),
             (["algorithm.name=fedbuff", "clients.num_clients=4", "algorithm.concurrency=2",
               "algorithm.buffer_size=5"], "algorithm.buffer_size"),
             (["clients.num_clients=200000"], "eval.clients")]
    for overrides, field in cases:
        with pytest.raises(ConfigError) as err:
            load_config(None, overrides)
        assert f"config error at '{field}'" in str(err.value), (overrides, str(err.value))


def test_tier_fractions_follow_the_shares_without_a_list():
    cfg = load_config(None, ["clients.num_clients=100000", "clients.tier_fractions=[1, 3]",
                             "runtime.tiers=[{name: a}, {name: b}]"])
    tiers = [cfg.tier_of(c) for c in range(0, 100000, 7)]
    assert 0.23 < tiers.count("a") / len(tiers) < 0.27
    assert cfg.clients.tiers is None


@pytest.mark.parametrize("overrides", [
    ["clients.num_clients=40", "clients.tier_fractions=[1, 3]",
     "runtime.tiers=[{name: a}, {name: b}]"],
    ["clients.num_clients=6", "clients.tiers=[b, a, a, b, b, a]",
     "runtime.tiers=[{name: a}, {name: b}]"],
    ["clients.num_clients=40"],
])
def test_the_drivers_tier_lookups_agree_with_the_config(overrides):
    """roster.Tiers (the driver's cache; one tier without a mapping answers without a
    lookup): of, many and group give ExperimentConfig.tier_of's tiers."""
    from fedray.runtime.roster import Tiers

    cfg = load_config(None, overrides)
    clients = [5, 0, 3, 5, 1] + list(range(6, cfg.clients.num_clients, 3))
    want = [cfg.tier_of(c) for c in clients]
    tiers = Tiers(cfg)
    assert tiers.many(clients) == want
    assert [Tiers(cfg).of(c) for c in clients] == want
    groups = Tiers(cfg).group(clients)
    assert groups == {t: [c for c, u in zip(clients, want, strict=True) if u == t]
                      for t in dict.fromkeys(want)}
    assert Tiers(cfg).group([]) == {} and Tiers(cfg).many([]) == []


# ----------------------------------------------------------------------------- with Ray


def _rows(run_dir, kind="rounds"):
    from fedray.observe.metrics import read_metrics

    return read_metrics(str(run_dir), kind).to_pylist()


@pytest.mark.ray
def test_deadline_overcommit_and_min_reports_in_a_run(ray_session, tmp_path, trace3):
    from fedray.runtime import run_experiment

    devices = write(tmp_path / "dev.csv", "client_id,compute_ms_per_sample,down_kbps,up_kbps\n"
                    + "".join(f"{c},{[1, 4, 16, 64, 256, 1024][c]},100000,100000\n"
                              for c in range(6)))
    cfg = load_config(None, POP + ["clients.num_clients=6", "clients.per_round=3",
                                   "fleet.overcommit=1", f"fleet.trace={devices}",
                                   "fleet.deadline_s=2", "rounds=2", "fleet.min_reports=1"])
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    clients = [r for r in _rows(tmp_path / "run", "clients") if r["round"] == 1]
    fleet = Fleet.of(cfg)
    # 16 train samples at 1..1024 ms each (+ 50 ms latency): the three fastest report, the
    # fourth finishes in time but after K = 3 reports, 256 and 1024 ms/sample miss 2 s
    status = {r["client_id"]: r["status"] for r in clients}
    assert status == {0: "ok", 1: "ok", 2: "ok", 3: "surplus", 4: "late", 5: "late"}
    times = {r["client_id"]: r["sim_seconds"] for r in clients}
    want = fleet.seconds(np.arange(6), ["default"] * 6,
                         np.array([r["download_bytes"] for r in clients]),
                         np.array([clients[0]["upload_bytes"]] * 6), np.full(6, 16))["total"]
    assert [times[c] for c in range(6)] == pytest.approx(want.tolist(), rel=1e-12)
    rounds = _rows(tmp_path / "run")
    assert rounds[0]["sim_seconds"] == pytest.approx(times[2], rel=1e-12)  # the K-th report
    assert rounds[1]["cum_sim_seconds"] == pytest.approx(
        rounds[0]["sim_seconds"] + rounds[1]["sim_seconds"])
    assert [r["surplus"] for r in rounds] == [1, 1] and rounds[0]["late"] == 2
    assert all(r["upload_bytes"] == 0 for r in clients if r["status"] != "ok")
    assert summary["total_upload_bytes"] == 2 * 3 * clients[0]["upload_bytes"]

    # no client meets a 0.06 s deadline (16 samples at >= 1 ms + 50 ms latency): every round
    # fails, logged, the model never moves
    cfg = load_config(None, POP + ["clients.num_clients=6", "clients.per_round=3",
                                   f"fleet.trace={devices}", "fleet.deadline_s=0.06",
                                   "rounds=2", "fleet.min_reports=1", "eval.every=1"])
    run_experiment(cfg, str(tmp_path / "failing"), progress=False)
    rounds = _rows(tmp_path / "failing")
    assert [r["round_failed"] for r in rounds] == [1.0, 1.0]
    assert rounds[0]["global_accuracy"] == rounds[1]["global_accuracy"]
    assert [r["sim_seconds"] for r in rounds] == [0.06, 0.06]


@pytest.mark.ray
def test_availability_and_dropout_in_a_run(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    avail = write(tmp_path / "av.csv", "client_id,start_s,end_s\n"
                  + "".join(f"{c},0,0.001\n" for c in range(0, 20, 2)))
    cfg = load_config(None, POP + ["clients.num_clients=20", "clients.per_round=4", "rounds=3",
                                   f"fleet.availability={avail}", "fleet.dropout=0.25"])
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    clients = _rows(tmp_path / "run", "clients")
    first = [r for r in clients if r["round"] == 1]
    later = [r for r in clients if r["round"] > 1]
    # even clients are online only for the first millisecond: they go offline mid-round
    assert all(r["status"] == "dropped" for r in first if r["client_id"] % 2 == 0)
    assert all(r["client_id"] % 2 == 1 for r in later)  # and are never sampled again
    fleet = Fleet.of(cfg)
    for r in clients:
        if r["status"] == "dropped" and r["client_id"] % 2:
            assert fleet.dropped(r["round"], np.array([r["client_id"]]))[0]

    # no one online at the start: the first round is idle and the clock jumps to 3600 s
    late = write(tmp_path / "late.csv", "client_id,start_s,end_s\n"
                 + "".join(f"{c},3600,7200\n" for c in range(4)))
    cfg = load_config(None, POP + ["clients.num_clients=4", "clients.per_round=2", "rounds=2",
                                   f"fleet.availability={late}", "eval.every=1"])
    run_experiment(cfg, str(tmp_path / "idle"), progress=False)
    rounds = _rows(tmp_path / "idle")
    assert [r["round_failed"] for r in rounds] == [1.0, 0.0]
    assert rounds[0]["cum_sim_seconds"] == pytest.approx(3600.0) and rounds[1]["ok"] == 2


@pytest.mark.ray
def test_fedbuff_is_bitwise_the_same_with_one_two_or_three_executors(ray_session, tmp_path):
    from fedray.runtime import Experiment

    base = [o for o in POP if not o.startswith("runtime.tiers")] + [
        "algorithm.name=fedbuff", "algorithm.concurrency=5", "algorithm.buffer_size=3",
        "clients.num_clients=30", "rounds=4", "fleet.dropout=0.1",
        # client state (momentum kept between a client's rounds) across early computes,
        # checkpoints and the resume
        "local.momentum=0.9", "local.keep_optimizer_state=true"]
    states = []
    for n in (1, 2, 3):
        cfg = load_config(None, base + [f"runtime.tiers=[{{name: default, executors: {n}, "
                                        f"num_cpus: 0.5}}]"])
        exp = Experiment(cfg, str(tmp_path / f"e{n}"))
        try:
            exp.start()
            while not exp.done:
                exp.step()
            states.append(ray_session.get(exp.driver.get_global_state.remote()))
            exp.close()
        finally:
            exp.release()
    for other in states[1:]:
        assert all(np.array_equal(states[0][k], other[k]) for k in states[0])
    rows = _rows(tmp_path / "e1")
    assert [r["ok"] for r in rows] == [3, 3, 3, 3]
    assert rows[-1]["policy/mean_staleness"] > 0  # later uploads are stale
    cum = [r["cum_sim_seconds"] for r in rows]
    assert cum == sorted(cum) and cum[0] > 0
    # resumed after two server steps: bitwise the uninterrupted run
    cfg = load_config(None, base + ["runtime.tiers=[{name: default, executors: 2, "
                                    "num_cpus: 0.5}]"])
    exp = Experiment(cfg, str(tmp_path / "cut"))
    try:
        exp.start()
        exp.step()
        exp.step()
    finally:
        exp.release()
    exp = Experiment(cfg, str(tmp_path / "cut"), resume=True)
    try:
        exp.start()
        while not exp.done:
            exp.step()
        resumed = ray_session.get(exp.driver.get_global_state.remote())
        exp.close()
    finally:
        exp.release()
    assert all(np.array_equal(states[0][k], resumed[k]) for k in resumed)
    assert _rows(tmp_path / "cut")[-1]["cum_sim_seconds"] == cum[-1]


@pytest.mark.ray
def test_fedasync_runs_and_applies_every_upload(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    cfg = load_config(None, POP + ["algorithm.name=fedasync", "algorithm.concurrency=3",
                                   "clients.num_clients=10", "rounds=5"])
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    rows = _rows(tmp_path / "run")
    assert [r["ok"] for r in rows] == [1] * 5
    assert all(0 < r["policy/mixing"] <= 0.6 for r in rows)


@pytest.mark.parametrize("base", [0, 700])
def test_charge_downloads_is_charging_each_client_in_turn(base):
    """The round's downloads charged at once equal Ledger.charge client by client, and both
    the written-out rule: each attempt's broadcast, the base the first time only (a client
    met in an earlier round, or with no attempt, included), the same totals."""
    from fedray.runtime.ledger import Ledger

    sampled = [3, 8, 1, 5, 9]
    attempts = {3: 1, 8: 2, 1: 0, 5: 1, 9: 3}
    nbytes = {3: 100, 8: 100, 1: 40, 5: 40, 9: 100}
    fast, slow = Ledger(base), Ledger(base)
    fast.has_base, slow.has_base = {8}, {8}
    got = fast.charge_downloads(sampled, attempts, nbytes)
    want = {c: slow.charge(c, nbytes[c] * attempts[c]) for c in sampled}
    assert got == want and list(got) == sampled
    assert fast.totals == slow.totals and fast.has_base == slow.has_base
    assert got == {3: 100 + base, 8: 200, 1: base, 5: 40 + base, 9: 300 + base}
    assert fast.totals["download_bytes"] == 640 + 4 * base
    assert fast.has_base == ({1, 3, 5, 8, 9} if base else {8})
