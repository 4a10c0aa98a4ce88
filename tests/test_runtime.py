"""The Ray runtime for real: determinism across executor counts, tiers, fractional GPUs,
client state, fault tolerance, NaN rejection, placement errors, bytes and metrics."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import full_and_resumed
from ray import cloudpickle as ray_cloudpickle

from fedray.core import checkpoint
from fedray.core.config import load_config
from fedray.core.storage import Storage
from fedray.methods.fedavg.method import FedAvg
from fedray.runtime import Experiment, run_experiment
from fedray.runtime.pool import PlacementError
from fedray.wire.payload import Payload

ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.ray


def final_state(run_dir):
    return checkpoint.read(Storage(str(run_dir)))["server"]["params"]


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


TIMING = {"seconds", "wall_seconds", "executor", "run_dir", "rounds_this_session"}


def run_outputs(run_dir) -> dict:
    """rounds.parquet, clients.parquet (sorted by round, client) and summary.json without
    the timing and executor columns."""
    import json

    rounds = pq.read_table(run_dir / "rounds.parquet").to_pandas()
    clients = pq.read_table(run_dir / "clients.parquet").to_pandas()
    clients = clients.sort_values(["round", "client_id"]).reset_index(drop=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"rounds": rounds.drop(columns=[c for c in rounds if c in TIMING]),
            "clients": clients.drop(columns=[c for c in clients if c in TIMING]),
            "summary": {k: v for k, v in summary.items() if k not in TIMING}}


def assert_same_outputs(a: dict, b: dict) -> None:
    """Bitwise: every float column compared by its bits, NaN included."""
    assert a["summary"] == b["summary"]
    for table in ("rounds", "clients"):
        x, y = a[table], b[table]
        assert list(x.columns) == list(y.columns) and len(x) == len(y), table
        for col in x.columns:
            if x[col].dtype.kind == "f":
                assert np.array_equal(x[col].values.view(np.int64),
                                      y[col].values.view(np.int64)), (table, col)
            else:
                assert x[col].equals(y[col]), (table, col)


def runs_across_executors(tiny_cfg, tmp_path, counts: list[int], **overrides
                          ) -> tuple[list[dict], list[dict]]:
    """``tiny_cfg(**overrides)`` run with each executor count into tmp_path/r{i}; asserts
    every run's final state and outputs bitwise equal to the first's. Returns (states,
    outputs) in run order."""
    states, outputs = [], []
    for i, n in enumerate(counts):
        cfg = tiny_cfg(**overrides, **{
            "runtime.tiers": f"[{{name: default, executors: {n}, num_cpus: 0.5}}]"})
        run_experiment(cfg, str(tmp_path / f"r{i}"), progress=False)
        states.append(final_state(tmp_path / f"r{i}"))
        outputs.append(run_outputs(tmp_path / f"r{i}"))
    for s, o in zip(states[1:], outputs[1:], strict=True):
        assert_bitwise_equal(states[0], s)
        assert_same_outputs(outputs[0], o)
    return states, outputs


def test_bitwise_identical_with_1_2_3_executors_and_across_runs(ray_session, tiny_cfg, tmp_path):
    """The final state and every metric (rounds, clients, summary) are bitwise the same with
    1, 2 or 3 executors and across runs; per-client evaluations are reduced in client-id
    order, not in finish order."""
    _, outputs = runs_across_executors(
        tiny_cfg, tmp_path, [1, 2, 3, 2], **{"clients.fraction": 0.67, "local.momentum": 0.5,
                                             "local.keep_optimizer_state": "true",
                                             "runtime.chunk_size": 1})
    assert outputs[0]["rounds"]["personalized_accuracy"].notna().all()
    clients = pq.read_table(tmp_path / "r2" / "clients.parquet").to_pandas()
    assert clients["executor"].dropna().nunique() == 3


def test_metrics_bytes_and_outputs(ray_session, tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"payload.upload": "int8", "eval.local_before_after": "true"})
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    run = tmp_path / "run"
    for f in ["config.yaml", "data.json", "summary.json", "rounds.parquet", "clients.parquet"]:
        assert (run / f).exists(), f
    rounds = pq.read_table(run / "rounds.parquet").to_pandas()
    clients = pq.read_table(run / "clients.parquet").to_pandas()
    assert list(rounds["round"]) == [1, 2, 3]
    g = final_state(run)
    down = Payload.encode(g, "fp32").nbytes
    up = Payload.encode(g, "int8").nbytes
    trained = clients[clients["sampled"]]
    assert (trained["download_bytes"] == down).all()
    assert (trained["upload_bytes"] == up).all()
    assert rounds["upload_bytes"].sum() == summary["total_upload_bytes"] == up * 6 * 3
    assert rounds["cum_bytes"].iloc[-1] == (up + down) * 18
    assert {"acc_before", "acc_after", "train_loss", "eval_accuracy"} <= set(clients.columns)
    assert rounds["global_accuracy"].notna().all()
    assert 0 <= summary["final_personalized_accuracy"] <= 1


def test_tiers_and_fractional_gpu_placement(ray_session, tiny_cfg, tmp_path):
    """Clients of tier T run only on tier-T executors; GPU executors get 0.25 of the
    declared (fake) GPU, so four share it and CUDA_VISIBLE_DEVICES is set; an executor of a
    tier without a GPU share is granted no GPU and runs on the CPU (it used to take cuda:0
    whenever torch saw a GPU)."""
    cfg = tiny_cfg(**{
        "runtime.tiers": "[{name: big, executors: 1, num_cpus: 0.25, num_gpus: 0.25},"
                         " {name: small, executors: 2, num_cpus: 0.25, num_gpus: 0.25},"
                         " {name: cpu, executors: 1, num_cpus: 0.25}]",
        "clients.tiers": "[big, small, small, big, small, cpu]", "rounds": 2})
    exp = Experiment(cfg, str(tmp_path / "t"))
    info = exp.start()
    try:
        assert exp.cfg.runtime.device == "auto"  # not this run's local Ray: as written
        assert sorted(e["tier"] for e in info["executors"]) == ["big", "cpu", "small", "small"]
        gpu = [e for e in info["executors"] if e["tier"] != "cpu"]
        assert all(e["cuda_visible_devices"] != "" and e["gpu_ids"] for e in gpu)
        (cpu,) = [e for e in info["executors"] if e["tier"] == "cpu"]
        assert cpu["gpu_ids"] == [] and cpu["device"] == "cpu"
        # a declared GPU on a node without CUDA: granted, but the work runs on the CPU
        assert all(e["device"] == ("cuda" if e["cuda_available"] else "cpu") for e in gpu)
        while not exp.done:
            exp.step()
        exp.close()
    finally:
        exp.release()
    clients = pq.read_table(tmp_path / "t" / "clients.parquet").to_pandas()
    trained = clients[clients["sampled"]]
    assert (trained["executor"].str.split("/").str[0] == trained["tier"]).all()
    assert set(trained[trained["tier"] == "big"]["client_id"]) == {0, 3}
    assert set(trained[trained["tier"] == "cpu"]["client_id"]) == {5}


def test_unplaceable_executors_fail_clearly(ray_session, tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"runtime.tiers": "[{name: default, executors: 3, num_cpus: 1}]",
                      "runtime.placement_timeout_s": 3})
    exp = Experiment(cfg, str(tmp_path / "p"))
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match="placement_timeout_s"):
        exp.start()
    assert time.monotonic() - t0 < 60
    exp.release()


def test_static_fit_check_names_the_shortfall(ray_session, tiny_cfg):
    from fedray.runtime.pool import check_fits

    check_fits(tiny_cfg())
    with pytest.raises(PlacementError, match=r"ask for 4 CPU .* has 2 CPU"):
        check_fits(tiny_cfg(**{"runtime.tiers": "[{name: d, executors: 8, num_cpus: 0.5}]"}))
    with pytest.raises(PlacementError, match="GPU"):
        check_fits(tiny_cfg(**{"runtime.device": "cuda", "runtime.tiers":
                               "[{name: d, executors: 8, num_cpus: 0, num_gpus: 0.25}]"}))


class FlakyFedAvg(FedAvg):
    """Client 1 always raises; client 2 uploads NaN."""

    name = "flaky-fedavg"

    def client_update(self, ctx, broadcast):
        if ctx.client_id == 1:
            raise RuntimeError("disk on fire")
        out = super().client_update(ctx, broadcast)
        if ctx.client_id == 2:
            first = next(iter(out.upload))
            out.upload[first][...] = np.nan
        return out


@pytest.mark.parametrize("reduce", ["driver", "executors"])
def test_failing_client_recorded_and_nan_rejected(ray_session, tiny_cfg, tmp_path, reduce):
    cfg = tiny_cfg(**{"runtime.max_client_retries": 2, "rounds": 2, "runtime.reduce": reduce})
    summary = run_experiment(cfg, str(tmp_path / "f"), progress=False,
                             algorithm_cls=FlakyFedAvg)
    clients = pq.read_table(tmp_path / "f" / "clients.parquet").to_pandas()
    c1 = clients[(clients["client_id"] == 1) & clients["sampled"]]
    assert (c1["status"] == "error").all() and (c1["attempts"] == 3).all()
    assert c1["error"].str.contains("disk on fire").all()
    c2 = clients[(clients["client_id"] == 2) & clients["sampled"]]
    assert (c2["status"] == "rejected").all() and c2["error"].str.contains("NaN").all()
    rounds = pq.read_table(tmp_path / "f" / "rounds.parquet").to_pandas()
    assert (rounds["failed"] == 1).all() and (rounds["rejected"] == 1).all()
    assert (rounds["ok"] == 4).all()
    assert summary["client_failures"] == 2 and summary["rejected_uploads"] == 2
    state = final_state(tmp_path / "f")
    assert all(np.isfinite(v).all() for v in state.values())


class BrokenFedAvg(FedAvg):
    """Every client raises."""

    name = "broken-fedavg"

    def client_update(self, ctx, broadcast):
        raise RuntimeError(f"no data for client {ctx.client_id}")


def test_a_round_without_enough_accepted_uploads_stops_the_run(ray_session, tiny_cfg,
                                                                 tmp_path):
    """A round in which every client fails used to "succeed": the model stayed put and the
    run ended with exit 0 and untrained results."""
    from fedray.runtime.jobs import RoundFailedError

    cfg = tiny_cfg(**{"runtime.max_client_retries": 0, "rounds": 2})
    with pytest.raises(RoundFailedError, match=r"round 1: 0 accepted uploads, "
                                               r"runtime.min_accepted is 1; client 0 error: "
                                               r"RuntimeError: no data for client 0"):
        run_experiment(cfg, str(tmp_path / "b"), progress=False, algorithm_cls=BrokenFedAvg)
    assert not (tmp_path / "b" / "checkpoints" / "LATEST").exists()
    assert not (tmp_path / "b" / "summary.json").exists()
    part = pq.read_table(tmp_path / "b" / "metrics").to_pandas()  # the round is on record
    rows = part[part["client_id"].notna()] if "client_id" in part else part
    assert len(rows) > 0
    # min_accepted = 0 lets a user opt out: the rounds pass, the model is unchanged
    free = tiny_cfg(**{"runtime.max_client_retries": 0, "rounds": 1,
                       "runtime.min_accepted": 0})
    summary = run_experiment(free, str(tmp_path / "free"), progress=False,
                             algorithm_cls=BrokenFedAvg)
    assert summary["rounds"] == 1 and summary["client_failures"] == 6


def test_all_uploads_rejected_exits_non_zero(ray_session, tmp_path):
    """End to end through a job script: NaN uploads from every client are rejected, the
    round fails, the process exits non-zero and says why."""
    from conftest import job_process

    res = job_process(ray_session, "fedavg_digits.py", "--smoke", "--no-progress",
                      "--run-dir", str(tmp_path / "nan"), "-s", "local.lr=1.0e+30",
                      "-s", "rounds=2")
    assert res.returncode != 0
    assert "round 1: 0 accepted uploads" in res.stderr and "NaN" in res.stderr
    assert not (tmp_path / "nan" / "summary.json").exists()


class CudaCrashFedAvg(FedAvg):
    """Client 1's first attempt hits an error that poisons a CUDA context."""

    name = "cuda-crash-fedavg"
    marker = ""

    def client_update(self, ctx, broadcast):
        import os

        if ctx.client_id == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().client_update(ctx, broadcast)


