"""Malicious clients as a role (issue #30, the attacks wired in): who is malicious (a pure
function of the seed, or a list / file of ids), what each attack does to a client's data,
its upload or — colluding — to the round's accepted uploads, the config checks before Ray,
and attacked runs through Ray: bitwise across executor counts and ``--resume``, every
client row marked, a backdoor's success rate on the global test set, the attack acting
before the transform chain (bytes honest), FedBuff and ORDERS attacked."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import full_and_resumed
from test_robust import refused
from test_runtime import final_state, run_outputs, runs_across_executors

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.methods.robust import attacks
from fedray.methods.robust.adversary import (
    Adversary,
    AdversaryConfig,
    attack_summary,
    malicious_ids,
)


def adversary(**kw) -> Adversary:
    n = kw.pop("num_clients", 10)
    return Adversary(AdversaryConfig(**kw), seed=3, num_clients=n, num_classes=10,
                     trigger_value=2.5)


def test_the_malicious_set_is_exact_and_a_function_of_the_seed_alone():
    cfg = AdversaryConfig(fraction=0.3)
    a = malicious_ids(cfg, 1000, seed=1)
    assert len(a) == 300 and np.all(np.diff(a) > 0) and 0 <= a[0] and a[-1] < 1000
    assert np.array_equal(a, malicious_ids(cfg, 1000, seed=1))
    assert not np.array_equal(a, malicious_ids(cfg, 1000, seed=2))
    assert len(malicious_ids(AdversaryConfig(fraction=0.299), 10)) == 2  # floor
    assert len(malicious_ids(AdversaryConfig(fraction=0.29), 100)) == 29  # not 28.999...
    adv = Adversary(cfg, 1, 1000)
    assert [adv.is_malicious(c) for c in range(1000)] == [c in set(a.tolist())
                                                          for c in range(1000)]


def test_ids_from_a_list_or_a_text_file(tmp_path):
    assert malicious_ids(AdversaryConfig(clients=[5, 1, 5]), 6).tolist() == [1, 5]
    f = tmp_path / "bad.txt"
    f.write_text("# the attackers\n4\n\n 2  # second\n")
    assert malicious_ids(AdversaryConfig(clients=str(f)), 6).tolist() == [2, 4]
    f.write_text("1\nsecret:x:0:0\n")
    with pytest.raises(ConfigError) as e:
        malicious_ids(AdversaryConfig(clients=str(f)), 6)
    assert "line 2" in str(e.value) and "secret" not in str(e.value)
    with pytest.raises(ConfigError, match="0..5"):
        malicious_ids(AdversaryConfig(clients=[6]), 6)
    f.write_text("3\n1\n")  # a run records the ids the file held when it was loaded
    cfg = load_config(None, ["clients.num_clients=6", f"adversary.clients={f}"])
    assert cfg.adversary.clients == [1, 3] and cfg.to_dict()["adversary"]["clients"] == [1, 3]


def test_solo_model_poisoning_touches_only_malicious_floating_tensors():
    up = {"w": np.array([1.0, -2.0], np.float32), "steps": np.array([3], np.int64)}
    flip = adversary(attack="sign_flip", clients=[2])
    assert flip.poison_upload(1, 1, up) is up  # honest: untouched
    got = flip.poison_upload(2, 1, up)
    assert got["w"].tolist() == [-1.0, 2.0] and got["w"].dtype == np.float32
    assert got["steps"].tolist() == [3]
    assert adversary(attack="scale", scale=-4, clients=[2]).poison_upload(2, 1, up)[
        "w"].tolist() == [-4.0, 8.0]
    noise = adversary(attack="gaussian", sigma=2.0, clients=[2])
    a, b = noise.poison_upload(2, 1, up)["w"], noise.poison_upload(2, 1, up)["w"]
    assert np.array_equal(a, b) and not np.array_equal(a, noise.poison_upload(2, 2, up)["w"])
    boost = adversary(attack="backdoor", boost=5.0, clients=[2])
    assert boost.poison_upload(2, 1, up)["w"].tolist() == [5.0, -10.0]
    assert adversary(attack="backdoor", clients=[2]).poison_upload(2, 1, up) is up
    assert adversary(attack="alie", clients=[2]).poison_upload(2, 1, up) is up  # driver's


def test_data_poisoning_of_a_malicious_clients_training_samples():
    x = np.random.default_rng(0).random((10, 1, 8, 8)).astype(np.float32)
    y = np.arange(10) % 10
    flip = adversary(attack="label_flip", clients=[1])
    assert flip.poison_data(0, 1, x, y)[1] is y
    assert flip.poison_data(1, 1, x, y)[1].tolist() == [9 - c for c in y]
    bd = adversary(attack="backdoor", target=7, poison_fraction=0.5, trigger_size=2,
                   clients=[1])
    px, py = bd.poison_data(1, 1, x, y)
    hit = np.flatnonzero((px != x).reshape(10, -1).any(1))
    assert len(hit) <= 5 and (py[hit] == 7).all()
    changed = np.flatnonzero(py != y)
    assert set(changed) <= set(hit) and len(changed) >= 4  # y == 7 may be drawn
    assert (px[hit][:, :, -2:, -2:] == 2.5).all()  # one value for every client
    assert np.array_equal(px, bd.poison_data(1, 1, x, y)[0])  # (seed, round, client)
    tx, ty = bd.triggered_test(x, y)  # every non-target test sample, triggered
    assert len(tx) == 9 and (ty == 7).all() and (tx[:, :, -2:, -2:] == 2.5).all()
    assert flip.triggered_test(x, y) is None


def uploads(rows):
    return [(c, 10, {"b": np.asarray(r[:1], np.float32), "a": np.asarray(r[1:], np.float32)})
            for c, r in rows]


@pytest.mark.parametrize("attack", ["alie", "ipm", "min_max", "min_sum"])
def test_colluding_attacks_replace_each_malicious_upload_by_the_crafted_one(attack):
    rng = np.random.default_rng(1)
    rows = [(c, rng.normal(size=4)) for c in range(6)]
    adv = adversary(attack=attack, clients=[1, 4], num_clients=6)
    out, metrics = adv.collude(uploads(rows))
    benign = np.stack([np.r_[r[1:], r[:1]].astype(np.float32).astype(np.float64)
                       for c, r in rows if c not in (1, 4)])  # name order: a, then b
    want = {"alie": lambda: attacks.alie(benign, 6, 2), "ipm": lambda: attacks.ipm(benign, 0.5),
            "min_max": lambda: attacks.min_max(benign), "min_sum": lambda: attacks.min_sum(
                benign)}[attack]().astype(np.float32)
    for (c, n, u), (_, _, orig) in zip(out, uploads(rows), strict=True):
        assert n == 10 and u["a"].shape == (3,) and u["a"].dtype == np.float32
        if c in (1, 4):
            assert np.array_equal(np.r_[u["a"], u["b"]], want)
        else:
            assert u is orig or all(np.array_equal(u[k], orig[k]) for k in u)
    assert metrics == {"adversary/malicious_accepted": 2.0, "adversary/colluded": 2.0}
    alone, m = adv.collude(uploads([(1, rows[1][1]), (4, rows[4][1])]))  # no benign upload
    assert m["adversary/colluded"] == 0.0 and np.array_equal(alone[0][2]["a"],
                                                              uploads(rows)[1][2]["a"])


def test_fltrust_scores_rescales_and_averages_against_the_servers_update():
    from fedray.methods.robust import rules

    g0 = np.array([3.0, 4.0])  # norm 5
    x = np.array([[6.0, 8.0], [0.0, 1.0], [-3.0, -4.0], [0.0, 0.0]])
    out = rules.fltrust(x, g0)
    ts = np.array([1.0, 0.8, 0.0, 0.0])  # cos: 1, 4/5, -1 -> 0, zero update -> 0
    assert np.allclose(out.kept, ts)
    want = (1.0 * np.array([3.0, 4.0]) + 0.8 * np.array([0.0, 5.0])) / 1.8
    assert np.allclose(out.aggregate, want)
    assert rules.fltrust(-x[:1], g0).aggregate.tolist() == [0.0, 0.0]  # nobody trusted


def test_alie_z_by_hand():
    """Baruch et al.: s = floor(n/2 + 1) - m, z = Phi^-1((n - s) / n); n = 6, m = 2: s = 2,
    Phi^-1(4/6) = 0.4307."""
    assert attacks.alie_z(6, 2) == pytest.approx(0.430727, abs=1e-6)
    b = np.array([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]])  # mean (2, 2), sd (1.633, 1.414)
    assert np.allclose(attacks.alie(b, 6, 2), [2 - 0.430727 * 1.632993, 2 - 0.430727 * 1.414214],
                       atol=1e-5)


def test_alie_z_past_a_malicious_majority_is_the_largest_it_reaches():
    assert attacks.alie_z(10, 6) == attacks.alie_z(10, 7) == pytest.approx(
        attacks.alie_z(10, 5)) and attacks.alie_z(1, 0) == 0.0


def test_the_summary_counts_detection_against_the_malicious_set():
    bad = np.array([1, 1, 0, 0, 0, 1], float)
    kept = np.array([0, 1, 0, 1, 0.5, 0])  # detected: excluded, kept = 0 -> rows 0, 2, 5
    got = attack_summary(AdversaryConfig(fraction=0.5), 6, 0, np.r_[bad, 1.0], (bad, kept),
                         0.25)
    assert got == {"attack": "none", "malicious_clients": 3, "malicious_client_rounds": 4,
                   "detection_precision": 2 / 3, "detection_recall": 2 / 3,
                   "mean_kept_malicious": 1 / 3, "mean_kept_benign": 0.5,
                   "final_attack_success_rate": 0.25}
    none = attack_summary(AdversaryConfig(clients=[1]), 6, 0, np.zeros(3),
                          (np.zeros(3), np.ones(3)), None)
    assert none["detection_precision"] is None and none["detection_recall"] is None


@pytest.mark.parametrize("extra, path, rule", [
    (["adversary.attack=sign_flip"], "adversary.fraction", "> 0, or adversary.clients"),
    (["adversary.fraction=0.5", "adversary.clients=[1]"], "adversary.clients", "one or the"),
    (["adversary.fraction=0.1"], "adversary.fraction", "floor(fraction * 6)"),
    (["adversary.fraction=1.0"], "adversary.fraction", "< 1"),
    (["adversary.fraction=-0.1"], "adversary.fraction", ">= 0"),
    (["adversary.attack=gaussian", "adversary.fraction=0.5", "adversary.sigma=0"],
     "adversary.sigma", "> 0"),
    (["adversary.clients=[6]"], "adversary.clients", "0..5"),
    (["adversary.attack=alie", "adversary.fraction=0.5", "runtime.reduce=executors"],
     "runtime.reduce", "every benign upload"),
    (["adversary.attack=min_max", "adversary.fraction=0.5", "algorithm.name=fedbuff",
      "algorithm.concurrency=3", "algorithm.buffer_size=2"], "adversary.attack",
     "synchronous round"),
    (["adversary.attack=scale", "adversary.fraction=0.5", "algorithm.name=drod"],
     "adversary.attack", "'attack' capability"),
    (["adversary.attack=backdoor", "adversary.fraction=0.5", "adversary.target=10"],
     "adversary.target", "0..9"),
    (["adversary.attack=backdoor", "adversary.fraction=0.5", "data.dataset=synthetic"],
     "adversary.trigger_size", "images (C, H, W)"),
    (["adversary.attack=label_flip", "adversary.fraction=0.5", "adversary.permutation=[1, 0]"],
     "adversary.permutation", "0..9"),
    (["adversary.attack=ipm", "adversary.fraction=0.5", "adversary.eps=0"], "adversary.eps",
     "> 0"),
])
def test_bad_adversary_configs_are_one_line_before_ray(extra, path, rule):
    refused(extra, path, rule)


@pytest.mark.ray
def test_attacked_runs_are_bitwise_across_executors_and_resume(ray_session, tiny_cfg,
                                                               tmp_path):
    """ALIE (colluding, on the driver) against the median with 1 and 2 executors; the same
    malicious clients honest (attack none) as the reference it must differ from; a
    boosted backdoor across a resume, with its success rate; every row marked."""
    alie = {"adversary.attack": "alie", "adversary.fraction": 0.34, "robust.rule": "median"}
    _, outputs = runs_across_executors(tiny_cfg, tmp_path, [1, 2, 3], **alie)
    bad = malicious_ids(AdversaryConfig(fraction=0.34), 6, seed=7).tolist()
    clients, rounds = outputs[0]["clients"], outputs[0]["rounds"]
    assert len(bad) == 2 and sorted(clients.loc[clients.malicious == 1, "client_id"].unique()
                                    ) == bad
    assert (rounds["adversary/colluded"] == 2).all()
    summary = outputs[0]["summary"]["adversary"]
    assert summary["malicious_clients"] == 2 and summary["malicious_client_rounds"] == 6
    assert summary["detection_recall"] is not None and "final_attack_success_rate" not in summary
    assert summary["mean_kept_malicious"] is not None
    assert (rounds["adversary/malicious_sampled"] == 2).all()
    from fedray.runtime import run_experiment

    run_experiment(tiny_cfg(**{**alie, "adversary.attack": "none"}), str(tmp_path / "honest"),
                   progress=False)
    honest = run_outputs(tmp_path / "honest")
    assert (honest["clients"].malicious == clients.malicious).all()
    a, b = final_state(tmp_path / "r0"), final_state(tmp_path / "honest")
    assert any(not np.array_equal(a[k], b[k]) for k in a)
    bd = tiny_cfg(**{"adversary.attack": "backdoor", "adversary.clients": "[0, 3]",
                     "adversary.boost": 2.0, "eval.global_test": "true", "rounds": 3})
    full_and_resumed(bd, tmp_path / "bd", stop_after=2)
    x, y = final_state(tmp_path / "bd" / "full"), final_state(tmp_path / "bd" / "cut")
    assert all(np.array_equal(x[k], y[k]) for k in x)
    out = run_outputs(tmp_path / "bd" / "cut")
    r = out["rounds"]
    assert r["attack_success_rate"].between(0, 1).all()
    assert out["summary"]["adversary"]["final_attack_success_rate"] == r[
        "attack_success_rate"].iloc[-1]
    assert rounds["adversary/detection_recall"].between(0, 1).all()  # median's, per round
    from fedray.front.report import compare, report

    rep = report(str(tmp_path / "bd" / "full"), str(tmp_path / "rep"))
    (fig,) = [f for f in rep["figures"] if f["path"].endswith("attack_vs_round.png")]
    assert len(fig["axes"]) == 1 and "success" in fig["axes"][0]["ylabel"]
    cmp = compare([str(tmp_path / d) for d in ("r0", "honest", "bd/full")],
                  str(tmp_path / "cmp"))
    names = [os.path.basename(f["path"]) for f in cmp["figures"]]
    assert "defences_vs_attacks.png" in names and "attack_vs_round.png" in names
    (heat,) = [f for f in cmp["figures"] if f["path"].endswith("defences_vs_attacks.png")]
    assert heat["axes"][0]["ylabel"] == "defence"
    assert r["attack_success_rate"].iloc[-1] > 0.5  # two boosted attackers of six: it works


@pytest.mark.ray
def test_attacks_act_before_the_chain_and_under_fedbuff_and_orders(ray_session, tiny_cfg,
                                                                    tmp_path):
    """A scaling attacker under top-k + int8 sends the bytes an honest client sends; under a
    fleet (over-commitment, dropouts) the colluding attackers are those whose uploads the
    server accepted; FedBuff (asynchronous) and ORDERS take sign-flipped and scaled uploads
    and mark their rows."""
    from fedray.runtime import run_experiment

    chain = {"payload.transforms": "[{name: topk, density: 0.2}, int8]", "rounds": 2}
    for name, extra in [("honest", {}), ("scaled", {"adversary.attack": "scale",
                                                    "adversary.clients": "[1, 2]"})]:
        run_experiment(tiny_cfg(**chain, **extra), str(tmp_path / name), progress=False)
    h, s = (run_outputs(tmp_path / n)["clients"] for n in ("honest", "scaled"))
    assert (h.upload_bytes == s.upload_bytes).all()
    assert not np.array_equal(h.train_loss.iloc[6:], s.train_loss.iloc[6:])  # round 2 moved
    fleet = {"clients.per_round": 4, "fleet.overcommit": 0.5, "fleet.dropout": 0.2,
             "adversary.attack": "min_max", "adversary.clients": "[0, 1, 2]", "rounds": 3}
    run_experiment(tiny_cfg(**fleet), str(tmp_path / "fleet"), progress=False)
    out = run_outputs(tmp_path / "fleet")
    rows, rounds = out["clients"], out["rounds"]
    reported = rows[rows.status == "ok"].groupby("round")["malicious"].sum()
    assert (rounds.set_index("round")["adversary/malicious_accepted"] == reported).all()
    assert (rows.status != "ok").any() and len(rows.groupby("round")) == 3  # the fleet acted
    for name, extra in [("fedbuff", {"algorithm.name": "fedbuff", "algorithm.concurrency": 3,
                                     "algorithm.buffer_size": 2,
                                     "adversary.attack": "sign_flip"}),
                        ("orders", {"algorithm.name": "orders", "adversary.attack": "scale",
                                    "adversary.scale": 20.0})]:
        run_experiment(tiny_cfg(**{"adversary.clients": "[1]", "rounds": 2, **extra}),
                       str(tmp_path / name), progress=False)
        rows = run_outputs(tmp_path / name)["clients"]
        assert set(rows.loc[rows.malicious == 1, "client_id"]) == {1}, name
        assert (rows.loc[rows.client_id != 1, "malicious"] == 0).all(), name


@pytest.mark.ray
def test_fltrust_trains_the_servers_update_and_shuts_out_sign_flippers(ray_session, tiny_cfg,
                                                                       tmp_path):
    """FLTrust's root update is trained on an executor each round from (seed, round, -1):
    bitwise with 1 and 2 executors; sign-flipped uploads point away from it, so their
    trust — their ``robust_kept`` — is 0 and the malicious ones are detected."""
    _, outputs = runs_across_executors(tiny_cfg, tmp_path, [1, 2], **{
        "robust.rule": "fltrust", "robust.root_samples": 50, "adversary.attack": "sign_flip",
        "adversary.clients": "[1, 4]"})
    rows = outputs[0]["clients"]
    assert (rows.loc[rows.malicious == 1, "robust_kept"] == 0).all()
    assert rows.loc[rows.malicious == 0, "robust_kept"].gt(0).mean() > 0.5
    adv = outputs[0]["summary"]["adversary"]
    assert adv["detection_recall"] == 1.0 and adv["mean_kept_malicious"] == 0.0


def test_the_root_dataset_is_drawn_from_training_splits_only(tiny_cfg):
    from fedray.core.registry import method
    from fedray.methods.robust import root_dataset

    cfg = tiny_cfg()
    data = method("fedavg").build_data(cfg)
    x, y = root_dataset(data, 40, cfg.seed)
    assert len(x) == 40 == len(y)
    assert np.array_equal(x, root_dataset(data, 40, cfg.seed)[0])
    test_rows = {r.tobytes() for c in range(data.num_clients)
                 for r in data.client_arrays(c, 0, "test")[0]} | {r.tobytes() for r in
                                                                  data.x_test}
    train_rows = {r.tobytes() for c in range(data.num_clients)
                  for r in data.client_arrays(c, 0, "train")[0]}
    test_only = test_rows - train_rows  # rows (duplicates aside) only in a test split
    assert test_only and all(r.tobytes() in train_rows for r in x)
    assert not any(r.tobytes() in test_only for r in x)
