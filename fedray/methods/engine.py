"""One local-training engine: a method's local procedure written once, run client by client
or as a vectorized cohort.

A method that trains its clients with local SGD writes its procedure as five hooks of
:class:`~fedray.methods.fedavg.method.FedAvg` (defaults: plain local SGD) and nothing
else:

- ``client_tensors(ctx, broadcast)`` — the client's own tensors its correction reads (from
  its kept state, e.g. FedDyn's ∇L_k(θ_k^{t−1})), one per trainable parameter, or None;
- ``correction(model, broadcast, device)`` — a per-step gradient edit
  ``fix(params, own)`` that writes ``p.grad`` in place (FedProx's μ(θ − θ_t)), or None;
- ``upload(broadcast, trained, own, steps)`` — what the clients send, from their trained
  parameters, their own tensors and the local steps K each took, all stacked along a
  leading client axis (a client trained alone is a stack of one), so one array expression
  serves a whole cohort (default Δ_i = θ_i − θ_t);
- ``objective(model, broadcast, device)`` — an extra term of the local loss,
  ``term(z, features_of, x, own)`` giving one value per row of the batch: ``z`` the
  representation the trained model produced for ``x`` (its classifier's input),
  ``features_of(params, x)`` that representation under other parameters (MOON's global
  and previous models), or None;
- ``finish(ctx, out, broadcast, trained)`` — the output's extra metrics, upload entries and
  the state the client keeps, from its trained parameters.

The engine owns everything else, built once from the ``local`` section: the optimizer
(:class:`~fedray.models.training.SGD`, momentum, weight decay, a client's kept momentum
buffers), the batch schedule and ``max_steps``, bf16, local DP-SGD, and the evaluation
before and after training. It runs the same hooks on one client (``fix`` sees the
parameters, ``own`` the client's tensors) or on a cohort (:mod:`fedray.models.cohort`:
``fix`` sees the parameters stacked along a leading client axis, ``own`` stacked the same
way by the engine, the broadcast's tensors broadcasting over the axis). Hooks written as
plain tensor arithmetic therefore mean the same thing in both modes, and a new method is
vectorized without a second copy of its loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.methods.base import ClientContext, ClientOutput, StackRow, State

__all__ = ["Correction", "LocalEngine", "Objective"]

Correction = Callable[[list, list], None]  # fix(params, own): edits each p.grad in place
Objective = Callable[[Any, Callable, Any, list], Any]  # term(z, features_of, x, own) per row


@dataclass(frozen=True)
class LocalEngine:
    """The ``local`` and ``eval`` settings a client's local training runs with."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    max_steps: int | None
    bf16: bool
    keep_optimizer_state: bool
    before_after: bool
    dp_sgd: Any = None

    @classmethod
    def of(cls, cfg: Any) -> LocalEngine:
        """The engine of a run's config (``local.*``, ``eval.local_before_after``)."""
        from fedray.models.training import DPSGD

        loc = cfg.local
        dp = None if loc.dp_noise_multiplier is None else DPSGD(
            loc.dp_noise_multiplier, loc.dp_max_grad_norm, loc.dp_delta)
        return cls(loc.epochs, loc.batch_size, loc.lr, loc.momentum, loc.weight_decay,
                   loc.max_steps, loc.bf16, loc.keep_optimizer_state,
                   cfg.eval.local_before_after, dp)

    @property
    def keeps_optimizer(self) -> bool:
        """Whether a client's momentum buffers survive to its next round."""
        return self.keep_optimizer_state and self.momentum > 0

    def run(self, method: Any, contexts: Sequence[ClientContext], broadcast: State,
            cohort: bool) -> list[ClientOutput]:
        """Each context's :class:`ClientOutput`, in order: one client at a time, or (``cohort``)
        the contexts as one batched computation, equal to the former up to float32
        rounding."""
        from fedray.models.training import set_state

        set_state(contexts[0].resident, broadcast)
        before = [_accuracy(ctx) for ctx in contexts] if self.before_after else []
        outs = (self._cohort if cohort else self._sequential)(method, contexts, broadcast)
        for i, (ctx, (out, trained)) in enumerate(zip(contexts, outs, strict=True)):
            if self.before_after:
                out.metrics = {"acc_before": before[i], **out.metrics}
            outs[i] = method.finish(ctx, out, broadcast, trained)
        return outs

    def finetune(self, ctx: ClientContext, broadcast: State, epochs: int) -> dict[str, float]:
        """Scores on the client's test split after ``epochs`` of plain local SGD from the
        broadcast (personalisation: nothing uploaded or kept)."""
        from fedray.models.training import evaluate, set_state, train_local

        set_state(ctx.resident, broadcast)
        train_local(ctx.resident, ctx.x_train, ctx.y_train, epochs=epochs,
                    batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                    weight_decay=self.weight_decay, seed=ctx.seed, round=ctx.round,
                    client=ctx.client_id, device=ctx.device, bf16=self.bf16,
                    purpose="finetune")
        return evaluate(ctx.resident, ctx.x_test, ctx.y_test, ctx.device)

    def _state(self, optimizer: dict | None) -> dict[str, Any] | None:
        return {"optimizer": optimizer} if self.keeps_optimizer else None

    def _sequential(self, method: Any, contexts: Sequence[ClientContext], broadcast: State
                    ) -> list[tuple[ClientOutput, Any]]:

        from fedray.models.training import get_state, set_state, train_local

        outs = []
        for ctx in contexts:
            model = ctx.resident
            set_state(model, broadcast)
            names = method.trainable(model)
            mine = _stack([method.client_tensors(ctx, broadcast)], names)
            own = [t[0] for t in _tensors(mine, names, ctx.device)]  # the stack of one's row
            kept = (ctx.state or {}).get("optimizer") if self.keeps_optimizer else None
            with _Tap(model, method.objective(model, broadcast, ctx.device)) as tap:
                metrics, optimizer = train_local(
                    model, ctx.x_train, ctx.y_train, epochs=self.epochs,
                    batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                    weight_decay=self.weight_decay, seed=ctx.seed, round=ctx.round,
                    client=ctx.client_id, max_steps=self.max_steps, device=ctx.device,
                    grad_hook=_hook(method.correction(model, broadcast, ctx.device), own),
                    optimizer_state=kept, bf16=self.bf16, dp_sgd=self.dp_sgd,
                    extra_loss=tap.term(own))
            if self.before_after:  # the trained model as it stands (its buffers too)
                metrics["acc_after"] = _accuracy(ctx)
            local = get_state(model)
            trained = {k: local[k] for k in names}
            uploads = method.upload(broadcast, {k: v[None] for k, v in trained.items()},
                                    mine, np.array([int(metrics["steps"])]))
            outs.append((ClientOutput({k: v[0] for k, v in uploads.items()}, len(ctx.x_train),
                                      metrics, self._state(optimizer)), trained))
        return outs

    def _cohort(self, method: Any, contexts: Sequence[ClientContext], broadcast: State
                ) -> list[tuple[ClientOutput, Any]]:

        from fedray.models.cohort import train_cohort_stacked
        from fedray.models.training import set_state

        first, model = contexts[0], contexts[0].resident
        names = method.trainable(model)
        mine = _stack([method.client_tensors(c, broadcast) for c in contexts], names)
        own = _tensors(mine, names, first.device)
        kept = [(c.state or {}).get("optimizer") for c in contexts] \
            if self.keeps_optimizer else None
        with _Tap(model, method.objective(model, broadcast, first.device)) as tap:
            stack = train_cohort_stacked(
                model, [(c.x_train, c.y_train) for c in contexts],
                [c.client_id for c in contexts], epochs=self.epochs,
                batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                weight_decay=self.weight_decay, seed=first.seed, round=first.round,
                max_steps=self.max_steps, device=first.device,
                grad_hook=_hook(method.correction(model, broadcast, first.device), own),
                optimizer_states=kept, own=own, extra_loss=tap.term())
        uploads = method.upload(broadcast, stack.params, mine,
                                np.array([int(m["steps"]) for m in stack.metrics]))
        outs = []
        for i, ctx in enumerate(contexts):
            metrics = stack.metrics[i]
            if self.before_after:  # a cohort's model keeps no buffers of its own
                set_state(model, {**broadcast, **stack.client(i).params})
                metrics["acc_after"] = _accuracy(ctx)
            outs.append((ClientOutput(StackRow(uploads, i), len(ctx.x_train), metrics,
                                      self._state(stack.optimizer_states[i])),
                         StackRow(stack.params, i)))
        return outs


