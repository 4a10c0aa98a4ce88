"""Chaos on the real runtime: the driver actor killed in the middle of a round, then the run
continued with ``--resume``, ends bitwise where an undisturbed run ends. (A node removed from
a two-node cluster mid-round is ``tests/cluster/chaos.py``, run by ``tests/cluster/run.sh``:
it needs a Ray of its own.)"""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedray.core import checkpoint
from fedray.core.storage import Storage
from fedray.observe.metrics import read_metrics

WARM_RUNS = False  # conftest.warm_runs: its runs lose actors on purpose


@pytest.mark.ray
def test_driver_killed_mid_round_then_resumed_is_bitwise_the_same(ray_session, tiny_cfg,
                                                                    tmp_path):
    from fedray.runtime import Experiment, run_experiment

    ray = ray_session
    cfg = tiny_cfg(rounds=4, **{"local.epochs": 150})  # a round takes seconds
    run_experiment(cfg, str(tmp_path / "full"), progress=False)
    exp = Experiment(cfg, str(tmp_path / "cut"))
    exp.start()
    exp.step()
    exp.step()
    pending = exp.driver.run_round.remote()  # round 3, killed while its clients train
    time.sleep(0.5)
    done, _ = ray.wait([pending], timeout=0)
    assert not done, "round 3 finished before the kill: make the rounds longer"
    ray.kill(exp.driver, no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pending)
    exp.release()
    assert checkpoint.read(Storage(str(tmp_path / "cut")))["server"]["round"] == 2
    resumed = run_experiment(cfg, str(tmp_path / "cut"), resume=True, progress=False)
    assert resumed["rounds"] == 4 and resumed["rounds_this_session"] == 2
    a = checkpoint.read(Storage(str(tmp_path / "full")))
    b = checkpoint.read(Storage(str(tmp_path / "cut")))
    assert all(np.array_equal(a["server"]["params"][k], b["server"]["params"][k])
               for k in a["server"]["params"])
    assert a["ledger"]["totals"] == b["ledger"]["totals"]
    cols = ["round", "train_loss", "global_accuracy", "upload_bytes", "cum_bytes"]
    full = read_metrics(str(tmp_path / "full"), "rounds").select(cols).to_pylist()
    cut = read_metrics(str(tmp_path / "cut"), "rounds").select(cols).to_pylist()
    assert full == cut
