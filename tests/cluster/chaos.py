"""Chaos on a real two-node Ray cluster (``ray.cluster_utils.Cluster``): the worker node is
removed in the middle of a round. Its executor dies with it and cannot be re-placed (the
head has no room); the tier's executor on the head takes over its clients and the run
finishes there — bitwise the run the undisturbed cluster produces (same seed, same result
whatever the executor count or finish order). Prints one JSON line; exits non-zero on any
difference. Run by tests/cluster/run.sh (it needs a Ray of its own)."""

from __future__ import annotations

import json
import sys
import tempfile
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster

from fedray.core import checkpoint
from fedray.core.config import load_config
from fedray.core.storage import Storage
from fedray.runtime import Experiment, run_experiment

OVERRIDES = ["rounds=4", "seed=3", "clients.num_clients=8", "model.hidden=[64]",
             "local.epochs=120", "local.batch_size=8",  # a round of seconds: the node
             # removal 0.5 s in lands mid-round however fast the machine (30: 0.7 s, raced)
             "runtime.tiers=[{name: t, executors: 2, num_cpus: 1}]",
             "runtime.placement_timeout_s=20"]


def lose_a_whole_tier(cluster: Cluster, tmp: str) -> str:
    """A tier whose only node is removed: its executor cannot be re-placed, so after
    runtime.placement_timeout_s the run stops with a PlacementError (never hangs)."""
    from fedray.runtime.pool import PlacementError

    node = cluster.add_node(num_cpus=1, resources={"gone": 1})
    cfg = load_config(None, OVERRIDES + [
        "runtime.tiers=[{name: g, executors: 1, num_cpus: 1, resources: {gone: 1}}]",
        "runtime.placement_timeout_s=20"])  # the first placement on a loaded 2-core box
    exp = Experiment(cfg, f"{tmp}/lost")
    exp.start()
    exp.step()
    cluster.remove_node(node)
    t0 = time.monotonic()
    try:
        exp.step()
        return "no error"
    except ray.exceptions.RayTaskError as e:
        cause = e.cause
        return (f"{type(cause).__name__} after {time.monotonic() - t0:.0f} s"
                if isinstance(cause, PlacementError) else repr(cause))
    finally:
        exp.release()


def main() -> int:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "_system_config": {"health_check_initial_delay_ms": 0,
                                          "health_check_period_ms": 1000,
                                          "health_check_failure_threshold": 3}})
    worker = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    tmp = tempfile.mkdtemp(prefix="fedray-chaos-")
    try:
        cfg = load_config(None, OVERRIDES)
        calm = run_experiment(cfg, f"{tmp}/calm", progress=False)
        exp = Experiment(cfg, f"{tmp}/chaos")
        exp.start()
        nodes = {i["node_id"] for i in exp.info["executors"] if "node_id" in i}
        from ray.util.state import list_actors

        driver_node = [a.node_id for a in list_actors(filters=[("class_name", "=", "Driver"),
                                                                ("state", "=", "ALIVE")])]
        print(json.dumps({"driver_node": driver_node, "head": cluster.head_node.node_id,
                          "worker": worker.node_id, "executor_nodes": sorted(nodes)}),
              flush=True)
        exp.step()
        pending = exp.driver.run_round.remote()  # round 2: its clients are training when
        time.sleep(0.5)                          # the worker node (and its executor) goes
        cluster.remove_node(worker)
        mid = ray.get(pending)
        exp.rows.append(mid)
        exp.round = mid["round"]
        while not exp.done:
            exp.step()
        summary = exp.close()
        assert mid["executor_restarts"] >= 1, f"the node was not lost mid-round: {mid}"
        a = checkpoint.read(Storage(f"{tmp}/calm"))["server"]["params"]
        b = checkpoint.read(Storage(f"{tmp}/chaos"))["server"]["params"]
        same = all(np.array_equal(a[k], b[k]) for k in a)
        restarts = summary["executor_restarts"]
        out = {"rounds": summary["rounds"], "executor_restarts": restarts,
               "round_2_seconds": round(mid["seconds"], 2),
               "bitwise_equal_to_undisturbed": same, "executor_nodes": len(nodes),
               "failed_clients": summary["client_failures"],
               "calm_accuracy": calm["final_global_accuracy"],
               "chaos_accuracy": summary["final_global_accuracy"]}
        out["whole_tier_lost"] = lose_a_whole_tier(cluster, tmp)
        print(json.dumps(out))
        ok = same and summary["rounds"] == cfg.rounds and restarts >= 1 and \
            summary["client_failures"] == 0 and len(nodes) == 2 and \
            out["whole_tier_lost"].startswith("PlacementError")
        return 0 if ok else 1
    finally:
        ray.shutdown()
        try:
            cluster.shutdown()
        except KeyError:  # a node this script removed itself
            pass


if __name__ == "__main__":
    sys.exit(main())
