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


def train_tier_cohort(method: Any, contexts: Sequence[Any], model: nn.Module, grid: list,
                      depths: tuple[int, ...], masks: dict[str, np.ndarray],
                      net: dict[str, np.ndarray]) -> list[TierTrained]:
    """Local training of one tier's clients (``contexts``) from the broadcast sub-model that
    ``model`` holds (``net``), all at once; one :class:`TierTrained` per client, in order.
    ``grid`` is the rungs a step may draw, ``depths`` the exit depths the tier's model
    carries, ``masks`` FIARSE's (empty otherwise)."""
    from torch.func import functional_call, grad_and_value, vmap

    from fedray.core.seeding import torch_generator
    from fedray.methods.drod.continual.data import task_of_round
    from fedray.methods.drod.continual.objectives import continual_state, ewc_penalty
    from fedray.methods.drod.selection import od_choices
    from fedray.models.cohort import _concat_inputs, _schedules, _sgd_step, masked_mean
    from fedray.models.training import random_crop_flip

    hp, loc, cl = method.params, method.cfg.local, method.cfg.continual
    first, k = contexts[0], len(contexts)
    dev, seed, rnd = first.device, first.seed, first.round
    classes = method._tasks(model.arch.num_classes)
    kind = cl.method if classes is not None else "none"
    task = task_of_round(rnd, cl.rounds_per_task, cl.tasks) if classes else 0
    last = bool(classes) and rnd % cl.rounds_per_task == 0
    states = [dict(c.state or {}) for c in contexts]
    ewc = [continual_state(c, model, s, net, masks, kind, task, last, cl.ewc_samples,
                           cl.ewc_gamma) for c, s in zip(contexts, states, strict=True)]
    own, scalefl = model.geometry, hp.axis == "scalefl"
    exits = depths if scalefl else ()

    named = dict(model.named_parameters())
    names = [n for n, p in named.items() if p.requires_grad]
    params = [nn.Parameter(named[n].detach().unsqueeze(0).repeat(k, *[1] * named[n].dim()))
              for n in names]
    bufs = [torch.zeros_like(p) for p in params]
    keep = {names.index(n): torch.from_numpy(m).to(dev) for n, m in masks.items()}
    has_ewc = any(f is not None for f, _ in ewc)
    if has_ewc:  # a client without a Fisher yet is pulled by F = 0: no term, no gradient
        fisher = [torch.stack([f[n] if f is not None else torch.zeros_like(named[n])
                               for f, _ in ewc]) for n in names]
        anchor = [torch.stack([a[n] if a is not None else torch.zeros_like(named[n])
                               for _, a in ewc]) for n in names]

    data = [(c.x_train, c.y_train) for c in contexts]
    clients = [c.client_id for c in contexts]
    idx, mask = _schedules(data, clients, epochs=loc.epochs, batch_size=loc.batch_size,
                           seed=seed, round=rnd, max_steps=loc.max_steps, purpose="local")
    xs, ys = _concat_inputs(data, dev)
    nsteps = [int((mask[:, i].sum(1) > 0).sum()) for i in range(k)]
    choice = [od_choices(seed, rnd, c, n, len(grid)) for c, n in zip(clients, nsteps,
                                                                      strict=True)]
    augment = hp.augment and xs.dim() == 4
    gens = [torch_generator(seed, rnd, c, "augment") for c in clients] if augment else []
    wrapped = _Exits(model)
    fixed = {f"net.{n}": b for n, b in model.named_buffers()}
    fixed |= {f"net.{n}": p.detach() for n, p in named.items() if not p.requires_grad}

    def distill(student: torch.Tensor, teacher: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        t = hp.kd_temperature
        kl = F.kl_div(F.log_softmax(student / t, 1), F.softmax(teacher.detach() / t, 1),
                      reduction="none").sum(1)
        return hp.kd_alpha * t * t * masked_mean(kl, m)

    def loss_of(sub: Any, kd: bool, pulled: bool):
        def loss(flat, x, y, m, *ewc_terms):
            p = {f"net.{n}": v for n, v in zip(names, flat, strict=True)}
            outs = [o.float() for o in functional_call(wrapped, (p, fixed), (x, sub, exits))]
            logits = outs[-1]
            value = masked_mean(F.cross_entropy(logits, y, reduction="none"), m)
            for early in outs[:-1]:  # ScaleFL: exits distilled from the final one
                value = value + (1 - hp.kd_alpha) * masked_mean(
                    F.cross_entropy(early, y, reduction="none"), m) + distill(early, logits, m)
            if kd:  # FjORD w/ KD: the tier's largest model teaches
                t_logits = functional_call(wrapped, (p, fixed), (x, own, ()))[-1].float()
                value = (1 - hp.kd_alpha) * value + distill(logits, t_logits, m) + \
                    masked_mean(F.cross_entropy(t_logits, y, reduction="none"), m)
            if pulled:
                f, a = ewc_terms
                value = value + cl.ewc_lambda * ewc_penalty(
                    dict(zip(names, flat, strict=True)), dict(zip(names, f, strict=True)),
                    dict(zip(names, a, strict=True)))
            return value
        return vmap(grad_and_value(loss))

    steppers: dict = {}
    used: dict = {}
    totals, ratios = [0.0] * k, [0.0] * k
    shape = tuple(xs.shape[1:])
    model.train()
    for t in range(len(idx)):
        groups: dict[int, list[int]] = {}
        for i in range(k):
            if t < nsteps[i]:
                groups.setdefault(int(choice[i][t]), []).append(i)
        for r, members in sorted(groups.items()):
            sub = grid[r].geometry
            kd = hp.kd and sub != own
            if (r, kd) not in steppers:
                steppers[r, kd] = (loss_of(sub, kd, False), loss_of(sub, kd, True))
                used[r, kd] = _used(model, sub, own, exits, kd, shape)
            rows = torch.as_tensor(members, device=dev)
            it = torch.from_numpy(idx[t, members]).to(dev)
            mt = torch.from_numpy(mask[t, members]).to(dev)
            x = xs[it]
            if augment:  # each client's own draws on its own (unpadded) batch
                x = torch.stack([torch.cat([random_crop_flip(x[j, :n], gens[i]), x[j, n:]])
                                 for j, (i, n) in enumerate(
                                     (i, int(mask[t, i].sum())) for i in members)])
            sub_params = [p.detach()[rows] for p in params]
            extra = ([f[rows] for f in fisher], [a[rows] for a in anchor]) if has_ewc else ()
            grads, values = steppers[r, kd][bool(has_ewc)](tuple(sub_params), x, ys[it], mt,
                                                            *extra)
            on = list(used[r, kd])
            if has_ewc:  # a Fisher-pulled client's every parameter has a gradient
                pulled = torch.tensor([ewc[i][0] is not None for i in members], device=dev)
            for j, (p, g) in enumerate(zip(params, grads, strict=True)):
                active = torch.ones(len(members), dtype=torch.bool, device=dev) if on[j] \
                    else (pulled if has_ewc else None)
                if active is None or not bool(active.any()):
                    continue
                if j in keep:  # FIARSE: masked entries are not in the sub-model
                    g = g * keep[j]
                moved = nn.Parameter(sub_params[j].clone())
                moved.grad = g
                kept = [bufs[j][rows]]
                _sgd_step([moved], kept, active, loc.lr, loc.momentum, loc.weight_decay)
                with torch.no_grad():
                    p[rows] = moved.detach()
                bufs[j][rows] = kept[0]
            for j, i in enumerate(members):
                totals[i] += float(values[j])
                ratios[i] += grid[r].param_ratio
    return _results(method, model, names, params, contexts, states, nsteps, totals, ratios,
                    masks, task)


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
