"""Exercise autoscaling for real on one machine with Ray's fake multi-node provider.

``config OUT`` writes a fake-provider autoscaler config whose worker node types are those of
the project's ``cluster.yaml`` (same custom tier resources, CPUs scaled down to 1 per node
so a laptop can host them). ``run`` (against a head started with that config, see
``run.sh``) checks that only the head is up, runs a fedray experiment whose tier asks for
a resource only the ``gpu4`` node type advertises, checks that the autoscaler added such a
node for it, and that the node is removed once idle.
"""

from __future__ import annotations

import json
import os
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_config(idle_minutes: float = 0.1) -> dict:
    with open(os.path.join(ROOT, "cluster.yaml")) as f:
        real = yaml.safe_load(f)
    types = {"ray.head.default": {"resources": {"CPU": 0}, "node_config": {},
                                  "max_workers": 0}}
    for name, spec in real["available_node_types"].items():
        if name == real["head_node_type"]:
            continue
        resources = {k: v for k, v in spec["resources"].items() if k not in ("CPU", "GPU")}
        types[name] = {"resources": {"CPU": 1, **resources}, "node_config": {},
                       "min_workers": 0, "max_workers": 1}
    return {
        "cluster_name": "fedray-fake", "max_workers": 4, "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_minutes, "head_node_type": "ray.head.default",
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "available_node_types": types, "auth": {}, "docker": {},
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
    }


def alive() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n["Alive"]]


def run(run_dir: str) -> None:
    import ray

    from fedray.core.config import load_config
    from fedray.runtime import run_experiment

    ray.init(address="auto", log_to_driver=False)
    assert len(alive()) == 1, f"expected only the head, got {len(alive())} nodes"
    assert ray.cluster_resources().get("tier_low", 0) == 0
    cfg = load_config(None, [
        "rounds=2", "clients.num_clients=4", "model.hidden=[16]", "eval.clients=none",
        "runtime.placement_timeout_s=180",
        "runtime.tiers=[{name: low, executors: 1, num_cpus: 0.5, resources: {tier_low: 1}}]"])
    t0 = time.time()
    seen: set[str] = set()

    def watch(_row):
        seen.update(n["NodeID"] for n in alive())

    summary = run_experiment(cfg, run_dir, progress=False, on_round=watch)
    took = time.time() - t0
    grown = [n for n in ray.nodes() if n["NodeID"] in seen and n["Resources"].get("tier_low")]
    assert summary["rounds"] == 2 and grown, "no tier_low node was added"
    t1 = time.time()
    while len(alive()) > 1 and time.time() - t1 < 180:
        time.sleep(1)
    assert len(alive()) == 1, "the idle worker node was not removed"
    print(json.dumps({"run_seconds": round(took, 1), "nodes_added": len(grown),
                      "removed_after_idle_seconds": round(time.time() - t1, 1)}))
    ray.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "config":
        with open(sys.argv[2], "w") as f:
            json.dump(fake_config(), f)
    else:
        run(sys.argv[2])
