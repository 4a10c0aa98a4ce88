"""``runtime.keep_warm``: runs of one process reuse the driver and executors, give the bits
of a cold run, keep nothing of each other, and never hold resources a later run needs."""

from __future__ import annotations

import os

import pytest
import ray
from test_runtime import assert_bitwise_equal, assert_same_outputs, final_state, run_outputs

from fedray.runtime import Experiment, release_warm, run_experiment, warm

pytestmark = pytest.mark.ray

A = {"clients.fraction": 0.67, "local.momentum": 0.5, "local.keep_optimizer_state": "true",
     "runtime.chunk_size": 1}


WARM_RUNS = False  # conftest.warm_runs: it tests keep_warm itself


@pytest.fixture
def warm_registry(ray_session):
    release_warm()
    yield warm
    release_warm()


def run_pids(cfg, run_dir) -> tuple[dict, set[int]]:
    """Run ``cfg`` to the end through :class:`Experiment`; (summary, executor pids)."""
    exp = Experiment(cfg, str(run_dir))
    try:
        info = exp.start()
        while not exp.done:
            exp.step()
        return exp.close(), {e["pid"] for e in info["executors"]}
    finally:
        exp.release()


def test_warm_runs_reuse_the_actors_and_give_the_bits_of_a_cold_run(warm_registry, tiny_cfg,
                                                                    tmp_path):
    cold = tiny_cfg(**A)
    run_experiment(cold, str(tmp_path / "cold"), progress=False)
    assert warm_registry.idle() == {}  # keep_warm off: nothing kept

    keep = {**A, "runtime.keep_warm": "true"}
    _, first = run_pids(tiny_cfg(**keep), tmp_path / "w1")
    assert sorted(warm_registry.idle().values()) == [1, 2]  # the driver and 2 executors
    # another method, model, seed and client state in between
    _, other = run_pids(tiny_cfg(**{"runtime.keep_warm": "true", "algorithm.name": "fedprox",
                                    "model.hidden": "[16, 8]", "seed": 3,
                                    "local.momentum": 0.9,
                                    "local.keep_optimizer_state": "true"}), tmp_path / "b")
    _, again = run_pids(tiny_cfg(**keep), tmp_path / "w2")
    assert first == other == again  # the same two processes served all three runs
    assert os.getpid() not in again
    for run in ("w1", "w2"):
        assert_bitwise_equal(final_state(tmp_path / "cold"), final_state(tmp_path / run))
        assert_same_outputs(run_outputs(tmp_path / "cold"), run_outputs(tmp_path / run))


def test_idle_actors_of_another_shape_free_their_cpus(warm_registry, tiny_cfg, tmp_path):
    run_experiment(tiny_cfg(**{"runtime.keep_warm": "true"}), str(tmp_path / "half"),
                   progress=False)
    before = ray.available_resources().get("CPU", 0)
    assert before <= ray.cluster_resources()["CPU"] - 1  # 2 idle executors x 0.5 CPU held
    # one executor of 2 CPUs: fits only once the idle 0.5-CPU executors are gone
    whole = {"runtime.tiers": "[{name: default, executors: 1, num_cpus: 2}]",
             "runtime.keep_warm": "true"}
    summary = run_experiment(tiny_cfg(**whole), str(tmp_path / "whole"), progress=False)
    assert summary["rounds"] == 3
    idle = warm_registry.idle()
    assert len(idle) == 2 and all('"num_cpus": 2.0' in k or "driver" in k for k in idle)
    release_warm()
    assert warm_registry.idle() == {}


def test_a_stopped_run_parks_a_failed_one_keeps_nothing_and_a_dead_idle_executor_is_replaced(
        warm_registry, tiny_cfg, tmp_path):
    keep = tiny_cfg(**{**A, "runtime.keep_warm": "true"})
    run_experiment(keep, str(tmp_path / "w1"), progress=False)
    assert sorted(warm_registry.idle().values()) == [1, 2]
    exp = Experiment(keep, str(tmp_path / "cut"))
    pids = {e["pid"] for e in exp.start()["executors"]}  # takes the warm actors
    exp.step()
    exp.release()  # stopped between rounds: nothing in flight, so they are parked again
    assert sorted(warm_registry.idle().values()) == [1, 2]
    resumed = Experiment(keep, str(tmp_path / "cut"), resume=True)
    assert {e["pid"] for e in resumed.start()["executors"]} == pids
    while not resumed.done:
        resumed.step()
    resumed.close()
    assert_bitwise_equal(final_state(tmp_path / "w1"), final_state(tmp_path / "cut"))
    exp = Experiment(keep, str(tmp_path / "failed"))
    exp.start()
    exp.failed = True  # what a round that raised leaves (step() sets it)
    exp.release()
    assert warm_registry.idle() == {}
    buffered = tiny_cfg(**{"runtime.keep_warm": "true", "algorithm.name": "fedbuff",
                           "algorithm.concurrency": 2, "algorithm.buffer_size": 2})
    exp = Experiment(buffered, str(tmp_path / "async"))
    exp.start()
    exp.step()
    exp.release()  # an asynchronous loop has clients in flight between steps: not kept
    assert not any("driver" in k for k in warm_registry.idle())

    run_experiment(keep, str(tmp_path / "w2"), progress=False)
    key = next(k for k in warm_registry.idle() if "executor" in k)
    victim = warm_registry.take(key)
    ray.kill(victim)  # dies while idle
    warm_registry.give(key, victim)
    run_experiment(keep, str(tmp_path / "w3"), progress=False)
    # its replacement was created by the driver (and would die with it): not kept
    assert sorted(warm_registry.idle().values()) == [1, 1]
    run_experiment(keep, str(tmp_path / "w4"), progress=False)
    assert sorted(warm_registry.idle().values()) == [1, 2]
    for run in ("w2", "w3", "w4"):
        assert_bitwise_equal(final_state(tmp_path / "w1"), final_state(tmp_path / run))
