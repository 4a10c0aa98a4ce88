"""The sub-model methods' clients of one tier as one batched computation (``runtime.vectorize``).

A cohort is cut within one tier (:class:`fedray.runtime.dispatch.Dispatcher`), so its
clients hold the same sub-model of the shared network and start from the same broadcast.
Their parameters are stacked along a client axis. Under Ordered Dropout each client still
draws its own nested sub-model at every step (:func:`~fedray.methods.drod.selection.od_choices`
from (seed, round, client)), so a step groups the cohort's clients by the rung they drew and
runs each group as one ``vmap(grad_and_value(loss))`` over ``functional_call`` of the tier's
model at that rung's geometry: at most ``len(grid)`` batched calls a step (one under the
static, rolling and FIARSE rules), every client's arithmetic its sequential run's.

What each client keeps of :meth:`Hetero._train <fedray.methods.drod.method.Hetero._train>`:
its own batches (the same permutations, ``max_steps`` and last short batch, padded and
masked: GroupNorm normalizes each sample alone, so a padded row changes no real one), its
own augmentation draws (crop and flip from its own generator, in its order), FjORD's
self-distillation (``kd``), ScaleFL's exits, FIARSE's gradient mask, EWC's penalty with its
own Fisher and anchor, and SGD's update — which, as in the sequential path, moves only the
parameters the drawn sub-model reaches (a parameter without a gradient is skipped: no
weight decay, no momentum; a sliced one decays whole). The continual objectives that replay
(ER, DER++ and BiC draw from and write to each client's reservoir buffer at every step, and
BiC also trains its bias stage) are refused (:func:`cohort_refusal`): their clients train
one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedray.core.seeding import torch_generator
from fedray.methods.drod.continual.data import task_of_round
from fedray.methods.drod.continual.objectives import continual_state, ewc_penalty
from fedray.methods.drod.selection import od_choices
from fedray.models.cohort import (
    concat_inputs,
    masked_mean,
    schedules,
    sgd_step,
    stacked_parameters,
)
from fedray.models.training import random_crop_flip

REPLAYING = ("er", "derpp", "bic")


def cohort_refusal(cfg: Any) -> str | None:
    """Why a sub-model config's clients cannot train as cohorts (None: they can)."""
    cl = cfg.continual
    if cl.tasks and cl.method in REPLAYING:
        return (f"continual.method={cl.method} replays from each client's own buffer, "
                f"drawn and written at every step (none and ewc run as cohorts)")
    return None


