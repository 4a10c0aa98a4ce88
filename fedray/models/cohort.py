"""Local SGD of a cohort of clients as one batched computation (plain PyTorch, no Ray).

The K clients of a cohort start from one model and train on their own data. Their
parameters are stacked along a leading client axis and every local step is one call of
``torch.func.vmap(grad(loss))`` over ``functional_call`` of the same module: K small
forward/backward passes become one batched pass, so the time is set by the batched
arithmetic instead of K Python loops and K sets of tiny kernels.

It is :func:`fedray.models.training.train_local` client by client, made batched:

- each client takes exactly the batches its sequential run takes (the same permutations
  from (seed, round, client), the same ``max_steps``, the same last short batch). The
  clients' samples are concatenated (memory: their sum) and each step's batches padded to
  the widest; a padded slot reads a zero row, has mask 0 and adds nothing to its client's
  loss, which is the mean over the client's real rows of the batch, as
  ``nn.CrossEntropyLoss`` computes it. A client whose own schedule has ended (or never
  began: no samples, ``max_steps=0``) is frozen: no step, no momentum, no weight decay;
- the optimizer is :class:`fedray.models.training.SGD`'s update written over the stack
  (``b = μ b + (g + λθ)``, first ``b = g + λθ``; ``θ -= lr b``), with each client's kept
  momentum buffers (``local.keep_optimizer_state``) stacked in and handed back in the
  same ``{"momentum_buffers": [...]}`` layout;
- a ``grad_hook(params)`` of the sequential path (FedProx's proximal gradient) runs on
  the stacked parameters unchanged: each stacked tensor is a leaf whose ``.grad`` holds the
  K clients' gradients, and the hook's broadcast anchor θ_t broadcasts over the client axis.

:class:`StackedAdam` is :class:`fedray.models.training.Adam` written over such a stack (per
client: its own step count, weight decay and gradient clip), for the methods whose clients
train with Adam (FAVoR's authors, FLITE's latents).

What is equal: every client's parameters after training agree with the sequential path's
to float32 rounding (batched matmuls add in another order; the equivalence test holds
them within 1e-5 relative). The result of one cohort does not depend on where, or next to
which other cohort, it runs.

Models that cannot run this way are named by :func:`cohort_problems`: BatchNorm (its
running statistics are written during the forward pass, which a functional batched call
does not do per client), dropout or any other randomness in training mode (the sequential
path draws it from each client's own generator), a trainable parameter the forward does
not use (SGD skips a parameter without a gradient; a batched gradient is 0 and would be
decayed), or an op without a batching rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedray.models.training import cohort_batches


@dataclass
class CohortTrained:
    """One client's result of :func:`train_cohort`: its trained parameters (float32, the
    trainable ones by name), its metrics (``train_loss``, ``steps``) and, with momentum,
    its optimizer state as :class:`~fedray.models.training.SGD` keeps it."""

    params: dict[str, np.ndarray]
    metrics: dict[str, float] = field(default_factory=dict)
    optimizer_state: dict | None = None


@dataclass
class CohortStack:
    """:func:`train_cohort_stacked`'s result: the cohort's trained parameters stacked
    (float32, the trainable ones by name, client axis first, in the cohort's order), and
    each client's metrics and optimizer state. Per-client arithmetic on the stack (an
    update Δ_i = θ_i − θ) is one array operation for the whole cohort."""

    params: dict[str, np.ndarray]
    metrics: list[dict[str, float]]
    optimizer_states: list[dict | None]

    def __len__(self) -> int:
        return len(self.metrics)

    def client(self, i: int) -> CohortTrained:
        """Client ``i``'s result; its parameters are views into the stack."""
        return CohortTrained({n: p[i] for n, p in self.params.items()}, self.metrics[i],
                             self.optimizer_states[i])


_RANDOM = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
           nn.FeatureAlphaDropout)


