"""FAVoR's client round (Algorithm 2) on a tiny real Qwen2 model with peft LoRA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.methods.favor.adapter import LoraSpec
from fedray.methods.favor.train import (
    StageConfig,
    adapter_of,
    client_round,
    compose,
    kappa,
    lm_loss,
    pooled_hidden,
    private_stage,
    shared_stage,
    using,
)


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.methods.favor.lm import with_lora

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = with_lora(AutoModelForCausalLM.from_config(cfg), LoraSpec(r=4, alpha=8,
                                                                       dropout=0.0))
    start = adapter_of(model)
    g = torch.Generator().manual_seed(1)
    start = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in start.items()}
    ids = torch.randint(0, 64, (16, 12), generator=g)
    return model, start, ids, ids.clone()


CFG = StageConfig(epochs=1, micro_batch=4, accumulation=2, lr=1e-2)


def test_only_lora_factors_train_and_the_prox_term_is_as_written(lm):
    model, start, ids, labels = lm
    assert set(start) == {n for n, p in model.named_parameters() if p.requires_grad}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    end, m = shared_stage(model, start, ids, labels, CFG, prox=0.0, seed=0, round=1,
                          client=0)
    assert any(not torch.equal(end[k], start[k]) for k in start)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    far, _ = shared_stage(model, start, ids, labels, CFG, prox=0.0, seed=0, round=1, client=0)
    near, _ = shared_stage(model, start, ids, labels, CFG, prox=100.0, seed=0, round=1,
                           client=0)
    dist = lambda a: sum(float(((a[k] - start[k]) ** 2).sum()) for k in a)  # noqa: E731
    assert dist(near) < dist(far)
    assert all(torch.equal(far[k], end[k]) for k in end)  # seeded: same batches, same result


def test_private_stage_leaves_the_shared_endpoint_without_gradient(lm):
    model, start, ids, labels = lm
    shared = {k: v.clone().requires_grad_(True) for k, v in start.items()}  # as leaves
    target = torch.nn.functional.normalize(torch.randn(8), dim=0)
    residual, m = private_stage(model, shared, ids, labels, target, CFG, align=0.3, seed=0,
                                round=2, client=1, proj_hidden=16)
    assert all(v.grad is None for v in shared.values())  # stop-gradient: nothing reached it
    assert all(torch.equal(shared[k], start[k]) for k in start)  # untouched
    assert any(v.abs().sum() > 0 for v in residual.values())
    assert np.isfinite(m["align_loss"])


def test_residual_pack_reconstructs_the_private_adapter_exactly(lm):
    model, start, ids, labels = lm
    target = torch.nn.functional.normalize(torch.randn(8), dim=0)
    upload, state, _ = client_round(model, start, ids, labels, target, CFG, CFG, prox=0.01,
                                    align=0.3, seed=0, round=3, client=2, proj_hidden=16)
    private = compose(state["shared"], state["residual"])
    # the adapter the private stage trained is exactly shared + residual: the loss computed
    # with the reconstruction equals the loss computed with the same tensors re-added
    again = {k: state["shared"][k] + state["residual"][k] for k in private}
    assert all(torch.equal(private[k], again[k]) for k in private)
    with using(model, private):
        a, _ = lm_loss(model, ids[:4], labels[:4])
    with using(model, again):
        b, _ = lm_loss(model, ids[:4], labels[:4])
    assert torch.equal(a, b)
    # only the shared delta leaves the client
    assert set(upload) == set(start)
    assert all(torch.equal(upload[k], state["shared"][k] - start[k]) for k in upload)
    assert not any(torch.equal(upload[k], state["residual"][k]) for k in upload
                   if state["residual"][k].abs().sum() > 0)


def test_projection_head_is_fresh_per_client_and_round(lm):
    model, start, ids, labels = lm
    target = torch.nn.functional.normalize(torch.randn(8), dim=0)
    r1, _ = private_stage(model, start, ids, labels, target, CFG, 0.3, 0, 1, 0, 16)
    r2, _ = private_stage(model, start, ids, labels, target, CFG, 0.3, 0, 2, 0, 16)
    r1b, _ = private_stage(model, start, ids, labels, target, CFG, 0.3, 0, 1, 0, 16)
    assert all(torch.equal(r1[k], r1b[k]) for k in r1)
    assert any(not torch.equal(r1[k], r2[k]) for k in r1)
    plain, m = private_stage(model, start, ids, labels, None, CFG, 0.3, 0, 1, 0, 16)
    assert np.isnan(m["align_loss"])  # FAVoR w/o ASCE


def test_kappa_ramp_and_pooling():
    assert [kappa(s, 100) for s in (0, 1, 4, 5, 50)] == [0.0, 0.2, 0.8, 1.0, 1.0]
    assert kappa(0, 10) == 0.0 and kappa(1, 10) == 1.0  # ramp shorter than one step
    h = torch.tensor([[[1.0], [3.0]], [[5.0], [100.0]]])
    labels = torch.tensor([[1, 1], [1, -100]])
    assert float(pooled_hidden(h, labels)) == 3.0  # mean over the batch's supervised tokens


def _tiny_qwen(tmp_path, dtype=torch.float32, vocab=64):
    """A tiny Qwen2 saved to disk in ``dtype`` (as a Qwen2.5 checkpoint is in bf16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from fedray.methods.favor.lm import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 4, vocab)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(cfg).to(dtype).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path) is not None
    return str(tmp_path), len(tok)


