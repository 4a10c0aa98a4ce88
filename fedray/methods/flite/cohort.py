"""FLITE's clients of a cohort as one batched computation (plain PyTorch, no Ray).

The K clients start from the one broadcast latent z̄ and train their own latents on their
own data through the one resident :class:`~fedray.methods.flite.mapping.LatentMapping`.
The latents are stacked (K, D) and each local step

1. generates every client's mapped weights at once, layer by layer, as one batched
   product θ_{l,k} = θ_l^pre + U_l (V_lᵀ Z_lᵀ) (:meth:`~fedray.methods.flite.mapping.
   LatentMapping.stacked_weights`): stored, U_l is read once for the cohort instead of
   once per client; regenerated, G_l is regenerated once per pass for the cohort (the
   streamed product takes the (r, K) right-hand side), forward and backward;
2. runs the frozen wrapped model per client under ``torch.func.vmap`` over
   ``functional_call`` with those (K, ...) weights, every other parameter and buffer
   shared, unbatched; each client's loss is the mean cross-entropy over its real rows,
   and one backward of their sum gives each client's latent its own gradient;
3. steps :class:`fedray.models.cohort.StackedAdam` with FLITE's weight decay and latent
   clip, per client (the clip over that client's whole latent).

Each client takes exactly its sequential batches (:func:`fedray.models.cohort.schedules`:
the permutations from (seed, round, client, purpose), ``max_steps``, the last short batch,
padded and masked); a client whose schedule has ended (or never began) is frozen: no step,
no moments, no weight decay. What is equal: each client's trained latent and metrics are
:meth:`fedray.methods.flite.method.Flite.client_update`'s up to float32 rounding (batched
products add in another order); ``tests/test_flite_cohort.py`` holds them within 1e-5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedray.models.cohort import (
    StackedAdam,
    concat_inputs,
    forward_problems,
    masked_mean,
    schedules,
)

AUTO_SHARE = 1 / 20
"""``runtime.vectorize=auto`` takes FLITE where its factor products are at least this share
of its network's multiply-adds per client step (:meth:`fedray.methods.flite.method.Flite.
cohort_fit`, which states the measurements)."""


def cohort_problems(model: torch.nn.Module, input_shape: Sequence[int], mode: str,
                    layers: list[str] | None, probe: bool = True) -> list[str]:
    """Why FLITE's clients on ``model`` cannot train as a cohort (empty: they can): a
    forward that keeps batch statistics or draws randomness, or (with ``probe``) a batched
    gradient that fails — one step of two clients on one zero sample each through a
    d = r = 1 ``mode`` mapping of ``model`` (cheap factors whatever the model; the batching
    does not depend on d or r), on the CPU. The probe's first ``vmap`` imports
    ``torch._dynamo`` (≈ 2 s), so ``runtime.vectorize=auto`` skips it."""
    from fedray.methods.flite.mapping import LatentMapping

    problems = forward_problems(model)
    if problems or not probe:
        return problems
    mapping = LatentMapping(model, d=1, r=1, seed=0, layers=layers, mode=mode)
    try:
        zero = (np.zeros((1, *input_shape), np.float32), np.zeros(1, np.int64))
        train_latents(mapping, np.zeros(mapping.D, np.float32), [zero, zero], [0, 1],
                      epochs=1, batch_size=1, lr=0.0, weight_decay=0.0, clip=None, seed=0,
                      round=0)
    except Exception as e:  # noqa: BLE001 — the reason is the answer
        return [f"a batched gradient fails: {type(e).__name__}: {str(e).splitlines()[0][:160]}"]
    return []


def train_latents(mapping: Any, start: np.ndarray, data: Sequence[tuple[np.ndarray, np.ndarray]],
                  clients: Sequence[int], *, epochs: int, batch_size: int, lr: float,
                  weight_decay: float, clip: float | None, seed: int, round: int,
                  max_steps: int | None = None, device: str = "cpu", purpose: str = "local"
                  ) -> list[tuple[np.ndarray, dict[str, float]]]:
    """Adam on the latents of ``clients`` (their ``data``: (x, y) each) from the flat
    latent ``start`` (D,), all at once: each client's trained flat latent (float32) and
    metrics (``train_loss``, ``steps``), in order. The knobs mean what they mean in
    :meth:`Flite._train <fedray.methods.flite.method.Flite._train>`; the mapping's own
    latents are left as they were."""
    from torch.func import functional_call, vmap

    k = len(data)
    model = mapping.model
    z = torch.as_tensor(np.asarray(start, np.float32), device=device)
    z = z.unsqueeze(0).repeat(k, 1).requires_grad_(True)
    opt = StackedAdam([z], k, lr, weight_decay=weight_decay, clip=clip)
    idx, mask = schedules(data, clients, epochs=epochs, batch_size=batch_size, seed=seed,
                          round=round, max_steps=max_steps, purpose=purpose)
    xs, ys = concat_inputs(data, device)

    def loss(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             m: torch.Tensor) -> torch.Tensor:
        return masked_mean(F.cross_entropy(functional_call(model, weights, (x,)).float(), y,
                                           reduction="none"), m)

    losses = vmap(loss)
    moving = torch.from_numpy(mask.sum(2) > 0)  # (steps, K): who steps when
    totals = np.zeros(k)
    mapping.train()
    for t in range(len(idx)):
        it, mt = torch.from_numpy(idx[t]).to(device), torch.from_numpy(mask[t]).to(device)
        opt.zero_grad()
        values = losses(mapping.stacked_weights(z), xs[it], ys[it], mt)
        values.sum().backward()
        opt.step(moving[t])
        totals += np.where(moving[t].numpy(), values.detach().cpu().double().numpy(), 0.0)
    counts = moving.sum(0).tolist()
    trained = z.detach().cpu().numpy()
    return [(trained[i].copy(), {"train_loss": float(totals[i]) / max(counts[i], 1),
                                 "steps": float(counts[i])}) for i in range(k)]
