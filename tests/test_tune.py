"""Sweeps over config keys with Ray Tune: spaces, validation, a real ASHA sweep, resume."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml

from fedray.core.config import ConfigError
from fedray.core.storage import StateFileError
from fedray.front.tune import load_sweep, parse_space_arg, presets, trial_bundles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "fedray", "configs", "fedavg_digits.yaml")
SMALL = ["rounds=4", "clients.num_clients=6", "model.hidden=[16]", "eval.clients=none",
         "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"]


class Planted:
    """Unpickling it creates a file: the test that a sweep's resume reads no pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


WARM_RUNS = False  # conftest.warm_runs: Tune's trials need the session's CPUs


def test_space_syntax_and_validation():
    assert parse_space_arg("algorithm.theta=grid:0,0.5,1") == (
        "algorithm.theta", {"grid": [0, 0.5, 1]})
    assert parse_space_arg("local.lr=loguniform:1e-3,0.1")[1] == {"loguniform": [1e-3, 0.1]}
    with pytest.raises(ConfigError, match="--space"):
        parse_space_arg("local.lr")
    cfg, _, _, spec = load_sweep(DEMO, SMALL, {"local.lr": {"choice": [0.01, 0.1]}})
    assert spec.metric == "global_accuracy" and spec.scheduler == "asha"
    bad = [({"local.lr": {"normal": [0, 1]}}, "sweep.space.local.lr"),
           ({"local.lr": {"uniform": [0.1, 0.01]}}, "low < high"),
           ({"local.lr": {"loguniform": [0, 1]}}, "positive"),
           ({"local.lrr": {"choice": [0.1]}}, "local.lrr"),
           ({"local.lr": {"choice": [-1.0]}}, "local.lr"),
           ({}, "at least one key")]
    for space, match in bad:
        with pytest.raises(ConfigError, match=match):
            load_sweep(DEMO, SMALL, space)
    with pytest.raises(ConfigError, match="algorithm.theta"):  # θ needs a DROD config
        load_sweep(DEMO, SMALL, preset="drod")
    with pytest.raises(ConfigError, match="--preset"):
        load_sweep(DEMO, SMALL, preset="nope")
    with pytest.raises(ConfigError, match="grace_period"):
        load_sweep(DEMO, SMALL, {"local.lr": {"choice": [0.1]}}, grace_period=9)


def test_sweep_block_in_the_config_file_and_presets(tmp_path):
    import yaml

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({
        "algorithm": {"name": "orders"}, "clients": {"num_clients": 9},
        "sweep": {"space": {"local.lr": {"grid": [0.01, 0.1]}}, "max_concurrent": 2,
                  "metric": "personalized_accuracy"}}))
    cfg, base, _, spec = load_sweep(path, [], preset="orders")
    assert "sweep" not in base and spec.max_concurrent == 2
    assert spec.metric == "personalized_accuracy"
    assert spec.space["algorithm.gamma"] == {"uniform": [3.0, 4.5]}  # N/3 .. N/2
    assert set(presets()) == {"drod", "orders", "flite", "favor"}
    path.write_text(yaml.safe_dump({"sweep": {"spaces": {}}}))
    with pytest.raises(ConfigError, match="sweep"):
        load_sweep(path, [], {"local.lr": {"choice": [0.1]}})
    cfg = load_sweep(DEMO, ["runtime.device=cuda",
                            "runtime.tiers=[{name: a, executors: 2, num_cpus: 0.5, "
                            "num_gpus: 0.25, resources: {tier_a: 1}}]"],
                     {"local.lr": {"choice": [0.1]}})[0]
    assert trial_bundles(cfg) == [{"CPU": 1.0}] + [{"CPU": 0.5, "GPU": 0.25,
                                                     "tier_a": 1}] * 2


def test_the_trial_list_is_a_rule_on_the_space_and_the_seed():
    from fedray.front.tune import SweepSpec, trial_params

    spec = SweepSpec({"local.lr": {"loguniform": [1e-3, 0.1]}, "algorithm.mu": {"grid": [0, 1]},
                      "local.epochs": {"randint": [1, 4]}, "local.momentum": {"choice":
                                                                               [0.0, 0.9]},
                      "local.batch_size": {"grid": [8, 16, 32]}}, num_samples=3)
    trials = trial_params(spec, seed=7)
    assert len(trials) == 18 and trials == trial_params(spec, seed=7)
    assert trials != trial_params(spec, seed=8)
    # num_samples times the grid, the first grid key slowest
    assert [(t["algorithm.mu"], t["local.batch_size"]) for t in trials[:6]] == [
        (0, 8), (0, 16), (0, 32), (1, 8), (1, 16), (1, 32)]
    assert trials[6:12] != trials[:6] and trials[6]["algorithm.mu"] == 0
    for t in trials:
        assert 1e-3 <= t["local.lr"] < 0.1 and isinstance(t["local.lr"], float)
        assert t["local.epochs"] in (1, 2, 3) and type(t["local.epochs"]) is int
        assert t["local.momentum"] in (0.0, 0.9)
    assert len({t["local.lr"] for t in trials}) == 18  # drawn per trial
    assert {t["local.epochs"] for t in trials} == {1, 2, 3}
    assert {t["local.momentum"] for t in trials} == {0.0, 0.9}
    # one trial's values do not depend on how many trials follow it
    assert trial_params(SweepSpec(spec.space, num_samples=1), seed=7) == trials[:6]


