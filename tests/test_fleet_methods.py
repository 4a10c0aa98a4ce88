"""Every method under the fleet's participation rules — dropout, over-commitment, a deadline,
a report minimum — on Ray: FedAvg, FedProx, ORDERS, FLITE, DROD (tiers as device classes)
and FAVoR. Each round aggregates at most K reports, the rest are accounted for, and the
clock runs."""

from __future__ import annotations

import pytest
from test_favor import base_dir  # noqa: F401 — the tiny LM fixture

from fedray.core.config import load_config
from fedray.observe.metrics import read_metrics
from fedray.runtime import run_experiment

RULES = ["fleet.dropout=0.2", "fleet.overcommit=0.5", "fleet.deadline_s=600",
         "fleet.min_reports=1", "fleet.compute_sigma=1.0"]


def check(run_dir, k: int, rounds: int) -> None:
    rows = read_metrics(str(run_dir), "rounds").to_pylist()
    clients = read_metrics(str(run_dir), "clients").to_pylist()
    assert len(rows) == rounds
    for r in rows:
        assert r["ok"] <= k and r["sampled"] > k  # over-committed, K aggregated at most
        assert r["ok"] + r["dropped"] + r["late"] + r["surplus"] + r["failed"] + \
            r["rejected"] == r["sampled"]
        assert r["sim_seconds"] > 0
    statuses = {c["status"] for c in clients}
    assert "surplus" in statuses and "ok" in statuses
    assert all(c["upload_bytes"] == 0 for c in clients if c["status"] in
               ("dropped", "late", "surplus"))


@pytest.mark.ray
@pytest.mark.parametrize("method", ["fedavg", "fedprox", "orders"])
def test_fedavg_family_and_orders_under_the_fleet(ray_session, tiny_cfg, tmp_path, method):
    cfg = tiny_cfg(**{"algorithm.name": method, "clients.num_clients": 8,
                      "clients.per_round": 4, "rounds": 3})
    cfg = load_config(None, RULES, base=cfg.to_dict())
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    check(tmp_path / "run", 4, 3)
    assert summary["simulated_hours"] > 0
    import pyarrow.parquet as pq

    part = pq.read_table(tmp_path / "run" / "partition.parquet").to_pydict()  # once, stored
    seen = sorted(i for row in part["train_idx"] + part["test_idx"] for i in row)
    assert part["client_id"] == list(range(8)) and seen == sorted(set(seen))


@pytest.mark.ray
def test_flite_under_the_fleet(ray_session, tmp_path):
    from test_flite import PRE

    from fedray.models.pretrain import pretrain

    pretrain(load_config(None, PRE), str(tmp_path / "base"), progress=False)
    cfg = load_config(None, PRE + RULES + [
        "algorithm.name=flite", f"algorithm.base={tmp_path / 'base'}", "clients.num_clients=8",
        "clients.per_round=4", "rounds=2", "eval.clients=none",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 0.5}]"])
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    check(tmp_path / "run", 4, 2)
    ok = [c for c in read_metrics(str(tmp_path / "run"), "clients").to_pylist()
          if c["status"] == "ok"]
    assert {c["upload_bytes"] for c in ok} == {ok[0]["upload_bytes"]}  # latents only


@pytest.mark.ray
def test_drod_tiers_as_device_classes_under_the_fleet(ray_session, tmp_path):
    from test_drod import drod_cfg

    cfg = drod_cfg(**{"clients.num_clients": 9, "clients.per_round": 4})
    cfg = load_config(None, RULES + ["fleet.tier_speed={t100: 4, t025: 2, t006: 1}"],
                      base=cfg.to_dict())
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    check(tmp_path / "run", 4, 4)
    clients = read_metrics(str(tmp_path / "run"), "clients").to_pylist()
    down = {}
    for c in clients:
        down.setdefault(c["tier"], set()).add(c["download_bytes"])
    assert max(down["t006"]) < min(down["t100"])  # sliced sub-models: fewer bytes


@pytest.mark.ray
def test_favor_under_the_fleet(ray_session, tmp_path, base_dir):  # noqa: F811
    from test_asce import tiny_backbone
    from transformers import AutoModel, AutoTokenizer

    from fedray.data.authors import generate_corpus
    from fedray.methods.favor.asce import StyleEncoder, save_asce

    bb = tiny_backbone(tmp_path / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(tmp_path / "asce"), {})
    csv = generate_corpus(tmp_path / "a.csv", num_authors=8, seed=0, posts=(10, 12))
    cfg = load_config(None, RULES + [
        "algorithm.name=favor", f"algorithm.base={base_dir}", f"algorithm.asce={tmp_path}/asce",
        "data.dataset=blogtext", f"data.root={csv}", "clients.num_clients=6",
        "clients.per_round=3", "rounds=2", "algorithm.asce_authors=0", "algorithm.min_tokens=1",
        "algorithm.block_length=16", "algorithm.prompt_tokens=8", "algorithm.new_tokens=4",
        "algorithm.reference_texts=3", "algorithm.eval_prompts=1", "algorithm.lora_rank=2",
        "algorithm.lora_alpha=4", "algorithm.micro_batch=2", "algorithm.proj_hidden=8",
        "eval.clients=none", "eval.global_test=false",
        "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]"])
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    check(tmp_path / "run", 3, 2)
