"""The FAVoR algorithm family on the fedray interfaces, and the job end to end on Ray."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import job_process, run_job

from fedray.core.config import ConfigError, load_config
from fedray.methods.base import ClientContext


def save_tiny_lm(out) -> str:
    """A tiny random Qwen2 with a BPE tokenizer, saved like a hub model into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.methods.favor.lm import train_tokenizer

    tok = train_tokenizer(["Hello world, this is a tiny corpus :) ..."] * 30, 300)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


def make(base_dir, variant, **extra):
    from fedray.core.registry import build_method

    over = {"algorithm.name": "favor", "algorithm.base": base_dir,
            "algorithm.variant": variant, "algorithm.lora_rank": 2, "algorithm.lora_alpha": 4,
            "algorithm.micro_batch": 2, "algorithm.accumulation": 2, "algorithm.lora_lr": 0.01,
            "algorithm.proj_hidden": 8, **extra}
    cfg = load_config(None, [f"{k}={v}" for k, v in over.items()])
    alg = build_method(cfg)
    res = alg.build_resident((16,), 0, "cpu")
    return cfg, alg, res, alg.init_global_state(res, cfg.seed)


def ctx(res, state=None, round=1):
    gen = np.random.default_rng(0)
    ids = gen.integers(0, 200, (8, 16))
    return ClientContext(3, round, 0, "lm", ids, ids, ids[:2], ids[:2], res,
                         state=state, extra={"target": np.eye(256, dtype=np.float32)[0]})


def test_favor_uploads_only_the_shared_delta_and_keeps_the_residual_pack(base_dir):
    _, alg, res, g = make(base_dir, "favor")
    out = alg.client_update(ctx(res), g)
    assert set(out.upload) == set(g) and all("lora_" in k for k in g)
    assert set(out.state) == {"shared", "residual", "tau"}
    for k in g:  # upload = shared endpoint − broadcast; the residual never leaves
        assert np.allclose(out.upload[k], out.state["shared"][k] - g[k], atol=1e-7)
    assert any(np.abs(v).sum() > 0 for v in out.state["residual"].values())
    assert alg.uses_client_state and out.metrics["align_loss"] == out.metrics["align_loss"]


def test_baseline_variants_keep_and_send_what_they_should(base_dir):
    _, alg, res, g = make(base_dir, "fedavg")
    out = alg.client_update(ctx(res), g)
    assert out.state is None and not alg.uses_client_state and set(out.upload) == set(g)
    _, alg, res, g = make(base_dir, "local")
    out = alg.client_update(ctx(res), g)
    assert out.upload == {} and "personal" in out.state
    again = alg.client_update(ctx(res, out.state, 2), g)  # continues its own adapter
    assert any(not np.array_equal(again.state["personal"][k], out.state["personal"][k])
               for k in g)
    _, alg, res, g = make(base_dir, "ditto")
    out = alg.client_update(ctx(res), g)
    assert set(out.upload) == set(g) and "personal" in out.state
    assert np.isnan(out.metrics["align_loss"])  # plain Ditto: no style alignment
    _, alg, res, g = make(base_dir, "ditto", **{"algorithm.align": "true"})
    assert np.isfinite(alg.client_update(ctx(res), g).metrics["align_loss"])  # Ditto + ASCE
    _, alg, res, g = make(base_dir, "pfedme", **{"algorithm.pfedme_inner_steps": 2})
    out = alg.client_update(ctx(res), g)
    assert set(out.upload) == set(g) and "personal" in out.state
    theta, w = out.state["personal"], {k: g[k] + out.upload[k] for k in g}
    assert any(not np.allclose(theta[k], w[k]) for k in g)  # θ personal, w global copy
    _, alg, res, g = make(base_dir, "feddpa")
    assert all(v.shape[0] == 2 or v.shape[1] == 2 for v in g.values())  # rank r = 2 global
    out = alg.client_update(ctx(res), g)
    assert set(out.upload) == set(g) and set(out.state) == {"local", "gate", "tau"}
    assert all(out.state["local"][k].shape == g[k].shape for k in g)
    again = alg.client_update(ctx(res, out.state, 2), g)
    assert again.state["gate"] != out.state["gate"]  # the gate is learned


def test_favor_config_errors(base_dir):
    with pytest.raises(ConfigError, match="algorithm.base"):
        load_config(None, ["algorithm.name=favor"])
    with pytest.raises(ConfigError, match="algorithm.variant"):
        load_config(None, ["algorithm.name=favor", f"algorithm.base={base_dir}",
                           "algorithm.variant=scaffold"])
    with pytest.raises(ConfigError, match="data.root"):
        load_config(None, ["algorithm.name=favor", f"algorithm.base={base_dir}",
                           "data.dataset=blogtext", "data.root=/no/such.csv"])


