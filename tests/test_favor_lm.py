"""The embedded base LM: tokenizer and tiny Qwen2 trained here, cached, loaded back."""

from __future__ import annotations

import json
import os
import time

from fedray.methods.favor.adapter import LoraSpec
from fedray.methods.favor.lm import (
    TinyLM,
    blocks,
    load_lm,
    pretrain_tiny,
    train_tokenizer,
    with_lora,
)


def test_tokenizer_keeps_style_marks():
    texts = ["Hello WORLD!!! :) ...", "so tired... xD", "Cheers."] * 20
    tok = train_tokenizer(texts, 300)
    for t in ("Hello WORLD!!! :) ...", "so tired... xD"):
        assert tok.decode(tok(t)["input_ids"]) == t  # casing, punctuation, emoticons survive
    b = blocks(tok, texts, 8)
    assert b.shape[1] == 8 and (b == tok.eos_token_id).any()


def test_pretrain_cache_and_load(tmp_path):
    from fedray.data.authors import generate_corpus
    from fedray.data.blogtext import load_authors

    csv = generate_corpus(tmp_path / "c.csv", num_authors=4, seed=2, posts=(10, 12))
    texts = [t for a in load_authors(csv, lambda t: 1, min_tokens=1) for t in a.train]
    spec = TinyLM(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  steps=30, batch_size=4, max_length=32)
    out = pretrain_tiny(texts, str(tmp_path / "lm"), spec)
    meta = json.load(open(os.path.join(out, "fedray_tiny_lm.json")))
    assert meta["key"].startswith(spec.key()) and meta["final_loss"] < 6.0
    t0 = time.perf_counter()
    assert pretrain_tiny(texts, out, spec) == out and time.perf_counter() - t0 < 1.0  # cached
    other = pretrain_tiny(texts[1:], str(tmp_path / "lm2"), spec)  # other corpus, other key
    assert json.load(open(os.path.join(other, "fedray_tiny_lm.json")))["key"] != meta["key"]
    model, tok = load_lm(out)
    assert not any(p.requires_grad for p in model.parameters())
    peft_model = with_lora(model, LoraSpec(r=2, alpha=4))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = tok("Today, I went to the", return_tensors="pt")
    gen = peft_model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]
