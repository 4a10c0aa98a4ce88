"""The causal LM behind FAVoR's clients: Qwen2.5 through ``from_pretrained`` (4-bit NF4 with
bf16 compute via bitsandbytes on CUDA, full precision on CPU), or the embedded default — a
Qwen2-architecture model of a few million parameters with a byte-level BPE tokenizer, both
trained here centrally on authors disjoint from the FL roster and cached on disk.

Everything returns plain Hugging Face objects; LoRA is added by :func:`with_lora`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fedray.core.storage import read_marker, write_marker


@dataclass
class TinyLM:
    """The embedded default's size (Qwen2 architecture) and its central pretraining."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 352
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_length: int = 128
    steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0

    def key(self) -> str:
        return "tiny-qwen2-" + "-".join(str(v) for v in asdict(self).values())


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE tokenizer (casing, punctuation and emoticons survive: they carry
    style) as a ``PreTrainedTokenizerFast`` with pad/eos tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def blocks(tokenizer: Any, texts: Sequence[str], length: int) -> np.ndarray:
    """Texts tokenized, each followed by EOS, concatenated and cut into ``length`` blocks."""
    ids: list[int] = []
    for t in texts:
        ids += tokenizer(t)["input_ids"] + [tokenizer.eos_token_id]
    n = len(ids) // length
    return np.asarray(ids[:n * length], dtype=np.int64).reshape(n, length)


def pretrain_tiny(texts: Sequence[str], out_dir: str, spec: TinyLM | None = None,
                  progress: Callable[[int, int], None] | None = None) -> str:
    """Train the tokenizer and the tiny LM on ``texts`` (plain next-token prediction, our
    Adam with cosine decay) and ``save_pretrained`` both into ``out_dir``; reuse a cached
    copy with the same spec and texts. Returns ``out_dir``. ``progress(steps done, steps)``
    follows the training."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from fedray.core.seeding import derive_seed, rng
    from fedray.models.training import Adam

    spec = spec or TinyLM()
    marker = os.path.join(out_dir, "fedray_tiny_lm.json")
    key = spec.key() + "-" + hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()
    if (read_marker(marker) or {}).get("key") == key:
        return out_dir
    tok = train_tokenizer(texts, spec.vocab_size)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=spec.hidden_size,
                      intermediate_size=spec.intermediate_size,
                      num_hidden_layers=spec.num_hidden_layers,
                      num_attention_heads=spec.num_attention_heads,
                      num_key_value_heads=spec.num_key_value_heads,
                      max_position_embeddings=1024, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.eos_token_id)
    torch.manual_seed(derive_seed(spec.seed, -1, -1, "tiny-lm-init"))
    model = AutoModelForCausalLM.from_config(cfg)
    data = torch.from_numpy(blocks(tok, texts, spec.max_length))
    opt = Adam(list(model.parameters()), lr=spec.lr, clip=1.0)
    gen = rng(spec.seed, -1, -1, "tiny-lm-batches")
    model.train()
    losses = []
    for step in range(spec.steps):
        opt.lr = spec.lr * 0.5 * (1 + math.cos(math.pi * step / spec.steps))
        idx = torch.from_numpy(gen.integers(0, len(data), spec.batch_size))
        out = model(input_ids=data[idx], labels=data[idx])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
        if progress is not None:
            progress(step + 1, spec.steps)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    write_marker(marker, {"key": key, "final_loss": float(np.mean(losses[-50:])),
                          "parameters": sum(p.numel() for p in model.parameters())})
    return out_dir


def load_lm(name_or_path: str, device: str = "cpu", four_bit: bool | None = None,
            dtype: torch.dtype | None = None, gradient_checkpointing: bool | None = None):
    """(model, tokenizer) from a hub id or directory, in eval mode, frozen.

    On CUDA the weights load in 4-bit NF4 with double quantization, and every other tensor
    and the compute in bf16 (QLoRA), unless ``four_bit=False`` (then bf16); ``dtype`` is
    always set explicitly (transformers < 5 would otherwise load fp16, which overflows on
    Qwen). On CPU fp32 unless ``dtype`` says otherwise. ``gradient_checkpointing`` (default:
    on for 4-bit) recomputes each decoder layer's activations in the backward, non-reentrant
    so that LoRA tensors swapped in by :func:`fedray.methods.favor.train.using` are seen by the
    recomputation; the frozen non-quantized weights are *not* upcast to fp32 (what peft's
    ``prepare_model_for_kbit_training`` does), which would add 4 bytes per embedding weight
    — 1.2 GB for Qwen2.5-3B's 151,936 × 2,048 tied embedding — to every executor."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cuda = device.startswith("cuda")
    quantized = cuda and four_bit is not False
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    if quantized:
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_compute_dtype=torch.bfloat16,
                                   bnb_4bit_use_double_quant=True)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, quantization_config=quant,
                                                     dtype=torch.bfloat16,
                                                     device_map={"": device})
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).to(device)
    model.requires_grad_(False)
    if quantized if gradient_checkpointing is None else gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.enable_input_require_grads()
    return model.eval(), tok


def with_lora(model: Any, lora: Any) -> Any:
    """``model`` wrapped by peft with the LoRA spec (only the LoRA factors are trainable)."""
    from peft import get_peft_model

    return get_peft_model(model, lora.peft_config())