def _accuracy(ctx: ClientContext) -> float:
    """The resident model's accuracy on the client's test split."""
    from fedray.models.training import evaluate

    return evaluate(ctx.resident, ctx.x_test, ctx.y_test, ctx.device)["accuracy"]


class _Tap:
    """While a method's ``objective`` is in force: the input of the model's classifier (its
    last ``nn.Linear``, :func:`fedray.models.heads.classifier`) on each forward pass — the
    representation z — and ``features_of(params, x)``, the same under other parameters
    (a functional call of the same module, batched inside a cohort's ``vmap``)."""

    def __init__(self, model: Any, objective: Objective | None):
        self.model, self.objective, self.last, self.handle = model, objective, None, None

    def __enter__(self) -> _Tap:
        if self.objective is not None:
            from fedray.models.heads import classifier

            self.handle = classifier(self.model).register_forward_pre_hook(self._keep)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.handle.remove()

    def _keep(self, _module: Any, args: tuple) -> None:
        self.last = args[0]

    def term(self, own: list | None = None) -> Callable | None:
        """The training loop's extra loss (None without an objective): ``term(x)`` with
        the client's ``own`` tensors, or in a cohort (``own`` None) ``term(x, rows)``, the
        client's rows handed in by the batched call."""
        objective = self.objective
        if objective is None:
            return None
        if own is None:
            return lambda x, rows: objective(self.last, self.features_of, x, rows)
        return lambda x: objective(self.last, self.features_of, x, own)

    def features_of(self, params: State, x: Any) -> Any:
        from torch.func import functional_call

        functional_call(self.model, params, (x,))
        return self.last


def _hook(fix: Correction | None, own: list) -> Callable[[list], None] | None:
    if fix is None:
        return None
    return lambda params: fix(params, own)


def _tensors(stacked: State | None, names: Sequence[str], device: str) -> list:
    """The stacked own tensors (:func:`_stack`) as tensors on ``device`` in the trainable
    parameters' order (empty: none)."""
    import torch

    if stacked is None:
        return []
    return [torch.from_numpy(stacked[n]).to(device) for n in names]


def _stack(owns: Sequence[State | None], names: Sequence[str]) -> State | None:
    """The clients' own tensors stacked along a leading client axis (float32; None: the
    method has none)."""
    if all(o is None for o in owns):
        return None
    if any(o is None for o in owns):
        raise ValueError("client_tensors gave tensors for some clients of a cohort and "
                         "None for others")
    return {n: np.stack([np.asarray(o[n], np.float32) for o in owns]) for n in names}