def test_alignment_runs_on_a_bf16_lm(tmp_path):
    """A Qwen2.5 checkpoint (bf16, and bf16 compute under 4-bit) yields bf16 hidden states;
    the fp32 projection head used to fail on them ("mat1 and mat2 must have the same
    dtype") in favor, global_asce and every +ASCE variant."""
    from fedray.methods.favor.lm import load_lm, with_lora

    path, vocab = _tiny_qwen(tmp_path, torch.bfloat16)
    base, _ = load_lm(path, "cpu", dtype=torch.bfloat16)
    assert next(base.parameters()).dtype == torch.bfloat16
    model = with_lora(base, LoraSpec(r=4, alpha=8, dropout=0.05)).eval()
    start = adapter_of(model)
    ids = torch.randint(0, vocab, (8, 12), generator=torch.Generator().manual_seed(0))
    target = torch.nn.functional.normalize(torch.randn(8), dim=0)
    res, m = private_stage(model, start, ids, ids, target, CFG, align=0.3, seed=0, round=1,
                           client=0, proj_hidden=16)
    assert np.isfinite(m["align_loss"]) and np.isfinite(m["private_loss"])
    assert any(v.abs().sum() > 0 for v in res.values())


def test_chunked_loss_equals_the_models_own_loss_and_checkpointing_keeps_gradients(
        tmp_path, monkeypatch):
    """lm_loss (head applied chunk by chunk, each chunk checkpointed) equals the
    *ForCausalLM loss; with gradient checkpointing on (as for 4-bit training) the LoRA
    gradients equal those without it — the recomputed forward sees the swapped-in tensors."""
    import fedray.methods.favor.train as train
    from fedray.methods.favor.lm import load_lm, with_lora

    path, vocab = _tiny_qwen(tmp_path)
    ids = torch.randint(0, vocab, (4, 16), generator=torch.Generator().manual_seed(1))

    def grads(checkpointing: bool, chunk: int | None = None):
        base, _ = load_lm(path, "cpu", gradient_checkpointing=checkpointing)
        torch.manual_seed(3)  # LoRA's own init
        model = with_lora(base, LoraSpec(r=4, alpha=8, dropout=0.0))
        g = torch.Generator().manual_seed(2)
        adapter = {k: (v + 0.1 * torch.randn(v.shape, generator=g)).requires_grad_(True)
                   for k, v in adapter_of(model).items()}
        if chunk:
            monkeypatch.setattr(train, "LOGIT_CHUNK", chunk * vocab)
        model.train()
        with using(model, adapter):
            loss, _ = lm_loss(model, ids, ids)
            ref = model(input_ids=ids, labels=ids).loss
            loss.backward()
        monkeypatch.undo()
        assert any(getattr(m, "gradient_checkpointing", False)
                   for m in base.modules()) == checkpointing
        return loss.detach(), ref.detach(), {k: v.grad.clone() for k, v in adapter.items()}

    plain, ref, g0 = grads(False)
    torch.testing.assert_close(plain, ref, rtol=1e-6, atol=1e-6)
    chunked, _, g1 = grads(True, chunk=7)  # 60 predicted tokens in 9 chunks
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    assert any(v.abs().sum() > 0 for v in g0.values())
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-7)