def test_fatal_device_error_replaces_the_executor(ray_session, tiny_cfg, tmp_path):
    """After an illegal memory access every later kernel of that process fails: the
    executor exits, the pool replaces it and re-runs its clients; nothing is lost."""
    CudaCrashFedAvg.marker = str(tmp_path / "crashed")
    cfg = tiny_cfg(**{"rounds": 1, "runtime.max_client_retries": 1})
    summary = run_experiment(cfg, str(tmp_path / "c"), progress=False,
                             algorithm_cls=CudaCrashFedAvg)
    assert (tmp_path / "crashed").exists()
    assert summary["executor_restarts"] == 1 and summary["client_failures"] == 0
    rounds = pq.read_table(tmp_path / "c" / "rounds.parquet").to_pandas()
    assert rounds["ok"].tolist() == [6]


class PoisonFedAvg(FedAvg):
    """Client 1 kills whatever process runs it (a segfault in native code, say)."""

    name = "poison-fedavg"

    def client_update(self, ctx, broadcast):
        import os

        if ctx.client_id == 1:
            os._exit(1)
        return super().client_update(ctx, broadcast)


@pytest.mark.parametrize("reduce", ["driver", "executors"])
def test_a_client_that_kills_every_executor_is_marked_error_and_the_round_goes_on(
        ray_session, tiny_cfg, tmp_path, reduce):
    """It used to be re-queued until runtime.max_executor_restarts aborted the run. Now each
    death is one attempt; after a death its batch-mates run alone, so only it fails.
    Reducing on the executors, the batch is first re-run whole once (its sum must not
    depend on the death), then its clients run alone."""
    cfg = tiny_cfg(**{"rounds": 1, "runtime.max_client_retries": 2, "runtime.reduce": reduce,
                      "runtime.tiers": "[{name: default, executors: 2, num_cpus: 0.5}]"})
    summary = run_experiment(cfg, str(tmp_path / "p"), progress=False,
                             algorithm_cls=PoisonFedAvg)
    clients = pq.read_table(tmp_path / "p" / "clients.parquet").to_pandas()
    bad = clients[clients["client_id"] == 1].iloc[0]
    assert bad["status"] == "error" and bad["attempts"] == 3
    assert "executor died" in bad["error"]
    good = clients[(clients["client_id"] != 1) & clients["sampled"]]
    assert (good["status"] == "ok").all() and len(good) == 5
    assert summary["executor_restarts"] == 3 and summary["client_failures"] == 1