def cohort_problems(model: nn.Module, input_shape: Sequence[int], num_classes: int,
                    probe: bool = True) -> list[str]:
    """Why ``model`` cannot train as a cohort (empty: it can): BatchNorm, dropout, or (with
    ``probe``) a batched gradient of two clients that fails. The probe is one step of two
    clients on one zero sample, on the CPU; its first ``vmap`` call imports
    ``torch._dynamo`` (≈ 2 s, ≈ 160 MB in a process), so ``runtime.vectorize=auto`` skips
    it (a cohort that raises is re-run client by client) and ``on`` runs it before Ray."""
    problems = forward_problems(model)
    if problems:
        return problems
    unused = _unused_parameters(model, input_shape)
    if unused:
        return [f"parameter {unused[0]} takes no part in the forward pass (SGD skips it, a "
                f"batched gradient would decay it)"]
    if not probe:
        return []
    try:
        x0 = np.zeros((1, *input_shape), np.float32)
        with torch.no_grad():  # per-token logits (1, classes, steps) take (1, steps) targets
            steps = tuple(model(torch.from_numpy(x0)).shape[2:])
        probe = [(x0, np.zeros((1, *steps), np.int64))] * 2
        train_cohort(model, probe, [0, 1], epochs=1, batch_size=1, lr=0.0, seed=0, round=0)
    except Exception as e:  # noqa: BLE001 — the reason is the answer
        return [f"a batched gradient fails: {type(e).__name__}: {str(e).splitlines()[0][:160]}"]
    return []


