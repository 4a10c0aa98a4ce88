"""Experiment tracking: what TensorBoard and MLflow hold after real runs, read back with the
libraries' own readers (EventAccumulator, MlflowClient); resume continues the same MLflow
run; a sweep logs through Tune's callbacks; bad tracking values are one-line config errors."""

from __future__ import annotations

import glob
import json
import math
import os
import socket

import numpy as np
import pytest
import yaml

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.observe.metrics import read_metrics
from fedray.observe.tracking import mlflow_key, numeric_columns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "fedray", "configs", "fedavg_digits.yaml")


WARM_RUNS = False  # conftest.warm_runs: a sweep's trials need the session's CPUs


def scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def tb_text(logdir: str, tag: str) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(logdir, size_guidance={"tensors": 0})
    acc.Reload()
    return [tensor_util.make_ndarray(e.tensor_proto).item().decode()
            for e in acc.Tensors(f"{tag}/text_summary")]


def mlflow_client(store):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store.as_uri())


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_keys_and_columns_as_the_backends_take_them():
    assert mlflow_key("tier/a b/accuracy") == "tier/a b/accuracy"
    assert mlflow_key("tier/x:y*/loss") == "tier/x_y_/loss"
    assert mlflow_key("policy//../n") == "policy/_/_/n"
    assert len(mlflow_key("k" * 400)) == 250
    row = {"round": 3, "global_accuracy": math.nan, "train_loss": 0.5, "ok": 4,
           "round_failed": False, "tier": "a", "cum_bytes": np.int64(7), "x": math.inf,
           "dp_epsilon": np.float64(1.25)}
    assert numeric_columns(row) == {"train_loss": 0.5, "ok": 4.0, "cum_bytes": 7.0,
                                    "dp_epsilon": 1.25}


def test_bad_tracking_values_fail_before_any_work_with_one_line(tmp_path, monkeypatch):
    from fedray.runtime import Experiment

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "file").write_text("not a directory")
    cases = [({"tracking.mlflow": "nosuchscheme://x/y"}, "tracking.mlflow", "MLflow can open"),
             ({"tracking.mlflow": f"http://127.0.0.1:{port}"}, "tracking.mlflow",
              "nothing answered"),
             ({"tracking.mlflow": "https://me:SECRET@mlflow.example"}, "tracking.mlflow",
              "without credentials"),
             ({"tracking.mlflow": str(tmp_path / "file")}, "tracking.mlflow", "is a file"),
             ({"tracking.mlflow": "''"}, "tracking.mlflow", "tracking URI"),
             ({"tracking.mlflow_experiment": "' '", "tracking.tensorboard": "true"},
              "tracking.mlflow_experiment", "non-empty")]
    for extra, field, rule in cases:  # at config time, or at the latest when the run opens
        with pytest.raises(ConfigError, match=rule) as err:
            Experiment(load_config(None, [f"{k}={v}" for k, v in extra.items()]),
                       str(tmp_path / "run"))
        text = str(err.value)
        assert err.value.path == field and "\n" not in text and "SECRET" not in text, text
        assert not (tmp_path / "run").exists()  # nothing of the run was written
    cfg = load_config(None, ["tracking.tensorboard=true"])
    with pytest.raises(ConfigError, match="a local run_dir"):
        Experiment(cfg, "mock:///runs/x")
    from fedray.front.tune import sweep

    with pytest.raises(ConfigError, match="tracking.mlflow"):  # a sweep: before Ray starts
        sweep(DEMO, {"local.lr": {"choice": [0.1]}}, overrides=["tracking.mlflow=no://x"],
              storage_path=str(tmp_path), name="bad")


