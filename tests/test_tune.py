"""Sweeps over config keys with Ray Tune: spaces, validation, a real ASHA sweep, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml

from fedray.core.config import ConfigError
from fedray.front.tune import load_sweep, parse_space_arg, presets, trial_bundles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "fedray", "configs", "fedavg_digits.yaml")
SMALL = ["rounds=4", "clients.num_clients=6", "model.hidden=[16]", "eval.clients=none",
         "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"]


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
    args = dict(overrides=[*SMALL, "rounds=5"], storage_path=str(tmp_path), name="cut",
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
    res = sweep(DEMO, space, resume=True, **args)
    assert len(res.table) == 3 and all(r["rounds"] == 5 for r in res.table), [
        (r["rounds"], r["error"][-2000:]) for r in res.table]
    sessions = [json.load(open(os.path.join(r["run_dir"], "summary.json")))
                for r in res.table]
    assert any(s["rounds_this_session"] < 5 for s in sessions)  # resumed from a checkpoint
