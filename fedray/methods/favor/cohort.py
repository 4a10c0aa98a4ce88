"""Many FAVoR authors through one base model: a cohort's client rounds (Algorithm 2) as one
forward/backward per micro-batch over the one resident LM (plain PyTorch, no Ray).

The K authors' micro-batches are concatenated along the batch axis, and every peft LoRA
layer adds, row by row, the low-rank update of the author that row belongs to:
``base(x) + s · (drop_k(x) A_kᵀ) B_kᵀ`` with A, B stacked along an author axis and gathered
by a per-row author index — the batched LoRA matmul of multi-LoRA serving systems. The
base weights exist once, whatever K is; only the stacked factors, their Adam moments and
the activations of the K micro-batches grow with K.

Each author's loss is its own (eq. 7 over its rows' supervised tokens, plus its own prox
term of eq. 8, or in the private stage its alignment term of eqs. 9–11 with its own
projection head P_ψ drawn from (seed, round, client) and its own κ_t), so the gradient of
the sum with respect to author k's factors is author k's gradient alone. Each author keeps
its own schedule (:func:`fedray.methods.favor.train._micro_batches`: its permutations, its
accumulation, its number of steps; an author whose steps have ended is frozen) and its own
Adam (:class:`fedray.models.cohort.StackedAdam`: the update of
:class:`fedray.models.training.Adam` per author, with its own step count). LoRA dropout
draws each author's masks from that author's own generator, seeded as
:func:`fedray.methods.favor.train.training` seeds the one it trains with, in the order
the sequential forward draws them (on the CPU ``nn.Dropout`` draws
``bernoulli_(1 − p)`` of the input's shape: the same masks, bit for bit). Under gradient
checkpointing (4-bit training on CUDA), whose backward re-runs the forward, each mask is
drawn instead from a generator seeded per (author, step, micro-batch, layer), so the re-run
sees the forward's masks: the same dropout distribution, not the sequential path's masks
(which on CUDA come from the device's own generator anyway).

What is equal: every author's upload, kept state and metrics agree with
:func:`~fedray.methods.favor.train.client_round` (or :func:`~fedray.methods.favor.train.
shared_stage`) run alone, up to float32 rounding (the test holds them within 1e-4
relative on the tiny Qwen2). Not batched, so refused by :func:`cohort_problems`: the
variants other than ``favor``, ``fedavg`` and ``fedprox``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedray.methods.favor.train import (
    IGNORE,
    LOGIT_CHUNK,
    Adapter,
    ProjectionHead,
    StageConfig,
    _micro_batches,
    causal_lm,
    head_ce,
    kappa,
)
from fedray.models.cohort import StackedAdam

VARIANTS = ("favor", "fedavg", "fedprox")


@dataclass
class Author:
    """One author of a cohort: its client id, its token blocks (ids = labels) and its style
    target q_i (None: no alignment)."""

    client: int
    ids: torch.Tensor
    target: torch.Tensor | None = None


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(module path, peft LoRA layer) of every adapted linear layer."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "lora_A") and hasattr(m, "base_layer") and "default" in m.lora_A]


def check_base(model: nn.Module) -> None:
    """Refuse a base LM with active dropout outside the LoRA layers (attention, residual or
    embedding dropout): the sequential path draws it per author from the author's seeded
    generator, which a forward over all authors' rows cannot (the executor then trains the
    cohort's authors one at a time)."""
    lora = {id(m.lora_dropout["default"]) for _, m in lora_layers(model)}
    active = [n for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0
              and id(m) not in lora]
    config = getattr(causal_lm(model), "config", None)
    rate = float(getattr(config, "attention_dropout", 0.0) or 0.0)
    if active or rate > 0:
        where = active[0] if active else f"attention_dropout={rate}"
        raise ValueError(f"the base LM drops out outside its LoRA layers ({where}): its "
                         f"authors train one at a time")


def cohort_problems(variant: str) -> list[str]:
    """Why this variant cannot train a cohort of authors at once (empty: it can)."""
    if variant not in VARIANTS:
        return [f"variant {variant!r} trains one author at a time (batched: "
                f"{', '.join(VARIANTS)})"]
    return []


