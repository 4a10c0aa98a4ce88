"""The local pieces of the continual-learning objectives, in plain PyTorch.

- ER (Chaudhry et al., 2019): replayed exemplars are concatenated to the batch.
- DER++ (Buzzega et al., 2020): ``CE + α‖f(x') − z'‖² + β CE(f(x''), y'')`` with z' the
  logits stored when x' entered the buffer.
- EWC, online (Schwarz et al., 2018): ``λ/2 Σ F (θ − θ*)²``, F the diagonal Fisher of the
  model's own predictive distribution at the end of a task, accumulated ``F ← γF + F_new``.
- BiC (Wu et al., 2019): stage 1 ``λ L_distill + (1 − λ) CE`` with λ = old/(old + new)
  classes and temperature T on the old classes against the model that finished the previous
  task; stage 2 fits ``α o + β`` on the new classes' logits over a held-out split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from fedray.core.seeding import rng
from fedray.models.training import input_tensor

if TYPE_CHECKING:
    from fedray.methods.base import ClientContext


def ewc_penalty(params: dict[str, torch.Tensor], fisher: dict[str, torch.Tensor],
                anchor: dict[str, torch.Tensor]) -> torch.Tensor:
    """``½ Σ F (θ − θ*)²`` over the named parameters (multiply by λ outside)."""
    total = torch.zeros(())
    for k, p in params.items():
        total = total + (fisher[k] * (p - anchor[k]) ** 2).sum()
    return 0.5 * total


def fisher_diagonal(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                    forward: Callable) -> dict:
    """Diagonal Fisher estimate ``mean_i p(y_i|x_i) (∂ log p(y_i|x_i)/∂θ)²`` with the true
    labels, one sample at a time (Mammoth's ewc_on: the squared gradient of the label's
    log-likelihood weighted by its probability)."""
    fisher = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for i in range(len(x)):
        model.zero_grad()
        logp = F.log_softmax(forward(x[i:i + 1]), 1)
        nll = -logp[0, y[i]]
        nll.backward()
        weight = float(torch.exp(-nll.detach()))
        for k, p in model.named_parameters():
            if p.grad is not None:
                fisher[k] += weight * p.grad.detach() ** 2
    model.zero_grad()
    return {k: v / max(len(x), 1) for k, v in fisher.items()}


def bic_distill(student: torch.Tensor, teacher: torch.Tensor, old: torch.Tensor,
                temperature: float) -> torch.Tensor:
    """Soft cross-entropy on the old classes at temperature T, ``−Σ π̂ log π`` averaged."""
    t = F.softmax(teacher[:, old] / temperature, 1)
    return -(t * F.log_softmax(student[:, old] / temperature, 1)).sum(1).mean()


def fit_bias(logits: torch.Tensor, y: torch.Tensor, new: torch.Tensor, alpha: float,
             beta: float, steps: int, lr: float) -> tuple[float, float]:
    """BiC stage 2: (α, β) minimising CE of the logits with ``α o + β`` on the new classes
    (everything else frozen), by full-batch gradient descent from (alpha, beta)."""
    a = torch.tensor(alpha, requires_grad=True)
    b = torch.tensor(beta, requires_grad=True)
    mask = torch.zeros(logits.shape[1], dtype=torch.bool)
    mask[new] = True
    for _ in range(steps):
        out = torch.where(mask, logits * a + b, logits)
        loss = F.cross_entropy(out, y)
        ga, gb = torch.autograd.grad(loss, (a, b))
        with torch.no_grad():
            a -= lr * ga
            b -= lr * gb
    return float(a.detach()), float(b.detach())


def old_classes(classes: list[np.ndarray], task: int) -> np.ndarray:
    """The classes of the tasks before ``task``."""
    return np.concatenate(classes[:task]) if task else np.zeros(0, np.int64)


def continual_state(ctx: ClientContext, model: Any, state: dict, net: dict,
                    masks: dict | None, method: str, task: int, last: bool, samples: int,
                    gamma: float) -> tuple[dict | None, dict | None]:
    """The client's continual state for this round, updated in place, and EWC's (Fisher,
    anchor θ*) for its penalty (None, None: no penalty this round). At a new task's first
    round the broadcast is kept as the anchor (BiC's teacher, EWC's θ*); at a task's last
    round EWC's Fisher is estimated at the broadcast weights (``model`` holds them) on
    ``samples`` of the client's samples and added to γ × the previous one — after the
    penalty's own Fisher was read, so this round is pulled towards the earlier tasks only."""
    if method in ("bic", "ewc") and task > 0 and state.get("anchor_task") != task:
        # the model that finished the previous task: BiC's teacher, EWC's anchor θ*
        state["anchor"], state["anchor_task"] = dict(net), task
    dev = ctx.device
    fisher = anchor = None
    if method == "ewc" and task > 0 and "fisher" in state:
        fisher = {k: torch.from_numpy(v).to(dev) for k, v in state["fisher"].items()}
        anchor = {k: torch.from_numpy(v).to(dev) for k, v in state["anchor"].items()}
    if method == "ewc" and last:  # this task's Fisher at the broadcast (global) weights
        x, y = input_tensor(ctx.x_train, dev), input_tensor(ctx.y_train, dev)
        pick = torch.from_numpy(rng(ctx.seed, ctx.round, ctx.client_id, "fisher")
                                .choice(len(x), min(samples, len(x)), replace=False))
        new = fisher_diagonal(model, x[pick], y[pick], lambda t: model(t))
        for k, m in (masks or {}).items():  # FIARSE: no pull on entries outside the mask
            new[k] = new[k] * torch.from_numpy(m).to(new[k].device)
        prev = state.get("fisher")
        state["fisher"] = {k: (gamma * prev[k] if prev else 0) + v.cpu().numpy()
                           for k, v in new.items()}
    return fisher, anchor
