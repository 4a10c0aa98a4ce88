"""cluster.yaml against Ray's own autoscaler schema (offline: nothing contacts AWS)."""

from __future__ import annotations

import copy
import os
import sys

import jsonschema
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))


def load():
    with open(os.path.join(ROOT, "cluster.yaml")) as f:
        return yaml.safe_load(f)


def validate(cfg):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cfg)))


def test_cluster_yaml_validates_against_rays_schema():
    cfg = load()
    validate(cfg)
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert "GPU" not in head["resources"] and head["max_workers"] == 0
    gpu = {k: v for k, v in types.items() if v["resources"].get("GPU")}
    assert {v["resources"]["GPU"] for v in gpu.values()} == {4, 8}
    assert all(v["max_workers"] >= 1 and v["min_workers"] == 0 for v in gpu.values())
    assert cfg["idle_timeout_minutes"] > 0
    assert any("pip install" in c and "-e ." in c for c in cfg["setup_commands"])
    tiers = {k for v in gpu.values() for k in v["resources"] if k.startswith("tier_")}
    assert {"tier_full", "tier_mid", "tier_low"} <= tiers
    # one GPU type per tier: each tier resource on exactly one node type, each node type
    # advertising its GPU type for tiers that pin runtime.tiers[*].accelerator_type
    for tier in tiers:
        assert sum(tier in v["resources"] for v in gpu.values()) == 1, tier
    kinds = [[k for k in v["resources"] if k.startswith("accelerator_type:")]
             for v in gpu.values()]
    assert all(len(k) == 1 for k in kinds) and len({k[0] for k in kinds}) == len(kinds)


def test_cluster_yaml_is_locked_down():
    """Token auth on every node, dashboard/job API on localhost, a user-made security group
    (Ray's own would open SSH to the world), least-privilege profiles, no local junk or
    secrets copied to the nodes."""
    cfg = load()
    text = open(os.path.join(ROOT, "cluster.yaml")).read()
    assert "0.0.0.0" not in text
    head_cmds = " ".join(cfg["head_start_ray_commands"])
    worker_cmds = " ".join(cfg["worker_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_cmds
    for cmds in (cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]):
        starts = [c for c in cmds if "ray start" in c]
        assert starts and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts)
    assert "RAY_AUTH_MODE=token" in worker_cmds
    assert any("auth_token" in k for k in cfg["file_mounts"])
    assert ".gitignore" in cfg["rsync_filter"] and "**/.env" in cfg["rsync_exclude"]
    assert "security_group" not in cfg["provider"]  # Ray would add SSH from 0.0.0.0/0
    profiles = {}
    for name, t in cfg["available_node_types"].items():
        node = t["node_config"]
        assert node["SecurityGroupIds"], name
        profiles[name] = node["IamInstanceProfile"]["Arn"]
    head = cfg["head_node_type"]
    assert all(p != profiles[head] for n, p in profiles.items() if n != head)


@pytest.mark.parametrize("edit,where", [
    (lambda c: c["available_node_types"]["gpu4"].update(max_workers="four"), "max_workers"),
    (lambda c: c.update(idle_timeout_minutes=-1), "idle_timeout_minutes"),
    (lambda c: c["provider"].pop("type"), "type")])
def test_broken_cluster_configs_are_rejected(edit, where):
    cfg = load()
    edit(cfg)
    with pytest.raises((jsonschema.ValidationError, ValueError, KeyError), match=where):
        validate(cfg)


def test_fake_autoscaler_config_mirrors_the_node_types():
    from fake_autoscaler import fake_config
    from ray.autoscaler._private.util import validate_config

    cfg = fake_config()
    validate_config(cfg)
    real = load()["available_node_types"]
    for name, spec in cfg["available_node_types"].items():
        if name in real:
            tiers = {k: v for k, v in real[name]["resources"].items() if k.startswith("tier_")}
            assert {k: spec["resources"][k] for k in tiers} == tiers


def test_instance_profile_policies_are_least_privilege():
    """iam/: the head may manage only the cluster's own instances and pass only the worker
    role; workers may only read and write the run bucket."""
    import json

    def load_policy(name):
        with open(os.path.join(ROOT, "iam", name)) as f:
            return json.load(f)

    worker = load_policy("fedray-worker.json")
    actions = {a for st in worker["Statement"] for a in st["Action"]}
    assert actions == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"}
    assert all("RUN-BUCKET" in st["Resource"] for st in worker["Statement"])
    head = load_policy("fedray-head.json")
    by_sid = {st["Sid"]: st for st in head["Statement"]}
    assert all(st["Effect"] == "Allow" and "*" not in st["Action"] for st in head["Statement"])
    terminate = by_sid["AutoscalerOwnInstancesOnly"]
    assert terminate["Condition"]["StringEquals"]["aws:ResourceTag/ray-cluster-name"] == \
        load()["cluster_name"]
    assert by_sid["PassTheWorkerProfileOnly"]["Resource"].endswith(":role/fedray-worker")
    assert not any(a.startswith(("s3:*", "ec2:*", "iam:*")) for st in head["Statement"]
                   for a in st["Action"])