class _Rows:
    """Which author each row of the concatenated micro-batch belongs to, and where each
    author's dropout masks come from, while a batched forward runs: its running generator
    (the sequential path's stream), or — ``keyed``, under gradient checkpointing, whose
    backward re-runs the forward — a generator seeded per (author, step, micro-batch,
    layer), so the re-run draws the masks the forward drew."""

    def __init__(self, gens: list[torch.Generator], keys: list[tuple[int, int, int]],
                 purpose: str, keyed: bool):
        self.gens, self.keys, self.purpose, self.keyed = gens, keys, purpose, keyed
        self.index = torch.zeros(0, dtype=torch.long)
        self.spans: list[tuple[int, int, int]] = []  # (author, first row, end row)
        self.where = (0, 0)  # (optimizer step, micro-batch)

    def generator(self, k: int, layer: str, device: torch.device) -> torch.Generator:
        if not self.keyed:
            return self.gens[k]
        from fedray.core.seeding import derive_seed

        seed, round, client = self.keys[k]
        s, j = self.where
        return torch.Generator(device=device).manual_seed(
            derive_seed(seed, round, client, f"{self.purpose}:{s}:{j}:{layer}"))


@contextmanager
def batched_lora(model: nn.Module, stack: Adapter, rows: _Rows) -> Iterator[None]:
    """Every LoRA layer of ``model`` computes, until the block ends, ``base(x) + s ·
    lora_B_k(lora_A_k(drop_k(x)))`` with author k's factors from ``stack`` (``{peft name:
    (K, ...)}``) for each row (``rows.index``) and author k's dropout masks."""
    params = dict(stack)
    saved, used = [], set()
    try:
        for path, layer in lora_layers(model):
            names = f"{path}.lora_A.default.weight", f"{path}.lora_B.default.weight"
            used.update(names)
            saved.append((layer, layer.forward))
            layer.forward = _row_forward(path, layer, params[names[0]], params[names[1]],
                                         rows)
        if used != set(params):
            raise ValueError(f"{len(set(params) - used)} adapter tensor(s) belong to no "
                             f"batched LoRA linear layer (e.g. "
                             f"{sorted(set(params) - used)[0]}): this adapter trains one "
                             f"author at a time")
        yield
    finally:
        for layer, forward in saved:
            layer.forward = forward


def _row_forward(path: str, layer: nn.Module, a: torch.Tensor, b: torch.Tensor,
                 rows: _Rows):
    drop = layer.lora_dropout["default"]
    p = float(getattr(drop, "p", 0.0))
    scale = layer.scaling["default"]

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        result = layer.base_layer(x, *args, **kwargs)
        x = x.to(a.dtype)
        if p > 0 and drop.training:
            masks = [torch.empty_like(x[lo:hi]).bernoulli_(
                1 - p, generator=rows.generator(k, path, x.device)) for k, lo, hi in rows.spans]
            x = x * torch.cat(masks).div_(1 - p)
        ai, bi = a[rows.index], b[rows.index]
        low = torch.einsum("n...d,nrd->n...r", x, ai)
        return result + (torch.einsum("n...r,nor->n...o", low, bi) * scale).to(result.dtype)

    return forward