class HangFedAvg(FedAvg):
    """Client 2 never returns (a deadlock in native code, say)."""

    name = "hang-fedavg"

    def client_update(self, ctx, broadcast):
        if ctx.client_id == 2:
            time.sleep(3600)
        return super().client_update(ctx, broadcast)


def test_a_hung_executor_is_killed_after_call_timeout(ray_session, tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"rounds": 1, "runtime.max_client_retries": 1,
                      "runtime.call_timeout_s": 5})
    t0 = time.monotonic()
    summary = run_experiment(cfg, str(tmp_path / "h"), progress=False,
                             algorithm_cls=HangFedAvg)
    assert time.monotonic() - t0 < 120
    clients = pq.read_table(tmp_path / "h" / "clients.parquet").to_pandas()
    hung = clients[clients["client_id"] == 2].iloc[0]
    assert hung["status"] == "error" and hung["attempts"] == 2
    assert "ran past runtime.call_timeout_s=5s" in hung["error"]
    assert (clients[clients["client_id"] != 2]["status"] == "ok").all()
    assert summary["executor_restarts"] == 2 and summary["client_failures"] == 1


class SlowFedAvg(FedAvg):
    """FedAvg whose clients take 0.3 s, so a round lasts long enough to kill an executor."""

    name = "slow-fedavg"

    def client_update(self, ctx, broadcast):
        time.sleep(0.3)
        return super().client_update(ctx, broadcast)


