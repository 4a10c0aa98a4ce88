"""FAVoR's evaluation policies of issue #16: the never-sampled-author policy
(``algorithm.unsampled``) on a real finished federation, and the cold-start table's K-shot
rows (K ∈ {1, 4, 16}, an author too small for a K skipped and counted)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from fedray.core.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Qwen2 (BPE tokenizer) and a tiny random ASCE, saved like hub models."""
    from test_asce import tiny_backbone
    from test_favor import save_tiny_lm
    from transformers import AutoModel, AutoTokenizer

    from fedray.methods.favor.asce import StyleEncoder, save_asce

    root = tmp_path_factory.mktemp("favor-policies")
    save_tiny_lm(root / "lm")
    bb = tiny_backbone(root / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(root / "asce"), {})
    return root


def overrides(root: Path, csv: str, **extra) -> list[str]:
    over = {"algorithm.name": "favor", "algorithm.base": root / "lm",
            "algorithm.asce": root / "asce", "algorithm.lora_rank": 2, "algorithm.lora_alpha": 4,
            "algorithm.micro_batch": 2, "algorithm.accumulation": 1, "algorithm.lora_lr": 0.01,
            "algorithm.proj_hidden": 8, "algorithm.max_steps": 1, "algorithm.asce_authors": 0,
            "algorithm.min_tokens": 1, "algorithm.block_length": 16,
            "algorithm.prompt_tokens": 8, "algorithm.new_tokens": 12,
            "algorithm.reference_texts": 3, "algorithm.eval_prompts": 2,
            "data.dataset": "blogtext", "data.root": csv, **extra}
    return [f"{k}={v}" for k, v in over.items()]


@pytest.mark.ray
def test_never_sampled_authors_are_deployed_global_or_excluded_and_counted(
        ray_session, tiny, tmp_path):
    """5 authors, one round of 2: 3 authors are never trained. ``global`` generates for all
    five (the never-sampled with the final global adapter), ``exclude`` for the two trained
    ones only — the same texts for them — and both report the 3; the policy reads the
    run's per-client metrics, so it holds for global-adapter variants (FedAvg) too."""
    import pyarrow.parquet as pq

    from fedray.core.registry import build_method
    from fedray.data import build_data
    from fedray.data.authors import generate_corpus
    from fedray.methods.favor.evaluate import evaluate_style, never_trained
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    csv = generate_corpus(tmp_path / "a.csv", num_authors=5, seed=0, posts=(10, 12))
    cfg = load_config(None, overrides(tiny, csv) + [
        "clients.num_clients=5", "clients.per_round=2", "rounds=1", "eval.clients=none",
        "eval.every=0", "runtime.tiers=[{name: lm, executors: 1, num_cpus: 0.5}]",
        "runtime.placement_timeout_s=300"])
    params = build_method(cfg).params
    assert params.unsampled == "global"  # the default
    data = build_data(cfg)
    run = str(tmp_path / "run")
    run_experiment(cfg, run, progress=False, data=data)
    clients = read_metrics(run, "clients").to_pylist()
    trained = sorted({r["client_id"] for r in clients if r["status"] == "ok"})
    never = never_trained(run, 5)
    assert len(trained) == 2 and never == sorted(set(range(5)) - set(trained))

    out = {}
    for policy in ("global", "exclude"):
        out[policy] = evaluate_style(run, data, dataclasses.replace(params, unsampled=policy),
                                     seed=0, min_tokens=1, archive=str(tmp_path / policy))
        assert out[policy]["never_sampled"] == 3 and out[policy]["unsampled"] == policy
        assert out[policy]["personalized_clients"] == 2  # FAVoR: the trained ones only
        assert "error" not in out[policy] and 0 <= out[policy]["author_accuracy"] <= 1
    g, e = out["global"], out["exclude"]
    assert (g["scored_authors"], g["excluded_authors"]) == (5, 0)
    assert (e["scored_authors"], e["excluded_authors"]) == (2, 3)
    assert g["generations"] == sum(len(p) for p in data.prompts)
    assert e["generations"] == sum(len(data.prompts[c]) for c in trained)
    gens = {p: pq.read_table(tmp_path / p / "generations.parquet").to_pylist()
            for p in out}
    assert {r["client"] for r in gens["global"]} == set(range(5))
    assert {r["client"] for r in gens["exclude"]} == set(trained)
    assert [r for r in gens["global"] if r["client"] in trained] == gens["exclude"]

    fedavg = evaluate_style(run, data, dataclasses.replace(params, variant="fedavg",
                                                           unsampled="exclude"),
                            seed=0, min_tokens=1)
    assert fedavg["personalized_clients"] == 0 and fedavg["never_sampled"] == 3
    assert fedavg["generations"] == e["generations"]