def test_a_sweeps_state_is_data_checked_before_ray(tmp_path):
    """sweep.json is written at a new sweep's start, read back as data on --resume and
    checked (the same base config and trials); trial runs are never reused without
    --resume, or resumed without it."""
    from fedray.core.storage import Storage
    from fedray.front.tune import SweepSpec, begin_state, state_head, trial_params

    trials = trial_params(SweepSpec({"local.lr": {"grid": [0.1, 0.05]}}), seed=0)
    config = json.loads(json.dumps(load_sweep(DEMO, SMALL, {"local.lr": {"grid": [0.1]}}
                                              )[0].to_dict()))
    head = {"config": config, "trials": trials}
    store = Storage(str(tmp_path / "s"))

    def refused(h, resume, match, errors=ConfigError):
        """The one-line refusal, with nothing in the sweep directory changed."""
        files = lambda: {p: p.read_bytes() for p in sorted((tmp_path / "s").rglob("*"))  # noqa
                         if p.is_file()}
        before = files()
        with pytest.raises(errors, match=match) as err:
            begin_state(store, h, resume=resume, name="s")
        assert files() == before and "\n" not in str(err.value)
        return err.value

    assert begin_state(store, head, resume=False, name="s") == set()
    state = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert state == {"config": config, "trials": [{"local.lr": 0.1}, {"local.lr": 0.05}],
                     "ended": []}
    assert begin_state(store, head, resume=False, name="s") == set()  # no trial ran yet
    (tmp_path / "s" / "runs" / "trial-00000").mkdir(parents=True)
    assert refused(head, False, "--resume to continue").path == "--name"
    (tmp_path / "s" / "sweep.json").write_text(json.dumps({**state, "ended": [1]}))
    assert begin_state(store, head, resume=True, name="s") == {1}
    other = trial_params(SweepSpec({"local.lr": {"grid": [0.1, 0.02]}}), 0)
    refused({**head, "trials": other}, True, "lists other trials")
    changed = {**config, "local": {**config["local"], "epochs": 3}}
    assert refused({**head, "config": changed}, True,
                   "config of the sweep being resumed").path == "local.epochs"
    for bad in (b"[1]", b'{"trials": [], "ended": [5]}', b'{"trials": [], "ended": [true]}',
                b"\xff", b'{"trials": 1}'):
        (tmp_path / "s" / "sweep.json").write_bytes(bad)
        refused(head, True, "sweep's state as fedray writes it", (ConfigError, StateFileError))
    (tmp_path / "s" / "sweep.json").write_text(json.dumps({"trials": trials, "ended": []}))
    refused(head, True, "written before it held one")  # no config in it
    (tmp_path / "s" / "sweep.json").unlink()
    refused(head, True, "no sweep.json")  # an older sweep: Tune's pickle
    assert not (tmp_path / "s" / "sweep.json").exists()
    for key, spec in [("rounds", {"grid": [2, 4]}), ("run_dir", {"choice": ["a"]})]:
        with pytest.raises(ConfigError, match=f"a key other than {key}"):
            load_sweep(DEMO, SMALL, {key: spec})
    for bounds in ([0.0, float("inf")], [0, 10 ** 400], [True, 2]):
        with pytest.raises(ConfigError, match="finite"):
            load_sweep(DEMO, SMALL, {"local.lr": {"uniform": bounds}})
    # values JSON holds otherwise (a tuple from the Python API) still resume
    tuples = trial_params(SweepSpec({"model.hidden": {"grid": [(16,), (8,)]}}), seed=0)
    tstore = Storage(str(tmp_path / "t"))
    thead = state_head(load_sweep(DEMO, SMALL, {"local.lr": {"grid": [0.1]}})[0], tuples)
    begin_state(tstore, thead, resume=False, name="t")
    assert begin_state(tstore, thead, resume=True, name="t") == set()


@pytest.mark.ray
def test_a_trial_that_cannot_fit_fails_before_running(ray_session, tmp_path, monkeypatch):
    from fedray.front.tune import sweep

    monkeypatch.setenv("FEDRAY_CHECK_TRIAL_FITS", "1")
    big = [*SMALL, "runtime.tiers=[{name: default, executors: 3, num_cpus: 1}]"]
    with pytest.raises(ConfigError, match="needs 4 CPU"):
        sweep(DEMO, {"local.lr": {"choice": [0.1]}}, overrides=big,
              storage_path=str(tmp_path), name="big")