def test_stages_draw_their_dropout_from_the_seed_not_the_process_history(lm):
    """LoRA dropout acts in training (train mode), with masks from (seed, round, client):
    the same stage gives the same adapter whatever the process drew before."""
    model, start, ids, labels = lm
    for m in model.modules():
        if hasattr(m, "lora_dropout"):
            m.lora_dropout["default"].p = 0.3
    try:
        a, _ = shared_stage(model, start, ids, labels, CFG, prox=0.0, seed=0, round=1,
                            client=0)
        torch.rand(1000)  # another client's work in between
        b, _ = shared_stage(model, start, ids, labels, CFG, prox=0.0, seed=0, round=1,
                            client=0)
        c, _ = shared_stage(model, start, ids, labels, CFG, prox=0.0, seed=0, round=1,
                            client=5)
    finally:
        for m in model.modules():
            if hasattr(m, "lora_dropout"):
                m.lora_dropout["default"].p = 0.0
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not model.training  # left in eval mode
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_the_configured_ramp_reaches_kappa_through_client_round(lm, tmp_path, monkeypatch):
    """``FavorParams.ramp`` used to stop at ``client_round`` (and the favor variant's call
    of it): the private stage always ramped κ_t over the default 5 %."""
    import fedray.methods.favor.train as train
    from fedray.core.config import load_config
    from fedray.core.registry import build_method
    from fedray.methods.base import ClientContext

    model, start, ids, labels = lm
    target = torch.nn.functional.normalize(torch.randn(8), dim=0)
    kw = dict(prox=0.01, align=0.3, seed=0, round=3, client=2, proj_hidden=16)
    # 2 optimizer steps: κ = (0, 1) at ramp 0.05, (0, 0.5) at ramp 1 — a different residual
    _, fast, _ = client_round(model, start, ids, labels, target, CFG, CFG, ramp=0.05, **kw)
    _, slow, _ = client_round(model, start, ids, labels, target, CFG, CFG, ramp=1.0, **kw)
    assert any(not torch.equal(fast["residual"][k], slow["residual"][k]) for k in start)
    direct, _ = private_stage(model, slow["shared"], ids, labels, target, CFG, 0.3, 0, 3, 2,
                              16, ramp=1.0)
    assert all(torch.equal(direct[k], slow["residual"][k]) for k in start)
    # from the config through the algorithm, for every variant with a private stage
    path, vocab = _tiny_qwen(tmp_path)
    seen: list[float] = []
    real = train.kappa
    monkeypatch.setattr(train, "kappa", lambda s, n, ramp=0.05: seen.append(ramp) or
                        real(s, n, ramp))
    for variant in ("favor", "global_asce", "ditto", "local"):
        over = {"algorithm.name": "favor", "algorithm.base": path,
                "algorithm.variant": variant, "algorithm.lora_rank": 2, "algorithm.lora_alpha": 4,
                "algorithm.micro_batch": 2, "algorithm.accumulation": 2,
                "algorithm.proj_hidden": 8, "algorithm.ramp": 0.37}
        cfg = load_config(None, [f"{k}={v}" for k, v in over.items()])
        alg = build_method(cfg)
        res = alg.build_resident((12,), 0, "cpu")
        x = np.random.default_rng(0).integers(0, vocab, (8, 12))
        seen.clear()
        alg.client_update(ClientContext(3, 1, 0, "lm", x, x, x[:2], x[:2], res, extra={
            "target": np.eye(8, dtype=np.float32)[0]}), alg.init_global_state(res, 0))
        assert seen and set(seen) == {0.37}, (variant, seen)


def test_lora_fedprox_uses_fedprox_own_half_mu(tmp_path):
    """FedProx's proximal term is μ/2 ‖A − A_t‖² (Li et al. 2020, eq. 2), as the registered
    ``fedprox`` has it; the shared stage's term has no ½ (FAVoR eq. 8), so the ``fedprox``
    variant's client update is the shared stage at prox = μ/2, not at μ."""
    from fedray.core.config import load_config
    from fedray.core.registry import build_method
    from fedray.methods.base import ClientContext
    from fedray.methods.favor.train import to_torch

    path, vocab = _tiny_qwen(tmp_path)
    mu = 40.0
    cfg = load_config(None, [f"algorithm.{k}={v}" for k, v in {
        "name": "favor", "base": path, "variant": "fedprox", "lambda_prox": mu,
        "lora_rank": 2, "lora_alpha": 4, "micro_batch": 2, "accumulation": 2,
        "shared_epochs": 2}.items()])
    alg = build_method(cfg)
    res = alg.build_resident((12,), 0, "cpu")
    x = np.random.default_rng(0).integers(0, vocab, (8, 12))
    g = alg.init_global_state(res, 0)
    g = {k: v + np.float32(0.05) for k, v in g.items()}  # away from A_t = 0 after a step
    out = alg.client_update(ClientContext(3, 1, 0, "lm", x, x, x[:2], x[:2], res), g)
    ids, start = torch.from_numpy(x), to_torch(g, "cpu")
    shared = alg._stages()[0]

    def delta(prox):
        end, _ = shared_stage(res["model"], start, ids, ids, shared, prox, seed=0, round=1,
                              client=3)
        return {k: (end[k] - start[k]).numpy() for k in start}

    half, whole = delta(mu / 2), delta(mu)
    assert all(np.array_equal(out.upload[k], half[k]) for k in half)
    assert any(not np.array_equal(half[k], whole[k]) for k in half)


@pytest.mark.parametrize("variant,max_steps,want", [
    ("favor", None, [30, 9]), ("fedavg", None, [10, 3]), ("local", None, [20, 6]),
    ("favor", 1, [8, 7]),  # each stage capped at 1 step × 2 × 2 blocks
])
def test_the_fleet_clock_counts_favors_own_stages(variant, max_steps, want):
    """FAVoR's local work is its stages' epochs (the shared stage, then the private one for
    the variants that train a personal adapter), not local.epochs, which it does not read."""
    from fedray.core.config import load_config
    from fedray.core.registry import build_method

    over = {"name": "favor", "base": "x", "variant": variant, "shared_epochs": 1,
            "private_epochs": 2, "micro_batch": 2, "accumulation": 2}
    if max_steps:
        over["max_steps"] = max_steps
    alg = build_method(load_config(None, [f"algorithm.{k}={v}" for k, v in over.items()]))
    assert alg.samples_seen(np.array([10, 3])).tolist() == want