def test_text_data_embeds_sources_once_and_targets_come_from_them(base_dir, tmp_path):
    """Per author: blocks, prompts with references, every source post's ASCE embedding,
    and q_i = the normalised mean of the first reference posts' embeddings (eq. 6)."""
    from test_asce import tiny_backbone
    from transformers import AutoModel, AutoTokenizer

    from fedray.data import build_data
    from fedray.data.authors import generate_corpus
    from fedray.methods.favor.asce import StyleEncoder, author_target, embed, load_asce, save_asce
    from fedray.runtime.experiment import Experiment

    bb = tiny_backbone(tmp_path / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(tmp_path / "asce"), {})
    csv = generate_corpus(tmp_path / "a.csv", num_authors=4, seed=0, posts=(10, 12))
    cfg = load_config(None, [
        "algorithm.name=favor", f"algorithm.base={base_dir}", f"algorithm.asce={tmp_path}/asce",
        "data.dataset=blogtext", f"data.root={csv}", "clients.num_clients=3",
        "algorithm.asce_authors=0", "algorithm.min_tokens=1", "algorithm.block_length=16",
        "algorithm.prompt_tokens=8", "algorithm.new_tokens=8", "algorithm.reference_texts=3",
        "algorithm.eval_prompts=2"])
    data = build_data(cfg)
    enc, tok = load_asce(str(tmp_path / "asce"))
    assert data.num_clients == 3 and len(set(data.authors)) == 3
    for c in range(3):
        assert data.train[c].shape[1] == 16
        assert 1 <= len(data.prompts[c]) == len(data.references[c]) <= 2
        assert data.source_z[c].shape == (len(data.sources[c]), 256)
        np.testing.assert_allclose(data.source_z[c], embed(enc, tok, data.sources[c]),
                                   atol=1e-5)
        np.testing.assert_allclose(data.targets[c], author_target(
            embed(enc, tok, data.sources[c][:3])), atol=1e-5)
    with pytest.raises(ConfigError, match="prebuilt data for 4 clients"):
        Experiment(load_config(None, [], base={**cfg.to_dict(), "clients": {
            "num_clients": 4}}), str(tmp_path / "run"), data=data)


def test_generate_batches_left_padded_prompts_deterministically(base_dir):
    from fedray.methods.favor.evaluate import generate
    from fedray.methods.favor.lm import load_lm

    model, tok = load_lm(base_dir)
    prompts = ["Hello", "Hello world, this is a tiny"]  # different lengths: left padding
    a = generate(model, tok, {}, prompts, 6, seed=1)
    assert a == generate(model, tok, {}, prompts, 6, seed=1) and len(a) == 2
    assert tok.padding_side == "right" and generate(model, tok, {}, [], 6, seed=1) == []
    alone = generate(model, tok, {}, prompts[:1], 6, seed=0, sample=False)
    batched = generate(model, tok, {}, prompts, 6, seed=0, sample=False)
    assert batched[0] == alone[0]  # the padded prompt continues as it does alone