@pytest.mark.ray
def test_real_sweep_with_asha_stopping_weak_trials(ray_session, tmp_path):
    from fedray.front.tune import sweep

    res = sweep(DEMO, {"local.lr": {"grid": [0.1, 0.05, 0.002, 0.001]}}, overrides=SMALL,
                storage_path=str(tmp_path), name="asha", grace_period=1)
    assert len(res.table) == 4 and not any(r["error"] for r in res.table)
    assert res.best_config == {"local.lr": 0.1}
    stopped = [r for r in res.table if r["stopped_early"]]
    assert stopped and all(r["rounds"] < 4 for r in stopped)
    assert any(r["rounds"] == 4 for r in res.table)
    table = pq.read_table(res.parquet).to_pylist()
    assert [r["local.lr"] for r in table] == [r["local.lr"] for r in res.table]
    assert "Best global_accuracy" in open(res.markdown).read()
    for r in res.table:  # every trial is an ordinary fedray run directory
        assert os.path.exists(os.path.join(r["run_dir"], "checkpoints", "LATEST"))
        # the device and placement timeout were settled once by the sweep, not per trial
        runtime = yaml.safe_load(open(os.path.join(r["run_dir"], "config.yaml")))["runtime"]
        assert runtime["device"] == "auto" and runtime["placement_timeout_s"] == 1800.0


@pytest.mark.ray
def test_interrupted_sweep_resumes(ray_session, tmp_path):
    """Kill the sweep's process while a trial is mid-run; `resume` finishes every trial and
    the interrupted one continues from its own round checkpoint."""
    from fedray.front.tune import sweep

    space = {"local.lr": {"grid": [0.1, 0.05, 0.02]}}
    # 20 rounds: the second trial is still running when the sweep is killed (a round takes
    # tens of ms; with 5 it could finish between the poll and the kill)
    args = dict(overrides=[*SMALL, "rounds=20"], storage_path=str(tmp_path), name="cut",
                scheduler="none")
    code = (f"import json, ray; from fedray.front.tune import sweep; ray.init(address='auto'); "
            f"sweep({DEMO!r}, {space!r}, **json.loads({json.dumps(json.dumps(args))}))")
    env = dict(os.environ, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = tmp_path / "cut" / "runs"
    deadline = time.time() + 300
    try:
        while time.time() < deadline:  # the second trial has checkpointed a round or two
            done = sorted(runs.glob("*/checkpoints/LATEST")) if runs.exists() else []
            if len(done) >= 2:
                break
            time.sleep(0.2)
        assert len(done) >= 2, "the sweep never reached its second trial"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    marker = tmp_path / "PLANTED"  # a pickle in Tune's state file must never be loaded
    planted = pickle.dumps(Planted(str(marker)))
    for f in [tmp_path / "cut" / "tuner.pkl", *(tmp_path / "cut").glob("experiment_state*")]:
        f.write_bytes(planted)
    res = sweep(DEMO, space, resume=True, **args)
    assert not marker.exists()
    assert len(res.table) == 3 and all(r["rounds"] == 20 for r in res.table), [
        (r["rounds"], r["error"][-2000:]) for r in res.table]
    assert sorted(r["trial"] for r in res.table) == ["trial-00000", "trial-00001",
                                                     "trial-00002"]
    state = json.loads((tmp_path / "cut" / "sweep.json").read_text())
    assert state["ended"] == [0, 1, 2] and [t["local.lr"] for t in state["trials"]] == [
        0.1, 0.05, 0.02]
    sessions = [json.load(open(os.path.join(r["run_dir"], "summary.json")))
                for r in res.table]
    # resumed from a checkpoint
    assert any(0 < s["rounds_this_session"] < 20 for s in sessions), [
        (r["trial"], s["rounds_this_session"]) for r, s in zip(res.table, sessions, strict=True)]


def test_the_sweep_progress_counts_the_rounds_trials_really_ran():
    """Four trials of 4 rounds, three stopped by ASHA after round 1: the bar ends at 7 of
    7 rounds (it once said 16/16 although 7 ran), and counts 4 for a trial not yet seen."""
    from types import SimpleNamespace

    from fedray.front.tune import rounds_callback

    class Stage:
        def __init__(self):
            self.shown = []

        def report(self, done, total=None, note=None):
            self.shown.append((done, total, note))

    stage = Stage()
    cb = rounds_callback(stage, rounds=4, n_trials=4)
    trials = [SimpleNamespace(trial_id=f"t{i}") for i in range(4)]
    cb.on_trial_result(0, trials, trials[0], {"round": 1})
    assert stage.shown[-1][:2] == (1, 16)
    for t in trials[1:]:
        cb.on_trial_result(0, trials, t, {"round": 1})
        cb.on_trial_complete(0, trials, t)  # stopped early by the scheduler
    assert stage.shown[-1] == (4, 7, "3/4 trials ended")
    for r in (2, 3, 4):
        cb.on_trial_result(0, trials, trials[0], {"round": r})
    cb.on_trial_complete(0, trials, trials[0])
    assert stage.shown[-1] == (7, 7, "4/4 trials ended")
