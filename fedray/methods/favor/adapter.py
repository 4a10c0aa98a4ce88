"""LoRA adapters on causal LMs through peft, and their size without downloading anything.

The architecture numbers of the supported families ship here (from their published
``config.json``), so ``fedray favor adapter-size`` builds the model on the meta device, wraps
it with peft exactly as training does, counts the trainable parameters, and serializes the
adapter's state dict (names and shapes as ``save_pretrained`` writes them) with safetensors
to get its exact byte size. Qwen2.5-3B-Instruct at r = 16 on q,k,v,o,gate,up,down:
29,933,568 parameters, 119,801,528 bytes (114.3 MiB), as FAVoR table 32 reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Qwen2-architecture numbers (hidden, intermediate, layers, heads, kv heads, tied embeddings)
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b-instruct": dict(hidden_size=896, intermediate_size=4864,
                                  num_hidden_layers=24, num_attention_heads=14,
                                  num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b-instruct": dict(hidden_size=1536, intermediate_size=8960,
                                  num_hidden_layers=28, num_attention_heads=12,
                                  num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-3b-instruct": dict(hidden_size=2048, intermediate_size=11008,
                                num_hidden_layers=36, num_attention_heads=16,
                                num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b-instruct": dict(hidden_size=3584, intermediate_size=18944,
                                num_hidden_layers=28, num_attention_heads=28,
                                num_key_value_heads=4, tie_word_embeddings=False),
}
HUB_IDS = {k: "Qwen/" + k.replace("qwen", "Qwen").replace("-instruct", "-Instruct")
           .replace("b-", "B-") for k in FAMILIES}


@dataclass
class LoraSpec:
    """FAVoR's adapter (table 32): r = 16, α = 32, dropout 0.05 on all seven projections."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: tuple[str, ...] = field(default=TARGETS)

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.targets), task_type="CAUSAL_LM")


def family_config(name: str):
    from transformers import Qwen2Config

    key = name.lower().removeprefix("qwen/")
    if key not in FAMILIES:
        raise ValueError(f"unknown model {name!r}; shipped: {', '.join(FAMILIES)}")
    return Qwen2Config(vocab_size=151936, max_position_embeddings=32768, **FAMILIES[key])


def measure_adapter(cfg: Any, lora: LoraSpec) -> dict[str, int]:
    """Build ``cfg``'s model on the meta device, wrap it with peft, and measure the adapter:
    trainable parameters, tensors, and the bytes ``save_pretrained`` writes (fp32)."""
    import warnings

    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save
    from transformers import AutoModelForCausalLM

    if lora.r < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {lora.r}")
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(AutoModelForCausalLM.from_config(cfg), lora.peft_config())
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    state = get_peft_model_state_dict(peft_model)
    nbytes = len(save({k: torch.empty(v.shape, dtype=torch.float32) for k, v in state.items()},
                      metadata={"format": "pt"}))
    return {"trainable_parameters": trainable, "tensors": len(state),
            "safetensors_bytes": nbytes}


def adapter_size(model: str, lora: LoraSpec | None = None) -> dict[str, Any]:
    """Trainable parameters and serialized (safetensors, fp32) bytes of the adapter."""
    lora = lora or LoraSpec()
    cfg = family_config(model)
    m = measure_adapter(cfg, lora)
    return {"model": model.lower(), "hub_id": HUB_IDS[model.lower().removeprefix("qwen/")],
            "rank": lora.r, "alpha": lora.alpha, "targets": list(lora.targets),
            "layers": cfg.num_hidden_layers, **m,
            "safetensors_mib": m["safetensors_bytes"] / 2**20}