@pytest.mark.parametrize("reduce", ["driver", "executors"])
def test_killed_executor_is_replaced_and_nothing_is_lost(ray_session, tiny_cfg, tmp_path,
                                                         reduce):
    """Reducing on the executors, the dead executor's batch is re-run whole on its
    replacement, so its partial sum, and the result, are the same."""
    import ray

    cfg = tiny_cfg(**{"rounds": 2, "runtime.chunk_size": 2, "runtime.reduce": reduce})
    run_experiment(cfg, str(tmp_path / "ref"), progress=False, algorithm_cls=SlowFedAvg)
    exp = Experiment(cfg, str(tmp_path / "k"), algorithm_cls=SlowFedAvg)
    exp.start()
    try:
        exp.step()
        victim = ray.get(exp.driver.executor_handles.remote())["default"][0]
        killer = threading.Timer(0.5, lambda: ray.kill(victim))
        killer.start()
        row = exp.step()
        killer.join()
        exp.close()
    finally:
        exp.release()
    assert row["executor_restarts"] == 1
    assert row["ok"] == 6 and row["failed"] == 0
    assert_bitwise_equal(final_state(tmp_path / "ref"), final_state(tmp_path / "k"))


def test_resume_after_interrupt_matches_uninterrupted(ray_session, tiny_cfg, tmp_path):
    """In-process variant: stop after round 2, resume in a new Experiment."""
    cfg = tiny_cfg(**{"rounds": 4, "local.momentum": 0.9, "local.keep_optimizer_state": "true",
                      "clients.fraction": 0.5})
    _, summary = full_and_resumed(cfg, tmp_path)
    assert summary["rounds"] == 4 and summary["rounds_this_session"] == 2
    assert_bitwise_equal(final_state(tmp_path / "full"), final_state(tmp_path / "cut"))
    b = pq.read_table(tmp_path / "cut" / "rounds.parquet").to_pandas()
    assert list(b["round"]) == [1, 2, 3, 4]
    assert_same_outputs(run_outputs(tmp_path / "full"), run_outputs(tmp_path / "cut"))


def test_new_run_refuses_existing_run_dir(ray_session, tiny_cfg, tmp_path):
    from fedray.core.config import ConfigError

    cfg = tiny_cfg(rounds=1)
    run_experiment(cfg, str(tmp_path / "x"), progress=False)
    with pytest.raises(ConfigError, match="--resume"):
        Experiment(cfg, str(tmp_path / "x"))


def test_config_errors_before_any_ray_work(tmp_path):
    from fedray.core.config import ConfigError

    cfg = load_config(None, ["clients.num_clients=1000", "data.min_samples=4"])
    with pytest.raises(ConfigError, match="num_clients"):
        Experiment(cfg, str(tmp_path / "e"))