def _author_losses(model: nn.Module, ids: torch.Tensor, rows: _Rows, k: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 7 per author over its rows (mean next-token cross-entropy of its supervised
    tokens, the output head chunk by chunk as :func:`~fedray.methods.favor.train.lm_loss`
    applies it: with several chunks each is checkpointed, so a cohort keeps no chunk's
    logits for the backward either) and the final hidden states (N, L, H)."""
    from torch.utils.checkpoint import checkpoint

    lm = causal_lm(model)
    h = lm.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    head = lm.get_output_embeddings()
    x, y = h[:, :-1].reshape(-1, h.shape[-1]), ids[:, 1:].reshape(-1)
    owner = rows.index.repeat_interleave(ids.shape[1] - 1)
    step = max(1, LOGIT_CHUNK // head.weight.shape[0])
    sums = torch.zeros(k, dtype=torch.float32, device=ids.device)
    for i in range(0, len(x), step):
        ce = (checkpoint(head_ce, head, x[i:i + step], y[i:i + step], "none",
                         use_reentrant=False) if len(x) > step else head_ce(head, x, y, "none"))
        sums = sums.index_add(0, owner[i:i + step], ce)
    counts = torch.zeros(k, device=ids.device).index_add(
        0, owner, (y != IGNORE).float())
    return sums / counts.clamp_min(1), h


def _stack(adapters: Sequence[Adapter]) -> Adapter:
    return {k: torch.stack([a[k] for a in adapters]) for k in adapters[0]}


def _generators(authors: Sequence[Author], seed: int, round: int, purpose: str,
                device: torch.device) -> list[torch.Generator]:
    """Each author's dropout generator, seeded as ``training(..., purpose)`` seeds the
    process RNG for that author's stage."""
    from fedray.core.seeding import derive_seed

    return [torch.Generator(device=device).manual_seed(
        derive_seed(seed, round, a.client, purpose)) for a in authors]


def _stage(model: nn.Module, authors: Sequence[Author], adapter: Any, cfg: StageConfig,
           seed: int, round: int, purpose: str, loss_of: Any, opt: StackedAdam
           ) -> tuple[list[list[float]], list[list[float]]]:
    """One stage of every author at once: their micro-batch schedules run side by side;
    ``adapter()`` is the stacked adapter the forward uses and ``loss_of(step, task, h,
    ids, rows, lengths)`` each author's loss (a (K,) tensor) from its task loss. Returns
    each author's per-micro-batch (loss, task loss) values, for the stage's metrics."""
    check_base(model)
    k = len(authors)
    device = authors[0].ids.device
    plans = [_micro_batches(len(a.ids), cfg, seed, round, a.client, purpose) for a in authors]
    lengths = [len(p) for p in plans]
    lm = causal_lm(model)
    keyed = bool(getattr(lm, "is_activation_checkpointing",
                         getattr(lm, "is_gradient_checkpointing", False)))
    rows = _Rows(_generators(authors, seed, round, purpose, device),
                 [(seed, round, a.client) for a in authors], purpose, keyed)
    losses: list[list[float]] = [[] for _ in authors]
    tasks: list[list[float]] = [[] for _ in authors]
    model.train()
    try:
        for s in range(max(lengths, default=0)):
            opt.zero_grad()
            for j in range(max(len(p[s]) for p in plans if s < len(p))):
                members = [i for i, p in enumerate(plans) if s < len(p) and j < len(p[s])]
                parts = [authors[i].ids[plans[i][s][j]] for i in members]
                rows.spans, rows.where, lo = [], (s, j), 0
                for i, part in zip(members, parts, strict=True):
                    rows.spans.append((i, lo, lo + len(part)))
                    lo += len(part)
                rows.index = torch.cat([torch.full((len(part),), i, dtype=torch.long)
                                        for i, part in zip(members, parts, strict=True)]
                                       ).to(device)
                ids = torch.cat(parts)
                with batched_lora(model, adapter(), rows):
                    task, h = _author_losses(model, ids, rows, k)
                    loss = loss_of(s, task, h, ids, rows, lengths)
                    sum(loss[i] / len(plans[i][s]) for i in members).backward()
                for i in members:
                    losses[i].append(float(loss[i].detach()))
                    tasks[i].append(float(task[i].detach()))
            opt.step(torch.tensor([s < n for n in lengths]))
    finally:
        model.eval()
    return losses, tasks


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def shared_stage(model: nn.Module, start: Adapter, authors: Sequence[Author],
                 cfg: StageConfig, prox: float, seed: int, round: int
                 ) -> tuple[list[Adapter], list[dict[str, float]]]:
    """Eq. 8 for every author from the one server adapter A_t: each author's shared
    endpoint A_{i,t} and metrics (as :func:`fedray.methods.favor.train.shared_stage`)."""
    k = len(authors)
    params = {n: v.detach().unsqueeze(0).repeat(k, *[1] * v.dim()).requires_grad_(True)
              for n, v in start.items()}
    anchor = {n: v.detach() for n, v in start.items()}
    opt = StackedAdam(list(params.values()), k, cfg.lr)

    def loss_of(s, task, h, ids, rows, lengths):
        if not prox:
            return task
        return task + prox * sum(((params[n] - anchor[n]) ** 2).flatten(1).sum(1)
                                 for n in params)

    losses, _ = _stage(model, authors, lambda: params, cfg, seed, round, "favor-shared",
                       loss_of, opt)
    ends = [{n: v[i].detach() for n, v in params.items()} for i in range(k)]
    return ends, [{"shared_loss": _mean(x)} for x in losses]


def _heads(model: nn.Module, authors: Sequence[Author], seed: int, round: int,
           hidden: int, device: torch.device) -> list[torch.Tensor]:
    """Each author's P_ψ, drawn as the sequential stage draws it, stacked:
    [W1 (K, hidden, H), b1 (K, hidden), W2 (K, d, hidden), b2 (K, d)]."""
    from fedray.core.seeding import torch_seeded

    heads = []
    for a in authors:
        with torch_seeded(seed, round, a.client, "favor-projection"):
            heads.append(ProjectionHead(model.config.hidden_size, hidden, a.target.numel()))
    return [torch.stack([getattr(hd.net[i], w).detach() for hd in heads]).to(device)
            .requires_grad_(True) for i, w in ((0, "weight"), (0, "bias"), (2, "weight"),
                                               (2, "bias"))]


def private_stage(model: nn.Module, shared: Sequence[Adapter], authors: Sequence[Author],
                  cfg: StageConfig, align: float, seed: int, round: int,
                  proj_hidden: int = 256, ramp: float = 0.05
                  ) -> tuple[list[Adapter], list[dict[str, float]]]:
    """Eq. 12 for every author from its own constant shared endpoint: each author's
    residual ΔA^(p) and metrics (as :func:`fedray.methods.favor.train.private_stage`
    without the Ditto prox)."""
    k = len(authors)
    base = {n: v.detach() for n, v in _stack(shared).items()}
    residual = {n: torch.zeros_like(v, requires_grad=True) for n, v in base.items()}
    use_align = align > 0 and all(a.target is not None for a in authors)
    device = authors[0].ids.device
    head = _heads(model, authors, seed, round, proj_hidden, device) if use_align else []
    opt = StackedAdam(list(residual.values()) + head, k, cfg.lr)
    targets = torch.stack([a.target.float() for a in authors]) if use_align else None
    aligned: list[list[float]] = [[] for _ in authors]

    def loss_of(s, task, h, ids, rows, lengths):
        if not use_align:
            return task
        m = (ids != IGNORE).unsqueeze(-1).to(h.dtype)  # eq. 9 over each author's rows
        per = torch.zeros(k, h.shape[-1], dtype=h.dtype, device=h.device).index_add(
            0, rows.index, (h * m).sum(1))
        count = torch.zeros(k, dtype=h.dtype, device=h.device).index_add(
            0, rows.index, m.sum((1, 2)))
        pooled = (per / count.clamp_min(1.0)[:, None]).float()
        w1, b1, w2, b2 = head
        z = torch.einsum("kdh,kh->kd", w2, F.gelu(torch.einsum("kdh,kh->kd", w1, pooled)
                                                      + b1)) + b2
        l_align = 1 - (F.normalize(z, dim=1) * F.normalize(targets, dim=1)).sum(1)
        for i, _, _ in rows.spans:
            aligned[i].append(float(l_align[i].detach()))
        ks = torch.tensor([kappa(s, n, ramp) for n in lengths], device=h.device)
        return task + align * ks * l_align

    _, tasks = _stage(model, authors, lambda: {n: base[n] + residual[n] for n in base}, cfg,
                      seed, round, "favor-private", loss_of, opt)
    res = [{n: v[i].detach() for n, v in residual.items()} for i in range(k)]
    return res, [{"private_loss": _mean(tasks[i]),
                  "align_loss": _mean(aligned[i]) if use_align else float("nan")}
                 for i in range(k)]


def client_rounds(model: nn.Module, server: Adapter, authors: Sequence[Author],
                  shared_cfg: StageConfig, private_cfg: StageConfig, prox: float,
                  align: float, seed: int, round: int, private: bool = True,
                  proj_hidden: int = 256, ramp: float = 0.05
                  ) -> list[tuple[Adapter, dict[str, Adapter], dict[str, float]]]:
    """:func:`fedray.methods.favor.train.client_round` of every author of the cohort:
    (upload ΔA^(g), kept state, metrics) each, in order."""
    ends, metrics = shared_stage(model, server, authors, shared_cfg, prox, seed, round)
    out = []
    residuals, private_metrics = (private_stage(model, ends, authors, private_cfg, align,
                                                seed, round, proj_hidden, ramp)
                                  if private else (None, None))
    for i, end in enumerate(ends):
        state: dict[str, Adapter] = {"shared": end}
        m = dict(metrics[i])
        if private:
            state["residual"] = residuals[i]
            m |= private_metrics[i]
        out.append(({n: end[n] - server[n] for n in server}, state, m))
    return out
