"""Adapter sizes without downloads, checked against a real peft save on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fedray.methods.favor.adapter import LoraSpec, adapter_size, family_config, measure_adapter


def test_qwen25_3b_adapter_matches_the_paper():
    info = adapter_size("qwen2.5-3b-instruct")
    assert info["trainable_parameters"] == 29_933_568  # "29.93M"
    assert info["safetensors_bytes"] == 119_801_528  # "114.3 MiB"
    assert round(info["safetensors_mib"], 1) == 114.3
    assert info["hub_id"] == "Qwen/Qwen2.5-3B-Instruct" and info["tensors"] == 36 * 7 * 2
    half = adapter_size("qwen2.5-3b-instruct", LoraSpec(r=8))
    assert half["trainable_parameters"] == 29_933_568 // 2
    with pytest.raises(ValueError, match="unknown model"):
        family_config("llama-70b")


def test_measured_bytes_equal_a_real_save_pretrained(tmp_path):
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=80,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True)
    lora = LoraSpec(r=4, alpha=8)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(cfg), lora.peft_config())
    model.save_pretrained(tmp_path)
    real = os.path.getsize(tmp_path / "adapter_model.safetensors")
    measured = measure_adapter(cfg, lora)
    assert measured["safetensors_bytes"] == real
    assert measured["trainable_parameters"] == sum(
        p.numel() for p in model.parameters() if p.requires_grad)


def test_cli_prints_json():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-m", "fedray", "favor", "adapter-size", "--model",
                          "qwen2.5-0.5b-instruct", "--rank", "16", "--json"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-1000:]
    info = json.loads(res.stdout)
    assert info["layers"] == 24 and info["trainable_parameters"] > 0
