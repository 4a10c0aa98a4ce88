"""The loss of one local step of DROD and of the baselines it runs as: the sampled
sub-model's cross-entropy (Ordered Dropout), FjORD's self-distillation from the tier's
largest model, ScaleFL's early exits distilled from the final one, and the continual
objectives — ER / DER++ replay, BiC's corrected logits and distillation, EWC's penalty.
One place for the terms, in the order they are drawn (the replay samples and the
augmentations consume their generators step by step, so the order is part of the result)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class LocalObjective:
    """One client's objective for one round (``method``: the continual objective, ``none``
    without tasks); ``old`` are the classes of earlier tasks, ``lam`` BiC's share of the
    distillation, ``scale``/``shift`` BiC's frozen corrections of the old classes' logits."""

    method: str
    params: Any  # the method's HeteroParams (kd, kd_alpha, kd_temperature, axis)
    continual: Any  # cfg.continual
    old: Any
    lam: float
    scale: Any
    shift: Any
    teacher: Any  # BiC: the previous task's model, frozen (None otherwise)
    buffer: Any  # the replay buffer (ER, DER++, BiC) or None
    gen: np.random.Generator  # the replay draws
    replay: int  # replayed samples per step
    fisher: Any  # EWC's Fisher information (None without EWC)
    anchor: Any  # EWC's anchor parameters
    augment: Callable[[Any], Any]
    depths: tuple[int, ...]  # ScaleFL's exit depths
    own: Any  # the tier's own (largest) geometry
    device: str

    def corrected(self, out: Any, which: Any) -> Any:
        """BiC: the frozen corrections of the old classes' logits (stage 1)."""
        import torch

        if self.method != "bic" or not len(which):
            return out
        a, b = torch.ones_like(self.scale), torch.zeros_like(self.shift)
        a[which], b[which] = self.scale[which], self.shift[which]
        return out * a.to(out.device) + b.to(out.device)

    def distill(self, student: Any, teacher: Any) -> Any:
        """α T² KL(σ(teacher/T) ‖ σ(student/T)), the teacher detached."""
        import torch.nn.functional as F

        t = self.params.kd_temperature
        return self.params.kd_alpha * t * t * F.kl_div(
            F.log_softmax(student / t, 1), F.softmax(teacher.detach() / t, 1),
            reduction="batchmean")

    def inputs(self, xb: Any, yb: Any) -> tuple[Any, Any]:
        """The step's batch, with replayed samples appended (ER, BiC)."""
        import torch

        buffer = self.buffer
        if buffer is None or self.method not in ("er", "bic") or not len(buffer):
            return xb, yb
        bi = buffer.sample(self.replay, self.gen)
        return (torch.cat([xb, torch.from_numpy(buffer.x[bi]).to(self.device)]),
                torch.cat([yb, torch.from_numpy(buffer.y[bi]).to(self.device)]))

    def loss(self, model: Any, xin: Any, yin: Any, sub: Any) -> tuple[Any, Any]:
        """(the step's loss, the final exit's uncorrected logits) of sub-model ``sub``."""
        import torch
        import torch.nn.functional as F

        from fedray.methods.drod.continual.objectives import bic_distill, ewc_penalty

        hp, cl, old, dev = self.params, self.continual, self.old, self.device
        xa = self.augment(xin)
        outs = [o.float() for o in model.exit_logits(
            xa, sub, self.depths if hp.axis == "scalefl" else ())]
        out = outs[-1]
        logits = self.corrected(out, old)
        loss = F.cross_entropy(logits, yin)
        for early in outs[:-1]:  # ScaleFL: exits distilled from the final one
            early = self.corrected(early, old)
            loss = loss + (1 - hp.kd_alpha) * F.cross_entropy(early, yin) + \
                self.distill(early, logits)
        if hp.kd and sub != self.own:  # FjORD w/ KD: the tier's largest model teaches
            t_logits = self.corrected(model(xa, self.own).float(), old)
            loss = (1 - hp.kd_alpha) * loss + self.distill(logits, t_logits) + \
                F.cross_entropy(t_logits, yin)
        if self.teacher is not None and len(old):
            with torch.no_grad():
                t_out = self.corrected(self.teacher(xa, sub).float(), old)
            loss = self.lam * bic_distill(logits, t_out, old, cl.bic_temperature) + \
                (1 - self.lam) * loss
        buffer = self.buffer
        if self.method == "derpp" and len(buffer):
            b1, b2 = buffer.sample(self.replay, self.gen), buffer.sample(self.replay, self.gen)
            z = model(self.augment(torch.from_numpy(buffer.x[b1]).to(dev)), sub).float()
            loss = loss + cl.derpp_alpha * F.mse_loss(
                z, torch.from_numpy(buffer.logits[b1]).to(dev))
            z2 = model(self.augment(torch.from_numpy(buffer.x[b2]).to(dev)), sub).float()
            loss = loss + cl.derpp_beta * F.cross_entropy(
                z2, torch.from_numpy(buffer.y[b2]).to(dev))
        if self.fisher is not None:
            loss = loss + cl.ewc_lambda * ewc_penalty(dict(model.named_parameters()),
                                                      self.fisher, self.anchor)
        return loss, out