@pytest.mark.ray
def test_every_round_and_the_config_reach_tensorboard_and_mlflow_across_a_resume(
        ray_session, tiny_cfg, tmp_path, monkeypatch):
    """Stopped after round 3 with the last checkpoint at round 2, then resumed: both
    backends hold rounds 1-4 once each, equal to rounds.parquet, in one MLflow run."""
    from fedray.runtime import Experiment, resume_config, run_experiment

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store, run_dir = tmp_path / "mlruns", str(tmp_path / "run")
    cfg = tiny_cfg(**{"rounds": 4, "runtime.checkpoint_every": 2, "name": "tracked",
                      "tracking.tensorboard": "true", "tracking.mlflow": str(store)})
    exp = Experiment(cfg, run_dir)
    exp.start()
    for _ in range(3):
        exp.step()
    exp.release()  # interrupted: round 3 is logged but not checkpointed
    client = mlflow_client(store)
    (run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    assert run.info.status == "FAILED"
    assert [s for s, _ in history(client, run.info.run_id, "global_accuracy")] == [1, 2, 3]

    summary = run_experiment(resume_config(run_dir), run_dir, resume=True, progress=False)
    assert summary["rounds_this_session"] == 2  # rounds 3 and 4 ran again
    table = read_metrics(run_dir, "rounds").to_pylist()
    want = [(r["round"], r["global_accuracy"]) for r in table]
    assert [s for s, _ in want] == [1, 2, 3, 4]

    logdir = os.path.join(run_dir, "tensorboard")
    got = scalars(logdir, "global_accuracy")  # the purge hides the first session's round 3
    assert [s for s, _ in got] == [1, 2, 3, 4]
    assert np.array_equal([v for _, v in got], np.float32([v for _, v in want]))
    assert [s for s, _ in scalars(logdir, "cum_bytes")] == [1, 2, 3, 4]
    assert "num_clients: 6" in tb_text(logdir, "config")[0]
    assert json.loads(tb_text(logdir, "summary")[-1].strip("`\n"))["rounds"] == 4

    (run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    state = json.loads((tmp_path / "run" / "tracking.json").read_text())
    assert run.info.run_id == state["mlflow_run_id"] and run.info.status == "FINISHED"
    assert history(client, run.info.run_id, "global_accuracy") == want  # no duplicate step
    assert [s for s, _ in history(client, run.info.run_id, "train_loss")] == [1, 2, 3, 4]
    assert history(client, run.info.run_id, "final_global_accuracy") == [
        (4, summary["final_global_accuracy"])]
    params = run.data.params
    assert params["clients.num_clients"] == "6" and params["rounds"] == "4"
    assert params["tracking.mlflow"] == str(store) and params["algorithm.name"] == "fedavg"
    local = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "art"))
    assert yaml.safe_load(open(local))["clients"]["num_clients"] == 6


@pytest.mark.ray
def test_a_sweep_logs_each_trial_through_tunes_callbacks(ray_session, tmp_path, monkeypatch):
    from fedray.front.tune import sweep

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    small = ["rounds=2", "clients.num_clients=6", "model.hidden=[16]", "eval.clients=none",
             "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]",
             "tracking.tensorboard=true", f"tracking.mlflow={store}"]
    res = sweep(DEMO, {"local.lr": {"grid": [0.1, 0.05]}}, overrides=small,
                storage_path=str(tmp_path), name="trk", scheduler="none")
    assert len(res.table) == 2 and not any(r["error"] for r in res.table)

    client = mlflow_client(store)
    runs = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    assert sorted(r.data.params["local.lr"] for r in runs) == ["0.05", "0.1"]
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags["fedray.sweep"] == "trk"
        assert [s for s, _ in history(client, r.info.run_id, "global_accuracy")] == [1, 2]
    events = sorted(glob.glob(str(tmp_path / "trk" / "*" / "events.out.tfevents.*")))
    assert len(events) == 2
    for e in events:
        assert [s for s, _ in scalars(os.path.dirname(e), "ray/tune/global_accuracy")] == [1, 2]
    for r in res.table:  # the trials' own trackers stay off: each trial is logged once
        assert not os.path.exists(os.path.join(r["run_dir"], "tensorboard"))
        assert not os.path.exists(os.path.join(r["run_dir"], "tracking.json"))
    # resumed after it ended: the trials only replay their rounds (on a sliver of a CPU),
    # logged nowhere again
    again = sweep(DEMO, {"local.lr": {"grid": [0.1, 0.05]}}, overrides=small,
                  storage_path=str(tmp_path), name="trk", scheduler="none", resume=True)
    assert [(r["trial"], r["rounds"], r["global_accuracy"]) for r in again.table] == [
        (r["trial"], r["rounds"], r["global_accuracy"]) for r in res.table]
    assert len(client.search_runs([client.get_experiment_by_name("trk").experiment_id])) == 2
    assert sorted(glob.glob(str(tmp_path / "trk" / "*" / "events.out.tfevents.*"))) == events
