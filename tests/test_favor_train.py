"""FAVoR's client round (Algorithm 2) on a tiny real Qwen2 model with peft LoRA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.favor.adapter import LoraSpec
from fedray.favor.train import (
    StageConfig,
    adapter_of,
    client_round,
    compose,
    forward,
    kappa,
    pooled_hidden,
    private_stage,
    shared_stage,
)


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.favor.lm import with_lora

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
    a = forward(model, private, ids[:4], labels[:4]).loss
    b = forward(model, again, ids[:4], labels[:4]).loss
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
