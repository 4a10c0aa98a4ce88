"""ASCE: ArcFace loss and margin, pooling and normalisation, training separates authors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedray.methods.favor.asce import (
    ArcFace,
    StyleEncoder,
    author_target,
    default_backbone,
    embed,
    mean_pool,
    train_asce,
)


def test_arcface_is_the_papers_loss_with_the_margin_on_the_true_author():
    torch.manual_seed(0)
    head = ArcFace(8, 5, scale=30.0, margin=0.35)
    z = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    y = torch.tensor([0, 3, 3, 1])
    w = torch.nn.functional.normalize(head.weight, dim=-1)
    cos = z @ w.T
    want = []
    for i in range(4):
        a = int(y[i])
        s_a = 30 * math.cos(math.acos(float(cos[i, a].detach())) + 0.35)
        s_k = [30 * float(cos[i, k].detach()) for k in range(5) if k != a]
        want.append(-s_a + math.log(math.exp(s_a) + sum(math.exp(s) for s in s_k)))
    assert float(head(z, y)) == pytest.approx(np.mean(want), rel=1e-5)
    logits = head.logits(z, y)
    assert torch.all(logits[torch.arange(4), y] < 30 * cos[torch.arange(4), y])
    off = torch.ones_like(logits, dtype=torch.bool)
    off[torch.arange(4), y] = False
    assert torch.allclose(logits[off], 30 * cos[off], atol=1e-5)


def tiny_backbone(tmp_path):
    """A small random BERT with the shipped MiniLM tokenizer, saved like a hub model."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(default_backbone())
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return str(tmp_path)


def test_encoder_output_is_normalised_and_ignores_padding(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    path = tiny_backbone(tmp_path)
    enc = StyleEncoder(AutoModel.from_pretrained(path)).eval()
    tok = AutoTokenizer.from_pretrained(path)
    short = embed(enc, tok, ["a short text"])
    padded = embed(enc, tok, ["a short text", "a much longer text " * 10])[:1]
    assert np.allclose(np.linalg.norm(short, axis=1), 1, atol=1e-5)
    assert np.allclose(short, padded, atol=1e-5)  # padding does not enter the pooling
    h = torch.tensor([[[1.0], [3.0], [100.0]]])
    assert float(mean_pool(h, torch.tensor([[1, 1, 0]]))) == 2.0
    q = author_target(np.array([[2.0, 0], [0, 1.0]]))
    assert np.allclose(q, [2 ** -0.5, 2 ** -0.5])


def test_training_separates_synthetic_authors(tmp_path):
    from fedray.data.authors import generate_corpus
    from fedray.data.blogtext import load_authors
    from fedray.methods.favor.style_metrics import prototype_accuracy

    path = tiny_backbone(tmp_path / "bb")
    csv = generate_corpus(tmp_path / "b.csv", num_authors=6, seed=1, posts=(16, 20))
    authors = load_authors(csv, lambda t: 1, min_tokens=1)
    texts = [t for a in authors for t in a.train]
    labels = [a.id for a in authors for _ in a.train]
    enc, tok, m = train_asce(texts, labels, path, epochs=4, lr=1e-3, batch_size=16,
                             max_length=64)
    assert m["last_epoch_loss"] < m["first_epoch_loss"]
    assert not any(p.requires_grad for p in enc.parameters())  # frozen
    held = [t for a in authors for t in a.test + a.val]
    held_y = [a.id for a in authors for _ in a.test + a.val]
    acc = prototype_accuracy(embed(enc, tok, held, max_length=64), held_y,
                             embed(enc, tok, texts, max_length=64), labels)
    assert acc["author_accuracy"] > 2 / 6  # chance is 1/6
