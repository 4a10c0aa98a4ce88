"""FAVoR's client round (Algorithm 2) in plain PyTorch: no Ray, no runtime.

An adapter is a dict of LoRA factor tensors keyed by their peft parameter names; the base
model stays frozen and every forward *and backward* pass runs inside :func:`using`, which
puts the adapter's tensors in place of the LoRA parameters, so a stage trains exactly the
tensors it is given (and gradient checkpointing, which re-runs the forward during the
backward, sees the same tensors). The task loss is computed from the decoder's last hidden
state with the output head applied chunk by chunk (:func:`lm_loss`): a Qwen2.5 vocabulary of
151,936 tokens never has its full logits tensor in memory.

- Shared stage (eq. 8): from the server adapter A_t, minimise the task loss (eq. 7: token
  cross-entropy on the supervised tokens) + λ_prox Σ_ℓ ‖A − A_t‖²_F (no ½, as written),
  giving the shared endpoint A_{i,t}; the upload is ΔA = A_{i,t} − A_t (eq. 13), only that.
- Private stage (eq. 12): the private adapter is sg(A_{i,t}) + ΔA^(p) with the residual
  ΔA^(p) initialised at 0 — the shared endpoint is a constant, so it receives no gradient;
  loss = task + λ_align κ_t (1 − cos(norm(P_ψ(h)), q_i)) (eqs. 9–11) with h the mean of the
  final-layer hidden states over the supervised tokens of the whole micro-batch (eq. 9 as
  written), P_ψ a 2-layer MLP (GELU; hidden width our choice) drawn afresh from
  (seed, round, client) and discarded, and κ_t rising linearly from 0 to 1 over the first
  5 % of the stage's optimizer steps.
- The client keeps (A_{i,t}, ΔA^(p)) — the residual pack at the factor level (eq. 2); its
  personalized adapter is their sum, computed by the same tensor addition as in training,
  so the reconstruction is exact.

Optimisation: our Adam (table 32: lr 2e-4, micro-batch 4 × accumulation 8; the optimizer
itself is not named in the paper).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

Adapter = dict[str, torch.Tensor]
IGNORE = -100


def lora_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters() if "lora_" in n]


def adapter_of(model: nn.Module) -> Adapter:
    """The LoRA factors currently inside ``model`` (copies)."""
    params = dict(model.named_parameters())
    return {n: params[n].detach().clone() for n in lora_names(model)}


def to_numpy(a: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().float().numpy() for k, v in a.items()}


def to_torch(a: Mapping[str, Any], device: str = "cpu") -> Adapter:
    return {k: torch.as_tensor(np.asarray(v), dtype=torch.float32, device=device)
            for k, v in a.items()}


def compose(shared: Adapter, residual: Adapter) -> Adapter:
    """A^(p) = A^(g)_{i,τ} + ΔA^(p) per factor (eq. 2)."""
    return {k: shared[k] + residual[k] for k in shared}


@dataclass
class StageConfig:
    epochs: int = 1
    micro_batch: int = 4
    accumulation: int = 8
    lr: float = 2e-4
    max_steps: int | None = None


@contextmanager
def using(model: nn.Module, adapter: Adapter) -> Iterator[nn.Module]:
    """``model`` with its LoRA parameters replaced by ``adapter``'s tensors until the block
    ends. Unlike ``torch.func.functional_call``, which restores the parameters when the
    forward returns, the swap lasts through ``backward()`` inside the block: gradient
    checkpointing (on for 4-bit training) recomputes the forward there and must see the
    tensors the forward saw."""
    saved = []
    try:
        for name, tensor in adapter.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            saved.append((module, leaf, module._parameters[leaf]))
            module._parameters[leaf] = tensor
        yield model
    finally:
        for module, leaf, param in reversed(saved):
            module._parameters[leaf] = param


def causal_lm(model: nn.Module) -> nn.Module:
    """The ``*ForCausalLM`` under a peft wrapper (or ``model`` itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextmanager
def training(model: nn.Module, seed: int, round: int, client: int, purpose: str
             ) -> Iterator[None]:
    """Train mode for one stage — LoRA dropout acts, and gradient checkpointing, which HF
    applies only in train mode — with the torch RNG (the dropout masks) drawn from
    (seed, round, client, purpose), so a client's stage is the same on any executor and
    after any earlier work; the RNG is restored and the model left in eval mode after."""
    from fedray.core.seeding import torch_seeded

    with torch_seeded(seed, round, client, purpose):
        model.train()
        try:
            yield
        finally:
            model.eval()


LOGIT_CHUNK = 1 << 24  # logits (tokens x vocabulary) materialised at once: 64 MB in fp32


def head_ce(head: nn.Module, h: torch.Tensor, y: torch.Tensor, reduction: str = "sum"
            ) -> torch.Tensor:
    """Next-token cross-entropy of one chunk of the output head's inputs (summed, or per
    token with ``reduction="none"``: a cohort's per-author sums)."""
    return F.cross_entropy(head(h).float(), y, ignore_index=IGNORE, reduction=reduction)


def _next_token_inputs(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor):
    """(final hidden states (B, L, H), flat inputs of the output head, flat next-token
    labels, the head, tokens per chunk of at most ``LOGIT_CHUNK`` logits)."""
    lm = causal_lm(model)
    h = lm.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    head = lm.get_output_embeddings()
    step = max(1, LOGIT_CHUNK // head.weight.shape[0])
    return h, h[:, :-1].reshape(-1, h.shape[-1]), labels[:, 1:].reshape(-1), head, step


def lm_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, hidden: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eq. 7: mean token cross-entropy of next-token prediction over the supervised tokens
    (labels ≠ -100), as the ``*ForCausalLM`` loss computes it, and, with ``hidden``, the
    final-layer hidden states (B, L, H) for eq. 9.

    The output head runs on at most ``LOGIT_CHUNK`` logits at a time; with several chunks
    each is checkpointed, so its logits are recomputed in the backward instead of kept.
    Call it inside :func:`using`."""
    h, x, y, head, step = _next_token_inputs(model, ids, labels)
    if len(x) <= step:
        total = head_ce(head, x, y)
    else:
        from torch.utils.checkpoint import checkpoint

        total = sum(checkpoint(head_ce, head, x[i:i + step], y[i:i + step],
                               use_reentrant=False) for i in range(0, len(x), step))
    loss = total / (y != IGNORE).sum().clamp_min(1)
    return loss, (h if hidden else None)


@torch.no_grad()
def lm_scores(model: nn.Module, adapter: Adapter, ids: torch.Tensor) -> tuple[float, int, int]:
    """(summed next-token loss, correct next-token predictions, predicted tokens) of
    ``model`` with ``adapter`` on full token blocks, the head applied chunk by chunk."""
    model.eval()
    with using(model, adapter):
        _, x, y, head, step = _next_token_inputs(model, ids, ids)
        loss, correct = 0.0, 0
        for i in range(0, len(x), step):
            logits = head(x[i:i + step]).float()
            loss += float(F.cross_entropy(logits, y[i:i + step], reduction="sum"))
            correct += int((logits.argmax(-1) == y[i:i + step]).sum())
    return loss, correct, len(y)


def _micro_batches(n: int, cfg: StageConfig, seed: int, round: int, client: int,
                   purpose: str) -> list[list[np.ndarray]]:
    """Optimizer steps, each a list of ``accumulation`` micro-batches of indices."""
    from fedray.models.training import batches

    micro = list(batches(n, cfg.micro_batch, cfg.epochs, seed, round, client, None, purpose))
    steps = [micro[i:i + cfg.accumulation] for i in range(0, len(micro), cfg.accumulation)]
    return steps[:cfg.max_steps] if cfg.max_steps else steps


def shared_stage(model: nn.Module, start: Adapter, ids: torch.Tensor, labels: torch.Tensor,
                 cfg: StageConfig, prox: float, seed: int, round: int, client: int
                 ) -> tuple[Adapter, dict[str, float]]:
    """Eq. 8 from A_t = ``start``; returns the shared endpoint A_{i,t} and metrics."""
    from fedray.models.training import Adam

    params = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    anchor = {k: v.detach() for k, v in start.items()}
    opt = Adam(list(params.values()), lr=cfg.lr)
    total, count = 0.0, 0
    with training(model, seed, round, client, "favor-shared"):
        for step in _micro_batches(len(ids), cfg, seed, round, client, "favor-shared"):
            opt.zero_grad()
            for mb in step:
                with using(model, params):
                    loss, _ = lm_loss(model, ids[mb], labels[mb])
                    if prox:
                        loss = loss + prox * sum(((params[k] - anchor[k]) ** 2).sum()
                                                 for k in params)
                    (loss / len(step)).backward()
                total += float(loss.detach())
                count += 1
            opt.step()
    return {k: v.detach() for k, v in params.items()}, {"shared_loss": total / max(count, 1)}


class ProjectionHead(nn.Module):
    """P_ψ: LM hidden size → hidden → style dimension (2-layer MLP, GELU)."""

    def __init__(self, d_in: int, hidden: int, d_out: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h)


def kappa(step: int, total_steps: int, ramp: float = 0.05) -> float:
    """κ_t: 0 → 1 linearly over the first ``ramp`` share of the optimizer steps, then 1."""
    width = ramp * total_steps
    return 1.0 if width <= 0 else min(1.0, step / width)


def pooled_hidden(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Eq. 9: Σ_{b,ℓ} M H / Σ M over the whole micro-batch (one vector)."""
    m = (labels != IGNORE).unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum((0, 1)) / m.sum().clamp_min(1.0)


def private_stage(model: nn.Module, shared: Adapter, ids: torch.Tensor, labels: torch.Tensor,
                  target: torch.Tensor | None, cfg: StageConfig, align: float, seed: int,
                  round: int, client: int, proj_hidden: int = 256, ramp: float = 0.05,
                  prox: float = 0.0, prox_anchor: Adapter | None = None
                  ) -> tuple[Adapter, dict[str, float]]:
    """Eq. 12 from the constant shared endpoint; returns the residual ΔA^(p) and metrics.
    ``align = 0`` (or no ``target``) is FAVoR without ASCE. ``prox`` · ‖base + ΔA −
    prox_anchor‖² is added when given (Ditto's personal branch uses it)."""
    from fedray.core.seeding import torch_seeded
    from fedray.models.training import Adam

    base = {k: v.detach() for k, v in shared.items()}
    residual = {k: torch.zeros_like(v, requires_grad=True) for k, v in base.items()}
    use_align = align > 0 and target is not None
    trainable = list(residual.values())
    head = None
    if use_align:
        with torch_seeded(seed, round, client, "favor-projection"):
            head = ProjectionHead(model.config.hidden_size, proj_hidden, target.numel())
        head.to(next(iter(base.values())).device)
        trainable += list(head.parameters())
    opt = Adam(trainable, lr=cfg.lr)
    steps = _micro_batches(len(ids), cfg, seed, round, client, "favor-private")
    task_sum = align_sum = 0.0
    count = 0
    with training(model, seed, round, client, "favor-private"):
        for s, step in enumerate(steps):
            k = kappa(s, len(steps), ramp)
            opt.zero_grad()
            for mb in step:
                adapter = compose(base, residual)
                with using(model, adapter):
                    task, h = lm_loss(model, ids[mb], labels[mb], hidden=use_align)
                    loss = task
                    if prox and prox_anchor is not None:
                        loss = loss + prox * sum(((adapter[k] - prox_anchor[k].detach()) ** 2)
                                                 .sum() for k in adapter)
                    task_sum += float(task.detach())
                    if use_align:  # the head and target in fp32 whatever the LM computes in
                        pooled = pooled_hidden(h, labels[mb]).float()
                        z = F.normalize(head(pooled), dim=0)
                        l_align = 1 - torch.dot(z, F.normalize(target.float(), dim=0))
                        loss = loss + align * k * l_align
                        align_sum += float(l_align.detach())
                    (loss / len(step)).backward()
                count += 1
            opt.step()
    return ({k: v.detach() for k, v in residual.items()},
            {"private_loss": task_sum / max(count, 1),
             "align_loss": align_sum / max(count, 1) if use_align else float("nan")})


def client_round(model: nn.Module, server: Adapter, ids: torch.Tensor, labels: torch.Tensor,
                 target: torch.Tensor | None, shared_cfg: StageConfig,
                 private_cfg: StageConfig, prox: float, align: float, seed: int, round: int,
                 client: int, private: bool = True, proj_hidden: int = 256,
                 ramp: float = 0.05) -> tuple[Adapter, dict[str, Adapter], dict[str, float]]:
    """One sampled client's Algorithm 2 lines 7–13: (upload ΔA^(g), kept state, metrics).
    The kept state is the residual pack {"shared": A_{i,t}, "residual": ΔA^(p)}.
    ``ramp`` is the κ_t ramp share of the private stage (:func:`kappa`)."""
    endpoint, m = shared_stage(model, server, ids, labels, shared_cfg, prox, seed, round, client)
    upload = {k: endpoint[k] - server[k] for k in server}
    state: dict[str, Adapter] = {"shared": endpoint}
    if private:
        residual, mp = private_stage(model, endpoint, ids, labels, target, private_cfg, align,
                                     seed, round, client, proj_hidden, ramp)
        state["residual"] = residual
        m |= mp
    return upload, state, m


def pfedme_stage(model: nn.Module, start: Adapter, ids: torch.Tensor, labels: torch.Tensor,
                 cfg: StageConfig, lam: float, inner_steps: int, inner_lr: float, seed: int,
                 round: int, client: int) -> tuple[Adapter, Adapter, dict[str, float]]:
    """pFedMe (Dinh et al., 2020) on LoRA factors: per local step, the personalized θ
    approximately solves min_θ f(θ; batch) + λ/2 ‖θ − w‖² with ``inner_steps`` gradient
    steps, then the local copy of the global adapter moves w ← w − lr λ (w − θ).
    Returns (local w — its delta is uploaded —, personalized θ, metrics)."""
    w = {k: v.detach().clone() for k, v in start.items()}
    theta = {k: v.clone() for k, v in w.items()}
    total, count = 0.0, 0
    with training(model, seed, round, client, "pfedme"):
        for step in _micro_batches(len(ids), cfg, seed, round, client, "pfedme"):
            batch = np.concatenate(step)
            for _ in range(inner_steps):
                params = {k: v.detach().requires_grad_(True) for k, v in theta.items()}
                with using(model, params):
                    loss, _ = lm_loss(model, ids[batch], labels[batch])
                    loss = loss + lam / 2 * sum(((params[k] - w[k]) ** 2).sum() for k in params)
                    grads = torch.autograd.grad(loss, list(params.values()))
                theta = {k: (p - inner_lr * g).detach()
                         for (k, p), g in zip(params.items(), grads, strict=True)}
                total += float(loss.detach())
                count += 1
            w = {k: w[k] - cfg.lr * lam * (w[k] - theta[k]) for k in w}
    return w, theta, {"pfedme_loss": total / max(count, 1)}


def mix(global_a: Adapter, local_a: Adapter, weight: torch.Tensor | float) -> Adapter:
    """FedDPA's mixture as one LoRA of twice the rank: A = [A_g; A_l], B = [(1−a) B_g, a B_l],
    so B A = (1−a) B_g A_g + a B_l A_l (the model must carry rank 2r and α 2α)."""
    out = {}
    for k, g in global_a.items():
        if "lora_A" in k:
            out[k] = torch.cat([g, local_a[k]], 0)
        else:
            out[k] = torch.cat([(1 - weight) * g, weight * local_a[k]], 1)
    return out


def feddpa_round(model: nn.Module, server: Adapter, local: Adapter | None, gate: float,
                 ids: torch.Tensor, labels: torch.Tensor, shared_cfg: StageConfig,
                 local_cfg: StageConfig, seed: int, round: int, client: int
                 ) -> tuple[Adapter, dict[str, Any], dict[str, float]]:
    """FedDPA (Yang et al., 2024) on LoRA: the global adapter trains alone (local weight 0)
    and its delta is uploaded; then the client's local adapter and its gate a = σ(g) train
    on the mixture with the global endpoint frozen. The paper's gate is per prompt; ours is
    one learned scalar per client — what the paper evaluates with (the client's mean
    validation gate). Returns (upload, state {local, gate}, metrics)."""
    from fedray.core.seeding import derive_seed
    from fedray.models.training import Adam

    zeros = {k: torch.zeros_like(v) for k, v in server.items()}
    g_params = {k: v.clone().requires_grad_(True) for k, v in server.items()}
    opt = Adam(list(g_params.values()), lr=shared_cfg.lr)
    total = count = 0.0
    with training(model, seed, round, client, "feddpa-global"):
        for step in _micro_batches(len(ids), shared_cfg, seed, round, client, "feddpa-global"):
            opt.zero_grad()
            for mb in step:
                with using(model, mix(g_params, zeros, 0.0)):
                    loss, _ = lm_loss(model, ids[mb], labels[mb])
                    (loss / len(step)).backward()
                total, count = total + float(loss.detach()), count + 1
            opt.step()
    endpoint = {k: v.detach() for k, v in g_params.items()}
    if local is None:  # LoRA's own start: A random, B zero (contributes nothing yet)
        gen = torch.Generator().manual_seed(derive_seed(seed, -1, client, "feddpa-local"))
        local = {k: (torch.randn(v.shape, generator=gen) / v.shape[1] ** 0.5).to(v.device)
                 if "lora_A" in k else torch.zeros_like(v) for k, v in server.items()}
    l_params = {k: v.clone().requires_grad_(True) for k, v in local.items()}
    g = torch.tensor(float(gate), requires_grad=True)
    opt = Adam([*l_params.values(), g], lr=local_cfg.lr)
    ltotal = lcount = 0.0
    with training(model, seed, round, client, "feddpa-local"):
        for step in _micro_batches(len(ids), local_cfg, seed, round, client, "feddpa-local"):
            opt.zero_grad()
            for mb in step:
                with using(model, mix(endpoint, l_params, torch.sigmoid(g))):
                    loss, _ = lm_loss(model, ids[mb], labels[mb])
                    (loss / len(step)).backward()
                ltotal, lcount = ltotal + float(loss.detach()), lcount + 1
            opt.step()
    upload = {k: endpoint[k] - server[k] for k in server}
    state = {"local": {k: v.detach() for k, v in l_params.items()}, "gate": float(g.detach())}
    return upload, state, {"shared_loss": total / max(count, 1),
                           "local_loss": ltotal / max(lcount, 1),
                           "gate": float(torch.sigmoid(g.detach()))}
