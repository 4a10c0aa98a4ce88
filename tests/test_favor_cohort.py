"""Many FAVoR authors through one base (:mod:`fedray.methods.favor.cohort`): each author's
upload, kept state and metrics equal its sequential client round within tolerance, LoRA
dropout masks included, and the method's cohort hook equals its client hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_favor import base_dir, make  # noqa: F401 — the tiny saved Qwen2 fixture

from fedray.core.config import load_config
from fedray.methods.base import ClientContext
from fedray.methods.favor import cohort
from fedray.methods.favor.adapter import LoraSpec
from fedray.methods.favor.train import StageConfig, adapter_of, client_round, shared_stage

TOL = 1e-4


def rel(a: dict, b: dict) -> float:
    x = torch.cat([torch.as_tensor(a[k]).flatten() for k in b])
    y = torch.cat([torch.as_tensor(b[k]).flatten() for k in b])
    return float((x - y).norm() / y.norm())


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.methods.favor.lm import with_lora

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = with_lora(AutoModelForCausalLM.from_config(cfg),
                      LoraSpec(r=4, alpha=8, dropout=0.05)).eval()
    g = torch.Generator().manual_seed(1)
    start = {k: v + 0.05 * torch.randn(v.shape, generator=g)
             for k, v in adapter_of(model).items()}
    # unequal authors: a full step, a short last step, fewer rows than a micro-batch
    authors = [cohort.Author(c, torch.randint(0, 64, (n, 12), generator=g),
                             torch.randn(8, generator=g))
               for c, n in [(3, 16), (5, 9), (8, 21), (11, 3)]]
    return model, start, authors


SHARED = StageConfig(epochs=1, micro_batch=4, accumulation=2, lr=1e-2)
PRIVATE = StageConfig(epochs=2, micro_batch=4, accumulation=2, lr=1e-2)


@pytest.mark.parametrize("chunk", [None, 64 * 40], ids=["one-chunk", "checkpointed-chunks"])
def test_every_authors_round_equals_its_sequential_round(lm, chunk, monkeypatch):
    """Also with the output head in checkpointed chunks of 40 tokens (a real vocabulary's
    case: 151,936 logits a token), on both paths."""
    if chunk:
        monkeypatch.setattr("fedray.methods.favor.train.LOGIT_CHUNK", chunk)
        monkeypatch.setattr("fedray.methods.favor.cohort.LOGIT_CHUNK", chunk)
    model, start, authors = lm
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    batched = cohort.client_rounds(model, start, authors, SHARED, PRIVATE, 0.1, 0.5, seed=0,
                                   round=2, proj_hidden=16)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    for a, (up, state, metrics) in zip(authors, batched, strict=True):
        want_up, want_state, want = client_round(model, start, a.ids, a.ids, a.target, SHARED,
                                                 PRIVATE, 0.1, 0.5, seed=0, round=2,
                                                 client=a.client, proj_hidden=16)
        assert rel(up, want_up) <= TOL
        assert rel(state["shared"], want_state["shared"]) <= TOL
        assert rel(state["residual"], want_state["residual"]) <= TOL
        assert metrics.keys() == want.keys()
        for k, v in want.items():
            assert metrics[k] == pytest.approx(v, rel=TOL), k


def test_the_shared_stage_alone_with_prox(lm):
    model, start, authors = lm
    ends, metrics = cohort.shared_stage(model, start, authors, SHARED, 0.5, seed=1, round=4)
    for a, end, m in zip(authors, ends, metrics, strict=True):
        want, wm = shared_stage(model, start, a.ids, a.ids, SHARED, 0.5, seed=1, round=4,
                                client=a.client)
        assert rel({k: end[k] - start[k] for k in start},
                   {k: want[k] - start[k] for k in start}) <= TOL
        assert m["shared_loss"] == pytest.approx(wm["shared_loss"], rel=TOL)


def test_dropout_masks_are_each_authors_own(lm):
    """Without per-author masks (every author drawing from one stream) the result would
    differ: the check above is not passing by accident of dropout being inert."""
    model, start, authors = lm
    one = cohort.shared_stage(model, start, authors[:2], SHARED, 0.0, seed=0, round=2)[0]
    swapped = [cohort.Author(authors[1].client, authors[0].ids, authors[0].target),
               authors[1]]
    other = cohort.shared_stage(model, start, swapped, SHARED, 0.0, seed=0, round=2)[0]
    assert rel(one[1], other[1]) <= TOL  # author 1 does not depend on its neighbour
    assert rel(one[0], other[0]) > 1e-3  # author 0's masks follow its client id


@pytest.mark.parametrize("variant", ["favor", "fedprox"])
def test_the_methods_cohort_hook_equals_its_client_hook(base_dir, variant):  # noqa: F811
    _, alg, res, g = make(base_dir, variant)
    rng = np.random.default_rng(0)
    ctxs = []
    for c, n in [(3, 8), (4, 5), (9, 3)]:
        ids = rng.integers(0, 200, (n, 16))
        ctxs.append(ClientContext(c, 1, 0, "lm", ids, ids, ids[:2], ids[:2], res,
                                  extra={"target": np.eye(256, dtype=np.float32)[c]}))
    batched = alg.cohort_update(ctxs, g)
    for ctx, got in zip(ctxs, batched, strict=True):
        want = alg.client_update(ctx, g)
        assert got.num_samples == want.num_samples
        assert rel(got.upload, want.upload) <= TOL
        assert list(got.metrics) == list(want.metrics)
        assert (got.state is None) == (want.state is None)
        if want.state is not None:
            assert got.state["tau"] == want.state["tau"]
            for part in ("shared", "residual"):
                assert rel(got.state[part], want.state[part]) <= TOL


def test_unbatched_variants_are_refused_under_on(base_dir):  # noqa: F811
    from fedray.core.config import load_config
    from fedray.core.spec import ConfigError
    from fedray.methods.base import cohort_size
    from fedray.methods.favor.method import Favor

    ditto = ["algorithm.name=favor", f"algorithm.base={base_dir}", "algorithm.variant=ditto"]
    with pytest.raises(ConfigError, match="'ditto' trains one author at a time"):
        load_config(None, [*ditto, "runtime.vectorize=on"])
    assert cohort_size(load_config(None, [*ditto, "runtime.vectorize=auto"]), Favor, (16,),
                       0) is None
    auto = load_config(None, ["algorithm.name=favor", f"algorithm.base={base_dir}",
                              "runtime.vectorize=auto"])
    assert cohort_size(auto, Favor, (16,), 0) is None  # auto never sizes an LM's cohort
    on = load_config(None, ["algorithm.name=favor", f"algorithm.base={base_dir}",
                            "runtime.vectorize=on", "runtime.cohort_size=12"])
    assert cohort_size(on, Favor, None, None).size == 12
    unset = load_config(None, ["algorithm.name=favor", f"algorithm.base={base_dir}",
                               "runtime.vectorize=on"])
    rule = cohort_size(unset, Favor, None, None)  # no bytes to size by: at most the floor
    assert rule.size is None and rule.of(12) == rule.of(10_000) == 256


def test_a_base_that_drops_out_elsewhere_is_refused():
    """Attention dropout would be drawn over all authors' rows at once: refused (the
    executor then trains the authors one at a time)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.methods.favor.lm import with_lora

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      attention_dropout=0.1)
    model = with_lora(AutoModelForCausalLM.from_config(cfg), LoraSpec(r=2, alpha=4))
    start = adapter_of(model)
    author = cohort.Author(0, torch.zeros((4, 8), dtype=torch.long))
    with pytest.raises(ValueError, match="attention_dropout=0.1"):
        cohort.shared_stage(model, start, [author], SHARED, 0.0, seed=0, round=1)


