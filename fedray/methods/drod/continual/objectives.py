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

import numpy as np
import torch
import torch.nn.functional as F


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