def test_unsampled_policy_is_a_checked_config_key(tiny, tmp_path):
    from fedray.core.registry import build_method
    from fedray.core.spec import ConfigError

    base = overrides(tiny, str(tmp_path / "x.csv"))[:3]
    cfg = load_config(None, base + ["algorithm.unsampled=exclude"])
    assert build_method(cfg).params.unsampled == "exclude"
    with pytest.raises(ConfigError, match="unsampled"):
        build_method(load_config(None, base + ["algorithm.unsampled=drop"]))


def test_cold_start_table_has_every_k_and_skips_authors_without_k_shots(tiny, tmp_path):
    """K ∈ {1, 4, 16} (the job's default): every K has a row per arm; an author with 6
    train posts is scored at K = 1 and 4, skipped (and counted) at K = 16."""
    from favor_blogtext import cold_start_table

    from fedray.core.registry import build_method
    from fedray.data.authors import generate_corpus
    from fedray.data.blogtext import load_authors
    from fedray.methods.favor.cold_start import ARMS, cold_start
    from fedray.methods.favor.method import lora_spec

    csv = generate_corpus(tmp_path / "h.csv", num_authors=3, seed=0, posts=(24, 26))
    authors = load_authors(csv, lambda t: 1, min_tokens=1)
    assert all(len(a.train) >= 16 for a in authors)
    authors[2] = dataclasses.replace(authors[2], train=authors[2].train[:6])
    cfg = load_config(None, overrides(tiny, csv, **{"algorithm.new_tokens": 6,
                                                    "algorithm.eval_prompts": 1}))
    alg = build_method(cfg)
    from fedray.methods.favor.lm import load_lm, with_lora

    model = with_lora(load_lm(alg.params.base)[0], lora_spec(alg.params, dropout=0.0))
    g = alg.init_global_state({"model": model}, 0)
    rng = np.random.default_rng(0)
    rnd = {k: rng.normal(0, 0.01, v.shape).astype(np.float32) for k, v in g.items()}
    rows = cold_start(alg.params, g, g, rnd, authors, [1, 4, 16], seed=0)
    assert [(r["K"], r["arm"]) for r in rows] == [(k, a) for k in (1, 4, 16) for a in ARMS]
    for r in rows:
        assert (r["authors"], r["skipped"]) == ((2, 1) if r["K"] == 16 else (3, 0))
        assert 0 <= r["sep_accuracy"] <= 1 and r["generations"] > 0
    gen = {r["K"]: r["generations"] for r in rows}
    assert gen[16] < gen[4] == gen[1]  # the skipped author generated nothing at K = 16
    table = cold_start_table(rows).splitlines()
    assert len(table) == 2 + 3 * len(ARMS)
    for k in (1, 4, 16):
        assert sum(line.startswith(f"| {k} | ") for line in table) == len(ARMS)
    assert table[-1].endswith("| 2 (1) |") and table[2].endswith("| 3 (0) |")
    with pytest.raises(ValueError, match="K must be >= 1"):
        cold_start(alg.params, g, g, rnd, authors, [0], seed=0)