def forward_problems(model: nn.Module) -> list[str]:
    """Why one batched functional forward of ``model`` for many clients would not be each
    client's own training-mode forward (empty: it would): BatchNorm (running statistics
    written in the forward pass) and dropout (randomness drawn per client)."""
    problems = [f"{type(m).__name__} ({name or 'model'}) keeps running statistics written "
                f"in the forward pass" for name, m in model.named_modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return problems + [f"{type(m).__name__} ({name}) draws randomness in training"
                       for name, m in model.named_modules() if isinstance(m, _RANDOM)]


_DENSE = (nn.Linear, nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.ELU,
          nn.Flatten, nn.Unflatten, nn.Identity, nn.LayerNorm, nn.Softmax, nn.LogSoftmax)


def dense_only(model: nn.Module) -> bool:
    """Whether ``model`` is made of linear layers, activations and reshapes only — the kind
    for which a batched cohort measured faster than clients one after another on a CPU
    (``benchmarks/cohorts.py``); batched convolutions (grouped kernels) and the written-out
    LSTM cells measured slower there than cuDNN/oneDNN's per-client kernels."""
    return all(isinstance(m, _DENSE) for m in model.modules()
               if not list(m.children()))


def _unused_parameters(model: nn.Module, input_shape: Sequence[int]) -> list[str]:
    """Trainable parameters one forward/backward pass on a zero sample gives no gradient."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    training = model.training
    model.eval()
    try:
        out = model(torch.zeros((1, *input_shape))).float().sum()
        grads = torch.autograd.grad(out, [p for _, p in named], allow_unused=True)
    finally:
        model.train(training)
    return [n for (n, _), g in zip(named, grads, strict=True) if g is None]


@torch.no_grad()
def activation_numel(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Elements the leaf modules of ``model`` output for one sample: what a batch keeps for
    its backward pass, per sample (measured with forward hooks on one zero input)."""
    total = 0

    def count(_m: nn.Module, _inp: Any, out: Any) -> None:
        nonlocal total
        for t in out if isinstance(out, tuple) else (out,):
            if isinstance(t, torch.Tensor):
                total += t.numel()

    _hooked_forward(model, input_shape, [m for m in model.modules() if not list(m.children())],
                    count)
    return total


def _hooked_forward(model: nn.Module, input_shape: Sequence[int], modules: list[nn.Module],
                    hook: Any) -> None:
    """One eval-mode forward pass of a zero sample with ``hook`` on ``modules`` (removed
    after, the training mode restored)."""
    hooks = [m.register_forward_hook(hook) for m in modules]
    training = model.training
    model.eval()
    try:
        model(torch.zeros((1, *input_shape)))
    finally:
        model.train(training)
        for h in hooks:
            h.remove()


@torch.no_grad()
def forward_macs(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Multiply-adds of the convolutions and linear layers of ``model``'s forward pass on
    one sample (each output element: its kernel's inputs; measured with forward hooks on
    one zero input)."""
    total = 0

    def count(m: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(m, nn.modules.conv._ConvNd):
            total += out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)
        else:
            total += out.numel() * m.in_features

    _hooked_forward(model, input_shape, [m for m in model.modules()
                                         if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))],
                    count)
    return total


def schedules(data: Sequence[tuple[np.ndarray, np.ndarray]], clients: Sequence[int], *,
              epochs: int, batch_size: int, seed: int, round: int, max_steps: int | None,
              purpose: str) -> tuple[np.ndarray, np.ndarray]:
    """Every client's batches as (steps, K, B) rows of the clients' concatenated samples
    (:func:`concat_inputs`) and a mask; a padded slot points at the zero row at the end."""
    sched = cohort_batches([len(x) for x, _ in data], clients, batch_size, epochs, seed, round,
                           max_steps, purpose)
    offsets = np.cumsum([0] + [len(x) for x, _ in data])
    steps = max((len(s) for s in sched), default=0)
    flat = [b for s in sched for b in s]
    lens = np.array([len(b) for b in flat], np.int64)
    width = int(lens.max(initial=1))
    idx = np.full((steps, len(sched), width), offsets[-1], np.int64)
    mask = np.zeros((steps, len(sched), width), np.float32)
    if lens.sum():  # every batch's rows written at once: (step, client, slot) per sample
        step = np.repeat(np.array([t for s in sched for t in range(len(s))], np.int64), lens)
        client = np.repeat(np.repeat(np.arange(len(sched)), [len(s) for s in sched]), lens)
        slot = np.arange(len(step)) - np.repeat(np.cumsum(lens) - lens, lens)
        idx[step, client, slot] = np.concatenate(flat) + offsets[client]
        mask[step, client, slot] = 1.0
    return idx, mask


def concat_inputs(data: Sequence[tuple[np.ndarray, np.ndarray]], device: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The clients' samples end to end plus one zero row (what padded slots read): memory
    is the sum of the clients' sizes, not K times the largest."""
    x0 = data[0][0]
    xs = np.concatenate([x for x, _ in data] + [np.zeros((1, *x0.shape[1:]), x0.dtype)])
    y0 = data[0][1]
    kind = np.float32 if y0.dtype.kind == "f" else np.int64  # multi-hot targets stay float
    ys = np.concatenate([y for _, y in data] + [np.zeros((1, *y0.shape[1:]), kind)]
                        ).astype(kind)
    return torch.from_numpy(xs).to(device), torch.from_numpy(ys).to(device)


def masked_mean(per_row: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The mean of ``per_row`` over a client's real rows (mask ``m`` 1; a padded slot 0):
    the divisor is the batch size the client's sequential step had, as in
    ``nn.CrossEntropyLoss``'s mean and ``batchmean``."""
    return torch.where(m > 0, per_row, 0.0).sum() / m.sum().clamp(min=1.0)


def cohort_cross_entropy(out: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """One client's ``nn.CrossEntropyLoss()`` of its sequential step: the mean over its real
    rows (:func:`masked_mean`), or for per-token targets (y of shape (B, steps)) over their
    targets that are not padding (``ignore_index``), as the loss averages them; multi-hot
    float targets take :func:`~fedray.models.training.task_loss`'s binary cross-entropy,
    each real row's mean over its labels averaged over the real rows (the mean over rows ×
    labels of the sequential step)."""
    if y.is_floating_point():
        return masked_mean(nn.functional.binary_cross_entropy_with_logits(
            out, y, reduction="none").mean(1), m)
    ce = nn.functional.cross_entropy(out, y, reduction="none")
    if y.ndim == 1:
        return masked_mean(ce, m)
    w = m[:, None] * (y != -100)
    return (ce * w).sum() / w.sum().clamp(min=1.0)


def _momentum_buffers(states: Sequence[dict | None] | None, params: list[torch.Tensor],
                      k: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Stacked momentum buffers (zero where a client has none yet) and which clients had
    one: ``μ·0 + g`` is ``g``, so a zero buffer starts as SGD's first ``b = g``."""
    bufs = [torch.zeros_like(p) for p in params]
    had = torch.zeros(k, dtype=torch.bool)
    for i, state in enumerate(states or [None] * k):
        if state is None:
            continue
        own = state["momentum_buffers"]
        if len(own) != len(params):
            raise ValueError(f"optimizer state has {len(own)} buffers for {len(params)} "
                             f"parameters")
        for j, b in enumerate(own):
            if b is not None:
                bufs[j][i] = torch.from_numpy(np.asarray(b)).to(bufs[j].device)
                had[i] = True
    return bufs, had


def train_cohort(model: nn.Module, data: Sequence[tuple[np.ndarray, np.ndarray]],
                 clients: Sequence[int], **knobs: Any) -> list[CohortTrained]:
    """:func:`train_cohort_stacked` as one :class:`CohortTrained` per client, in order."""
    stack = train_cohort_stacked(model, data, clients, **knobs)
    return [stack.client(i) for i in range(len(stack))]


def train_cohort_stacked(model: nn.Module, data: Sequence[tuple[np.ndarray, np.ndarray]],
                         clients: Sequence[int], *, epochs: int, batch_size: int, lr: float,
                         momentum: float = 0.0, weight_decay: float = 0.0, seed: int,
                         round: int, max_steps: int | None = None, device: str = "cpu",
                         grad_hook: Callable[[list[torch.Tensor]], None] | None = None,
                         optimizer_states: Sequence[dict | None] | None = None,
                         purpose: str = "local",
                         extra_loss: Callable[..., torch.Tensor] | None = None,
                         own: Sequence[torch.Tensor] = ()) -> CohortStack:
    """Local SGD of ``clients`` (their ``data``: (x, y) each) from ``model``'s current
    parameters, all at once, as one :class:`CohortStack`. The knobs mean what they mean
    in :func:`~fedray.models.training.train_local`; ``extra_loss(x, own)`` is called inside
    the batched gradient right after each client's forward pass, with the client's rows of
    ``own`` (tensors stacked along the client axis), and gives a per-row term whose mean
    over the client's real rows is added to its loss. ``model`` itself is left as it
    was."""
    from torch.func import functional_call, grad_and_value, vmap

    k = len(data)
    named = dict(model.named_parameters())
    names = [n for n, p in named.items() if p.requires_grad]
    fixed = {n: p.detach() for n, p in named.items() if not p.requires_grad}
    fixed |= dict(model.named_buffers())
    params = stacked_parameters(named, names, k)
    idx, mask = schedules(data, clients, epochs=epochs, batch_size=batch_size, seed=seed,
                          round=round, max_steps=max_steps, purpose=purpose)
    xs, ys = concat_inputs(data, device)
    bufs, had = _momentum_buffers(optimizer_states if momentum > 0 else None, params, k)

    def loss(flat: tuple[torch.Tensor, ...], x: torch.Tensor, y: torch.Tensor,
             m: torch.Tensor, mine: tuple[torch.Tensor, ...]) -> torch.Tensor:
        out = functional_call(model, (dict(zip(names, flat, strict=True)), fixed), (x,))
        value = cohort_cross_entropy(out.float(), y, m)
        if extra_loss is not None:
            value = value + masked_mean(extra_loss(x, list(mine)).float(), m)
        return value

    step = vmap(grad_and_value(loss))
    mine = tuple(own) if extra_loss is not None else ()
    totals, counts = [0.0] * k, [0] * k
    model.train()
    for t in range(len(idx)):
        it, mt = torch.from_numpy(idx[t]).to(xs.device), torch.from_numpy(mask[t]).to(xs.device)
        active = (mask[t].sum(1) > 0)
        grads, values = step(tuple(p.detach() for p in params), xs[it], ys[it], mt, mine)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if grad_hook is not None:
            grad_hook(params)
        sgd_step(params, bufs, torch.from_numpy(active).to(xs.device), lr, momentum,
                 weight_decay)
        for i, v in enumerate(values.tolist()):
            if active[i]:
                totals[i] += v
                counts[i] += 1
    stacked = {n: p.detach().to("cpu", torch.float32).numpy()
               for n, p in zip(names, params, strict=True)}
    moments = [b.detach().cpu().numpy() for b in bufs] if momentum > 0 else []
    states: list[dict | None] = [None] * k
    if momentum > 0:
        for i in range(k):
            keep = counts[i] > 0 or bool(had[i])
            states[i] = {"momentum_buffers": [b[i].copy() if keep else None for b in moments]}
    metrics = [{"train_loss": totals[i] / max(counts[i], 1), "steps": float(counts[i])}
               for i in range(k)]
    return CohortStack(stacked, metrics, states)


def stacked_parameters(named: dict[str, torch.Tensor], names: Sequence[str], k: int
                       ) -> list[nn.Parameter]:
    """``k`` copies of each named tensor stacked along a new client axis (dim 0), detached:
    the cohort's trainable parameters, every client starting from the same values."""
    return [nn.Parameter(named[n].detach().unsqueeze(0).repeat(k, *[1] * named[n].dim()))
            for n in names]


@torch.no_grad()
def sgd_step(params: list[torch.Tensor], bufs: list[torch.Tensor], active: torch.Tensor,
             lr: float, momentum: float, weight_decay: float) -> None:
    """:class:`~fedray.models.training.SGD`'s step over the stack, for the active clients."""
    for j, p in enumerate(params):
        on = active.view(-1, *[1] * (p.dim() - 1))
        g = p.grad if not weight_decay else p.grad.add(p, alpha=weight_decay)
        if momentum:
            bufs[j] = torch.where(on, bufs[j].mul(momentum).add(g), bufs[j])
            g = bufs[j]
        p.copy_(torch.where(on, p.add(g, alpha=-lr), p))
        p.grad = None


class StackedAdam:
    """:class:`fedray.models.training.Adam` over tensors stacked along a client axis (dim 0),
    each client with its own step count; a step moves only the clients it is given.

    Per client, as ``Adam.step`` does it for one: ``clip`` rescales the client's gradients
    (its slices of all the tensors) to at most that total L2 norm (``clip_grad_norm_``'s
    rule: norm in float64, factor min(1, clip / (norm + 1e-6))), then L2 weight decay
    ``g += λθ``, the bias-corrected moments and ``θ -= lr m̂ / (√v̂ + ε)`` with the client's
    own step count. A step is masked tensor ops over the whole stack (no loop over
    clients): each client's float32 arithmetic is the sequential update's, operation for
    operation (bit for bit without a clip, whose float64 norm adds in another order), and
    a frozen client's parameters, moments and step count stay as they were.
    """

    def __init__(self, params: list[torch.Tensor], k: int, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, clip: float | None = None):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.weight_decay, self.clip = weight_decay, clip
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = torch.zeros(k, dtype=torch.float64)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, active: torch.Tensor) -> None:
        """One step of the clients where ``active`` (a (K,) bool tensor) is true."""
        b1, b2 = self.betas
        on = active.to("cpu", torch.bool)
        self.t += on.double()
        # per-client scalars in float64, as the sequential step's Python floats (a Python
        # float over a tensor would multiply by its reciprocal: divide by tensors instead)
        c2 = 1 - b2 ** self.t
        scale = torch.full_like(self.t, -self.lr) / (1 - b1 ** self.t)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.clip is not None:
            norm = torch.sqrt(sum((g.double() ** 2).flatten(1).sum(1) for g in grads))
            factor = (torch.full_like(norm, self.clip) / (norm + 1e-6)).clamp(max=1.0)
            grads = [g * _per_client(factor, g) for g in grads]
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            if self.weight_decay:
                g = g.add(p, alpha=self.weight_decay)
            keep = _per_client(on, p)
            m_new = m.mul(b1).add_(g, alpha=1 - b1)
            v_new = v.mul(b2).addcmul_(g, g, value=1 - b2)
            denom = (v_new / _per_client(c2, p)).sqrt_().add_(self.eps)
            p.copy_(torch.where(keep, p + m_new * _per_client(scale, p) / denom, p))
            m.copy_(torch.where(keep, m_new, m))
            v.copy_(torch.where(keep, v_new, v))


def _per_client(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (K,) tensor of per-client values in ``like``'s dtype (a bool mask stays bool) and
    device, shaped to broadcast over ``like``'s (K, ...) stack."""
    dtype = torch.bool if values.dtype == torch.bool else like.dtype
    return values.to(like.device, dtype).view(-1, *[1] * (like.dim() - 1))
