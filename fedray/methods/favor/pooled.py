"""Pooled PEFT, FAVoR's centralized reference: one LoRA adapter trained on the union of the
roster's (allocated) training text, outside any federation, then used by every author.

Budget (our choice; the paper gives none): the union is seen for ``ceil(R·C/N)`` shared
epochs, the federation's expected passes over each author's data rounded up.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def train_pooled(cfg: Any, data: Any, device: str = "cpu") -> dict[str, np.ndarray]:
    import torch

    from fedray.core.registry import build_method
    from fedray.methods.favor.train import StageConfig, shared_stage, to_numpy, to_torch

    alg = build_method(cfg)
    res = alg.build_resident(data.input_shape, 0, device)
    start = to_torch(alg.init_global_state(res, cfg.seed), device)
    p = alg.params
    epochs = p.shared_epochs * math.ceil(cfg.rounds * cfg.clients.sampled_count()
                                         / cfg.clients.num_clients)
    ids = torch.from_numpy(np.concatenate(data.train)).to(device)
    stage = StageConfig(epochs, p.micro_batch, p.accumulation, p.lora_lr, p.max_steps)
    end, _ = shared_stage(res["model"], start, ids, ids, stage, 0.0, cfg.seed, 0, 0)
    return to_numpy(end)