class _Exits(nn.Module):
    """The tier's model with :meth:`~fedray.models.sliceable.SliceableResNet.exit_logits`
    as its forward, so ``functional_call`` can run any nested sub-model's exits."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, sub: Any, depths: tuple[int, ...]) -> list:
        return self.net.exit_logits(x, sub, depths)


@dataclass
class TierTrained:
    """One client's result of :func:`train_tier_cohort`: its trained parameters (float32,
    by name), metrics as :meth:`Hetero._train` reports them and its client state."""

    params: dict[str, np.ndarray]
    metrics: dict[str, float]
    state: dict = field(default_factory=dict)


def _used(model: nn.Module, sub: Any, own: Any, exits: tuple[int, ...], kd: bool,
          shape: tuple[int, ...]) -> list[bool]:
    """Which of ``model``'s trainable parameters a step on sub-model ``sub`` gives a
    gradient (its forward, the exits it trains, and the tier's own model under ``kd``):
    the ones sequential SGD moves."""
    params = [p for p in model.parameters() if p.requires_grad]
    x = torch.zeros((2, *shape), device=params[0].device)
    outs = model.exit_logits(x, sub, exits)
    if kd:
        outs = [*outs, model(x, own)]
    grads = torch.autograd.grad(sum(o.float().sum() for o in outs), params, allow_unused=True)
    return [g is not None for g in grads]


@dataclass
class _Stack:
    """The cohort's trainable tensors stacked along a client axis (dim 0), SGD's momentum
    buffers, and EWC's stacked Fisher and anchor (None without a penalty this round);
    ``pulled``: which clients have a Fisher (F = 0 for the others: no term, no gradient)."""

    names: list[str]
    params: list[nn.Parameter]
    bufs: list[torch.Tensor]
    fisher: list[torch.Tensor] | None
    anchor: list[torch.Tensor] | None
    pulled: torch.Tensor | None

    @classmethod
    def of(cls, model: nn.Module, ewc: list[tuple[dict | None, dict | None]]) -> _Stack:
        named = dict(model.named_parameters())
        names = [n for n, p in named.items() if p.requires_grad]
        k = len(ewc)
        params = stacked_parameters(named, names, k)
        fisher = anchor = pulled = None
        if any(f is not None for f, _ in ewc):
            fisher = [torch.stack([f[n] if f is not None else torch.zeros_like(named[n])
                                   for f, _ in ewc]) for n in names]
            anchor = [torch.stack([a[n] if a is not None else torch.zeros_like(named[n])
                                   for _, a in ewc]) for n in names]
            pulled = torch.tensor([f is not None for f, _ in ewc], device=params[0].device)
        return cls(names, params, [torch.zeros_like(p) for p in params], fisher, anchor, pulled)

    def rows(self, members: list[int]) -> tuple[tuple[torch.Tensor, ...], tuple]:
        """The members' parameters and, under EWC, their (Fisher, anchor) stacks."""
        sub = tuple(p.detach()[members] for p in self.params)
        if self.fisher is None:
            return sub, ()
        return sub, ([f[members] for f in self.fisher], [a[members] for a in self.anchor])

    def step(self, members: list[int], sub: tuple[torch.Tensor, ...], grads: tuple,
             used: list[bool], keep: dict[int, torch.Tensor], loc: Any) -> None:
        """SGD on the members' rows, tensor by tensor: a tensor the drawn sub-model reaches
        moves for every member, one it does not reach only for an EWC-pulled member (the
        penalty gives every parameter a gradient); FIARSE's masked entries get none."""
        dev = self.params[0].device
        every = torch.ones(len(members), dtype=torch.bool, device=dev)
        pulled = self.pulled[members] if self.pulled is not None else None
        for j, (p, g) in enumerate(zip(self.params, grads, strict=True)):
            active = every if used[j] else pulled
            if active is None or not bool(active.any()):
                continue
            if j in keep:
                g = g * keep[j]
            moved = nn.Parameter(sub[j].clone())
            moved.grad = g
            kept = [self.bufs[j][members]]
            sgd_step([moved], kept, active, loc.lr, loc.momentum, loc.weight_decay)
            with torch.no_grad():
                p[members] = moved.detach()
            self.bufs[j][members] = kept[0]


def distill(student: torch.Tensor, teacher: torch.Tensor, m: torch.Tensor, t: float,
            alpha: float) -> torch.Tensor:
    """FjORD's / ScaleFL's self-distillation ``α T² KL(σ(teacher/T) ‖ σ(student/T))``, the
    teacher detached, averaged over the client's real rows (``m``)."""
    kl = F.kl_div(F.log_softmax(student / t, 1), F.softmax(teacher.detach() / t, 1),
                  reduction="none").sum(1)
    return alpha * t * t * masked_mean(kl, m)


def _stepper(method: Any, model: nn.Module, names: list[str], sub: Any, kd: bool,
             exits: tuple[int, ...], pulled: bool):
    """``vmap(grad_and_value(loss))`` of one client's step on sub-model ``sub``: the
    sequential objective of :meth:`Hetero._train <fedray.methods.drod.method.Hetero._train>`
    (cross-entropy; ScaleFL's exits; FjORD's KD from the tier's own model; EWC's penalty
    when ``pulled``), averaged over the client's real rows."""
    hp, cl = method.params, method.cfg.continual
    wrapped, own = _Exits(model), model.geometry
    named = dict(model.named_parameters())
    fixed = {f"net.{n}": b for n, b in model.named_buffers()}
    fixed |= {f"net.{n}": p.detach() for n, p in named.items() if not p.requires_grad}
    t, alpha = hp.kd_temperature, hp.kd_alpha

    def loss(flat, x, y, m, *ewc_terms):
        p = {f"net.{n}": v for n, v in zip(names, flat, strict=True)}
        outs = [o.float() for o in functional_call(wrapped, (p, fixed), (x, sub, exits))]
        logits = outs[-1]
        value = masked_mean(F.cross_entropy(logits, y, reduction="none"), m)
        for early in outs[:-1]:  # ScaleFL: exits distilled from the final one
            value = value + (1 - alpha) * masked_mean(
                F.cross_entropy(early, y, reduction="none"), m) + distill(early, logits, m, t,
                                                                         alpha)
        if kd:  # FjORD w/ KD: the tier's largest model teaches
            t_logits = functional_call(wrapped, (p, fixed), (x, own, ()))[-1].float()
            value = (1 - alpha) * value + distill(logits, t_logits, m, t, alpha) + \
                masked_mean(F.cross_entropy(t_logits, y, reduction="none"), m)
        if pulled:
            f, a = ewc_terms
            value = value + cl.ewc_lambda * ewc_penalty(
                dict(zip(names, flat, strict=True)), dict(zip(names, f, strict=True)),
                dict(zip(names, a, strict=True)))
        return value

    return vmap(grad_and_value(loss))


def train_tier_cohort(method: Any, contexts: Sequence[Any], model: nn.Module, grid: list,
                      depths: tuple[int, ...], masks: dict[str, np.ndarray],
                      net: dict[str, np.ndarray]) -> list[TierTrained]:
    """Local training of one tier's clients (``contexts``) from the broadcast sub-model that
    ``model`` holds (``net``), all at once; one :class:`TierTrained` per client, in order.
    ``grid`` is the rungs a step may draw, ``depths`` the exit depths the tier's model
    carries, ``masks`` FIARSE's (empty otherwise)."""
    hp, loc, cl = method.params, method.cfg.local, method.cfg.continual
    first = contexts[0]
    dev, seed, rnd = first.device, first.seed, first.round
    classes = method._tasks(model.arch.num_classes)
    kind = cl.method if classes is not None else "none"
    task = task_of_round(rnd, cl.rounds_per_task, cl.tasks) if classes else 0
    last = bool(classes) and rnd % cl.rounds_per_task == 0
    states = [dict(c.state or {}) for c in contexts]
    ewc = [continual_state(c, model, s, net, masks, kind, task, last, cl.ewc_samples,
                           cl.ewc_gamma) for c, s in zip(contexts, states, strict=True)]
    own = model.geometry
    exits = depths if hp.axis == "scalefl" else ()
    stack = _Stack.of(model, ewc)
    keep = {stack.names.index(n): torch.from_numpy(m).to(dev) for n, m in masks.items()}

    data = [(c.x_train, c.y_train) for c in contexts]
    clients = [c.client_id for c in contexts]
    idx, mask = schedules(data, clients, epochs=loc.epochs, batch_size=loc.batch_size,
                          seed=seed, round=rnd, max_steps=loc.max_steps, purpose="local")
    xs, ys = concat_inputs(data, dev)
    nsteps = [int((mask[:, i].sum(1) > 0).sum()) for i in range(len(contexts))]
    choice = [od_choices(seed, rnd, c, n, len(grid)) for c, n in zip(clients, nsteps,
                                                                      strict=True)]
    augment = hp.augment and xs.dim() == 4
    gens = [torch_generator(seed, rnd, c, "augment") for c in clients] if augment else []
    steppers: dict = {}
    totals, ratios = [0.0] * len(contexts), [0.0] * len(contexts)
    model.train()
    for t in range(len(idx)):
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(nsteps):
            if t < n:
                groups.setdefault(int(choice[i][t]), []).append(i)
        for r, members in sorted(groups.items()):  # the clients that drew rung r
            sub = grid[r].geometry
            kd = hp.kd and sub != own
            if (r, kd) not in steppers:
                steppers[r, kd] = (_stepper(method, model, stack.names, sub, kd, exits,
                                            stack.fisher is not None),
                                   _used(model, sub, own, exits, kd, tuple(xs.shape[1:])))
            stepper, used = steppers[r, kd]
            it = torch.from_numpy(idx[t, members]).to(dev)
            x = xs[it]
            if augment:  # each client's own draws on its own (unpadded) batch
                x = torch.stack([torch.cat([random_crop_flip(x[j, :n], gens[i]), x[j, n:]])
                                 for j, (i, n) in enumerate(
                                     (i, int(mask[t, i].sum())) for i in members)])
            sub_params, extra = stack.rows(members)
            grads, values = stepper(sub_params, x, ys[it],
                                    torch.from_numpy(mask[t, members]).to(dev), *extra)
            stack.step(members, sub_params, grads, used, keep, loc)
            for j, i in enumerate(members):
                totals[i] += float(values[j])
                ratios[i] += grid[r].param_ratio
    return _results(method, model, stack.names, stack.params, contexts, states, nsteps,
                    totals, ratios, masks, task)


def _results(method: Any, model: nn.Module, names: list[str], params: list[torch.Tensor],
             contexts: Sequence[Any], states: list[dict], nsteps: list[int],
             totals: list[float], ratios: list[float], masks: dict, task: int
             ) -> list[TierTrained]:
    """Each client's trained parameters and :meth:`Hetero._train`'s metrics."""
    stacked = [p.detach().to("cpu", torch.float32).numpy() for p in params]
    masked = None
    if masks:  # FIARSE: the share of the full model's parameters the masked model holds
        from fedray.models.sliceable import held_count

        full = held_count(model.arch, model.input_hw)
        kept = sum(int(m.sum()) - m.size for m in masks.values())
        masked = (sum(p.numel() for p in model.parameters()) + kept) / full
    out = []
    for i in range(len(contexts)):
        n = max(nsteps[i], 1)
        metrics = {"train_loss": totals[i] / n, "steps": float(nsteps[i]),
                   "task": float(task), "sub_param_ratio": ratios[i] / n}
        if masked is not None:
            metrics["sub_param_ratio"] = masked
        out.append(TierTrained({n_: s[i].copy() for n_, s in zip(names, stacked, strict=True)},
                               metrics, states[i]))
    return out