@pytest.mark.ray
def test_favor_job_smoke_end_to_end(ray_session, tmp_path):
    """The job's --smoke: its results, its refusal of another seed, a rescore that retrains
    nothing — and, off a terminal, its stage lines in order, one strict JSON object on
    stdout and no library noise (tests/test_progress.py's check)."""
    import time

    from conftest import strict_json
    from test_progress import check_job_progress

    since = time.time()
    variants = ["favor", "fedavg", "ditto_asce", "local"]
    res = job_process(ray_session, "favor_blogtext.py", "--smoke", "--out",
                      str(tmp_path / "favor"), "--variants", *variants, "--json", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = strict_json(res.stdout)
    check_job_progress(res, ray_session, variants, since)
    rows = {r["method"]: r for r in out["rows"]}
    assert set(rows) == {"favor", "fedavg", "ditto_asce", "local"}
    import pyarrow.parquet as pq

    archive = pq.read_table(tmp_path / "favor" / "favor" / "generations.parquet").to_pylist()
    assert len(archive) == rows["favor"]["generations"]
    assert sum(not r["degenerate"] for r in archive) == rows["favor"]["kept"]
    cfg = (tmp_path / "favor" / "ditto_asce" / "config.yaml").read_text()
    assert "variant: ditto" in cfg and "align: true" in cfg  # the Ditto + ASCE ablation
    assert rows["local"]["upload_bytes"] < 1000 < rows["fedavg"]["upload_bytes"]
    assert rows["favor"]["personalized_clients"] > 0 == rows["fedavg"]["personalized_clients"]
    for r in rows.values():
        assert r["generations"] > 0 and 0 <= r.get("author_accuracy", 0) <= 1
        if "error" not in r:
            assert 0 <= r["stylo_gen_source_auc"] <= 1
    assert (tmp_path / "favor" / "RESULTS.md").exists()
    assert (tmp_path / "favor" / "style_retention.png").exists()
    for r in rows.values():  # the never-sampled policy (#16): the default, and the count
        assert r["unsampled"] == "global" and r["scored_authors"] == 6
        assert 0 <= r["never_sampled"] <= 6
    assert rows["favor"]["never_sampled"] == 6 - rows["favor"]["personalized_clients"]
    # the cold start at the smoke's first K (the default's 1): a row per arm, all scored
    assert [(r["K"], r["skipped"]) for r in out["cold_start"]] == [(1, 0)] * 4
    assert (tmp_path / "favor" / "COLD_START.md").read_text().count("\n| 1 | ") == 4
    again = job_process(  # another seed into the same --out: refused, not re-scored
        ray_session, "favor_blogtext.py", "--smoke", "--seed", "1", "--data-seed", "0",
        "--variants", "fedavg", "--ks", "--out", str(tmp_path / "favor"), timeout=300)
    assert again.returncode != 0 and "holds a run whose config differs at 'seed'" in again.stderr
    stamp = os.stat(tmp_path / "favor" / "fedavg" / "summary.json").st_mtime_ns
    rescored = run_job(ray_session, "favor_blogtext.py", "--smoke", "--variants", "fedavg",
                       "--ks", "--out", str(tmp_path / "favor"), timeout=300)
    assert rescored["rows"][0]["upload_bytes"] == rows["fedavg"]["upload_bytes"]
    assert os.stat(tmp_path / "favor" / "fedavg" / "summary.json").st_mtime_ns == stamp


def test_cold_start_arms_on_held_out_authors(base_dir, tmp_path):
    """Every arm adapts (or not) and is scored among the held-out authors."""
    from test_asce import tiny_backbone
    from transformers import AutoModel, AutoTokenizer

    from fedray.data.authors import generate_corpus
    from fedray.data.blogtext import load_authors
    from fedray.methods.favor.asce import StyleEncoder, save_asce
    from fedray.methods.favor.cold_start import ARMS, cold_start

    bb = tiny_backbone(tmp_path / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(tmp_path / "asce"), {})
    cfg, alg, res, g = make(base_dir, "favor", **{"algorithm.asce": str(tmp_path / "asce"),
                                                  "algorithm.block_length": 16,
                                                  "algorithm.prompt_tokens": 8,
                                                  "algorithm.new_tokens": 6,
                                                  "algorithm.eval_prompts": 2,
                                                  "algorithm.max_steps": 1})
    csv = generate_corpus(tmp_path / "h.csv", num_authors=3, seed=0, posts=(8, 9))
    authors = load_authors(csv, lambda t: 1, min_tokens=1)
    rng = np.random.default_rng(0)
    rnd = {k: rng.normal(0, 0.01, v.shape).astype(np.float32) for k, v in g.items()}
    rows = cold_start(alg.params, g, g, rnd, authors, [2], seed=0)
    assert [r["arm"] for r in rows] == list(ARMS)
    assert all(0 <= r["sep_accuracy"] <= 1 and r["generations"] > 0 for r in rows)


def test_prepared_embedded_default_is_cached_per_arguments(tmp_path):
    """The corpus, base LM and ASCE are reused for the same arguments and rebuilt for
    others (a cache from another seed must not leak into a run)."""
    import time

    from fedray.methods.favor.lm import TinyLM
    from fedray.methods.favor.prepare import prepare_embedded

    def prep(seed):
        lm = TinyLM(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    steps=2, batch_size=2, max_length=32, seed=seed)
        return prepare_embedded(str(tmp_path), 3, seed, pretrain_authors=2, lm=lm,
                                roster_posts=(6, 7))

    first = prep(0)
    corpus = open(first["csv"]).read()
    asce = open(f"{first['asce']}/asce.json").read()
    made = [first["csv"], f"{first['base']}/fedray_tiny_lm.json", f"{first['asce']}/asce.json"]
    stamps = [os.stat(p).st_mtime_ns for p in made]
    time.sleep(0.01)
    assert prep(0) == first and [os.stat(p).st_mtime_ns for p in made] == stamps  # cached
    prep(1)
    assert open(first["csv"]).read() != corpus  # another seed: another corpus
    assert open(f"{first['asce']}/asce.json").read() != asce  # and a retrained ASCE


def test_prepare_never_replaces_files_it_did_not_write(tmp_path):
    """A --cache directory holding an authors.csv without fedray's prepared.json is the
    user's: refused before anything is removed or generated."""
    from fedray.core.spec import ConfigError
    from fedray.methods.favor.prepare import prepare_embedded

    (tmp_path / "authors.csv").write_text("mine\n")
    with pytest.raises(ConfigError, match=r"'--cache'.*holds authors.csv but no "
                                          r"prepared.json"):
        prepare_embedded(str(tmp_path), 3, 0)
    assert sorted(os.listdir(tmp_path)) == ["authors.csv"]
    assert (tmp_path / "authors.csv").read_text() == "mine\n"