@pytest.mark.ray
def test_favor_cohorts_end_to_end_are_bitwise_across_executors(ray_session, tmp_path):
    """A FAVoR federation with cohorts of authors (stacked uploads included) is the same
    bits with 1 and 2 executors; the cohort's equality with the sequential rounds is
    tested above at the method's level."""
    from test_favor_policies import overrides
    from test_runtime import assert_bitwise_equal, assert_same_outputs, final_state, run_outputs

    from fedray.data import build_data
    from fedray.data.authors import generate_corpus
    from fedray.runtime import run_experiment

    root = tmp_path / "models"
    root.mkdir()
    _tiny_models(root)
    csv = generate_corpus(tmp_path / "a.csv", num_authors=6, seed=0, posts=(10, 12))
    runs, data = {}, None
    for name, executors, mode in [("one", 1, "on"), ("two", 2, "on")]:
        cfg = load_config(None, overrides(root, csv) + [
            "clients.num_clients=6", "clients.per_round=4", "rounds=2", "eval.clients=none",
            "eval.every=0", "eval.global_test=false", f"runtime.vectorize={mode}",
            "runtime.cohort_size=2", "runtime.placement_timeout_s=300",
            f"runtime.tiers=[{{name: lm, executors: {executors}, num_cpus: 0.5}}]"])
        data = data or build_data(cfg)  # the runs differ in runtime keys only
        run_experiment(cfg, str(tmp_path / name), progress=False, data=data)
        runs[name] = run_outputs(tmp_path / name)
    assert_bitwise_equal(final_state(tmp_path / "one"), final_state(tmp_path / "two"))
    assert_same_outputs(runs["one"], runs["two"])
    clients = runs["two"]["clients"]
    assert (clients.loc[clients["status"] == "ok", "upload_bytes"] > 0).all()


def _tiny_models(root):
    """The tiny LM and ASCE of test_favor_policies' fixture, saved under ``root``."""
    from test_asce import tiny_backbone
    from test_favor import save_tiny_lm
    from transformers import AutoModel, AutoTokenizer

    from fedray.methods.favor.asce import StyleEncoder, save_asce

    save_tiny_lm(root / "lm")
    bb = tiny_backbone(root / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(root / "asce"), {})
