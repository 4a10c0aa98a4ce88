"""FAVoR and the LoRA baselines it is compared with, on one causal-LM client stack.

Every method trains LoRA factors on a frozen base LM (``algorithm.base``: a hub id or a
directory; 4-bit NF4 on CUDA) and uploads only the delta of its *shared* adapter; the
server takes the uniform mean of the deltas times η_g (eqs. 14–15, :class:`FedAvgPolicy`
with ``weighted=False``; η_g is ``server.lr``, default 1: the paper gives no value).
What a client keeps and evaluates with differs:

============  ====================================================================
``variant``   client round
============  ====================================================================
favor         shared stage (task + λ_prox prox) → upload; private residual from the
              shared endpoint with λ_align κ_t alignment (λ_align = 0: w/o ASCE);
              keeps {shared endpoint, residual}, evaluates with their sum
fedavg        shared stage only (λ_prox = 0), evaluates with the global adapter
fedprox       shared stage with FedProx's μ/2 ‖A − A_t‖², μ = ``lambda_prox``; global
              adapter
pfedme        pFedMe: a personalized θ solves the Moreau envelope around the local
              copy w of the global adapter each step; w's delta is uploaded; evaluates θ
feddpa        FedDPA: global adapter trained alone → upload; a local adapter mixed
              with it by a learned gate (one scalar per client); evaluates the mixture
              of the final global and the local adapter at the client's gate
ditto         shared stage → upload; a persistent personal adapter trained with
              task + λ_ditto/2 ‖v − A_t‖² (+ alignment with ``align: true``:
              Ditto + ASCE); evaluates with v
local         no upload; a persistent personal adapter from the initial one, task loss
              (+ alignment with ``align: true``: the paper's local-only + ASCE)
global_asce   shared stage with the alignment loss, no private branch, no prox;
              global adapter
============  ====================================================================

Each variant's client round is the method ``Favor.round_<variant>`` (the ``fedavg`` and
``fedprox`` variants are LoRA-FedAvg / LoRA-FedProx on this stack, not the registered
methods of those names). The client procedures are :mod:`fedray.methods.favor.train`;
nothing here knows about Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import ConfigError, spec
from fedray.methods.base import (
    BASE_HELP,
    Algorithm,
    ClientContext,
    ClientOutput,
    CohortFit,
    local_work,
)
from fedray.methods.fedavg.policy import FedAvgPolicy

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def fedprox_weight(mu: float) -> float:
    """The shared stage's ``prox`` (its term is ``prox · ‖A − A_t‖²``, eq. 8 without a ½)
    for LoRA-FedProx: FedProx's proximal term is μ/2 ‖w − w_t‖² (Li et al. 2020, eq. 2),
    as the registered ``fedprox`` method has it, so the weight is μ/2."""
    return mu / 2


@dataclass
class FavorParams:
    base: str | None = spec(None, help=BASE_HELP)
    asce: str = spec("", help="directory of the trained ASCE style encoder")
    variant: Literal["favor", "fedavg", "fedprox", "ditto", "pfedme", "feddpa", "local",
                     "global_asce"] = spec("favor", help="favor (the paper's method) or one of "
                                                         "its baselines (Table 2)")
    lora_rank: int = spec(16, ge=1, help="LoRA rank r")
    lora_alpha: int = spec(32, ge=1, help="LoRA α")
    dropout: float = spec(0.05, ge=0, lt=1, help="LoRA dropout")
    targets: list[str] = spec(default_factory=lambda: list(TARGETS),
                              help="module names the LoRA adapters wrap")
    lora_lr: float = spec(2e-4, gt=0, help="Adam learning rate of the LoRA factors")
    micro_batch: int = spec(4, ge=1, help="blocks per forward/backward")
    accumulation: int = spec(8, ge=1, help="micro-batches accumulated per optimizer step")
    shared_epochs: int = spec(1, ge=1, help="local epochs of the shared (global) stage")
    private_epochs: int = spec(2, ge=1, help="local epochs of the private (personal) stage")
    max_steps: int | None = spec(None, ge=1, help="cap on optimizer steps per stage")
    lambda_prox: float = spec(0.01, ge=0, help="λ_prox of the shared stage (not given in "
                                               "the paper); FedProx's μ for the fedprox "
                                               "variant (its term μ/2 ‖A − A_t‖²)")
    lambda_align: float = spec(0.3, ge=0, help="λ_align of the alignment loss")
    align: bool | None = spec(None, help="use the ASCE alignment loss (default: on for favor "
                                         "and global_asce; on for ditto/local = Ditto + ASCE /"
                                         " local-only + ASCE; off = FAVoR w/o ASCE)")
    lambda_ditto: float = spec(0.1, ge=0, help="Ditto's λ (personal-to-global pull; not "
                                                "given in the paper)")
    lambda_pfedme: float = spec(15.0, gt=0, help="pFedMe's λ (Moreau-envelope pull; not "
                                                   "given in the paper)")
    pfedme_inner_steps: int = spec(5, ge=1, help="pFedMe's inner steps K per local "
                                                         "step (not given in the paper)")
    pfedme_inner_lr: float = spec(0.01, gt=0, help="pFedMe's personal learning rate "
                                                           "(not given in the paper)")
    ramp: float = spec(0.05, ge=0, le=1, help="κ_t ramp share of the private steps")
    proj_hidden: int = spec(256, ge=1, help="projection head hidden width")
    # data pipeline (FAVoR §4): used when data.dataset = blogtext
    min_tokens: int = spec(30_000, ge=1, help="keep authors with this many tokens")
    asce_authors: int = spec(50, ge=0, help="authors held out to train the style encoder")
    gini: float = spec(0.25, ge=0, lt=1, help="target Gini of the word allocation")
    allocation_fraction: float = spec(0.6, gt=0, le=1, help="share of the roster's train "
                                                            "words allocated (not given in "
                                                            "the paper)")
    block_length: int = spec(256, ge=8, help="tokens per training block")
    prompt_tokens: int = spec(96, ge=1, help="tokens of an evaluation prompt")
    new_tokens: int = spec(220, ge=1, help="tokens generated per evaluation prompt")
    eval_prompts: int = spec(4, ge=1, help="held-out prompts per author")
    unsampled: Literal["global", "exclude"] = spec(
        "global", help="authors no round trained (never sampled): global = deploy the final "
                       "global adapter and score them; exclude = neither generate for nor "
                       "score them (still in the attribution gallery). Their count is "
                       "reported as never_sampled")
    reference_texts: int = spec(16, ge=1, help="posts in each author's reference set "
                                                   "D_ref (eq. 6; its size is not given in "
                                                   "the paper)")

    def validate(self, cfg: Any) -> None:
        if not self.base:
            raise ConfigError("algorithm.base", self.base, "a hub id or a model directory")
        if self.align and self.variant in ("fedavg", "fedprox", "pfedme", "feddpa"):
            from fedray.core.config import check_unread

            check_unread(self, "algorithm", {"align": "its client round has no alignment "
                                                      "loss; favor, global_asce, ditto and "
                                                      "local take it"},
                         f"variant {self.variant}")
        from fedray.core.storage import absolute

        if os.path.isdir(self.base):  # a local model (not a hub id): absolute, since the
            self.base = absolute(self.base)  # executors work in their own directory
        if self.asce and os.path.isdir(self.asce):
            self.asce = absolute(self.asce)
        if cfg is not None and cfg.data.dataset == "blogtext" and not self.asce:
            raise ConfigError("algorithm.asce", self.asce, "the ASCE directory (style "
                                                           "targets come from it)")


def lora_spec(p: FavorParams, dropout: float | None = None):
    """The resident model's LoRA: rank r, or for FedDPA the global and local adapters side
    by side (rank 2r with α doubled, so each half keeps the α/r scaling)."""
    from fedray.methods.favor.adapter import LoraSpec

    d = p.dropout if dropout is None else dropout
    if p.variant == "feddpa":
        return LoraSpec(2 * p.lora_rank, 2 * p.lora_alpha, d, tuple(p.targets))
    return LoraSpec(p.lora_rank, p.lora_alpha, d, tuple(p.targets))


@dataclass
class _Round:
    """What every variant's client round works with."""

    model: Any
    server: dict  # the broadcast (global) adapter, as torch tensors on the device
    ids: Any  # the client's token blocks
    target: Any  # its style target q_i (None without alignment)
    shared: Any  # StageConfig of the shared stage
    private: Any  # StageConfig of the private stage
    args: dict  # seed, round, client
    prev: dict  # the client's state from its last round
    ctx: ClientContext


@register_method
class Favor(Algorithm):
    """FAVoR and its LoRA baselines (``algorithm.variant``) on one causal-LM client stack."""

    name = "favor"
    Params = FavorParams
    renamed_keys = {"rank": "lora_rank", "alpha": "lora_alpha", "lr": "lora_lr"}
    # the shared adapters' mean is a pseudo-gradient like FedAvg's (linear, any optimizer)
    capabilities = frozenset({"linear", "client_state", "server_optimizer", "vectorizable"})
    unread_local = {
        "epochs": "algorithm.shared_epochs and algorithm.private_epochs",
        "batch_size": "algorithm.micro_batch blocks × algorithm.accumulation",
        "lr": "the LoRA factors' Adam rate is algorithm.lora_lr",
        "momentum": "its optimizer is Adam", "weight_decay": "its Adam has none",
        "max_steps": "algorithm.max_steps", "keep_optimizer_state": "its Adam starts afresh "
                                                                    "each stage",
        "bf16": "the LM computes in bf16 on CUDA (QLoRA) and fp32 on the CPU"}
    server_optimizer = "sgd"

    @classmethod
    def build_data(cls, cfg: Any, dataset: Any = None) -> Any:
        """``data.dataset=blogtext``: per-author token blocks, style targets and prompts
        (FAVoR §4, :func:`fedray.methods.favor.data.build_text_data`)."""
        if cfg.data.dataset == "blogtext":
            from fedray.methods.favor.data import build_text_data

            return build_text_data(cfg)
        return super().build_data(cfg, dataset)

    @classmethod
    def sweep_preset(cls, cfg: Any) -> dict[str, dict]:
        """λ_align log-uniform over [0.01, 1]."""
        return {"algorithm.lambda_align": {"loguniform": [0.01, 1.0]}}

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return self.params.variant in ("favor", "ditto", "local", "pfedme", "feddpa")

    def samples_seen(self, num_samples: np.ndarray) -> np.ndarray:
        """The fleet clock's work of a client round: the shared stage's epochs over the
        author's blocks, plus the private stage's for the variants that train a personal
        adapter each round, each stage capped by ``algorithm.max_steps`` optimizer steps of
        ``micro_batch`` × ``accumulation`` blocks (pFedMe's inner steps and FedDPA's gate are
        not counted: an estimate, as the clock's cost model is)."""
        p = self.params
        stages = [p.shared_epochs] if p.variant != "local" else []
        if p.variant in ("favor", "ditto", "local", "feddpa"):
            stages.append(p.private_epochs)
        cap = p.max_steps * p.micro_batch * p.accumulation if p.max_steps else None
        return sum((local_work(num_samples, epochs, cap) for epochs in stages),
                   np.zeros_like(num_samples))

    def lora(self):
        return lora_spec(self.params)

    def build_resident(self, input_shape, num_classes, device):
        from fedray.methods.favor.lm import load_lm, with_lora

        model, tok = load_lm(self.params.base, device)
        return {"model": with_lora(model, self.lora()).eval(), "tokenizer": tok}

    def state_schema(self, input_shape, num_classes):
        """None: building the language model to learn its LoRA shapes costs more than the
        check; peft's own load names a mismatch."""
        return None

    def init_global_state(self, resident, seed):

        from fedray.core.seeding import torch_seeded
        from fedray.methods.favor.train import adapter_of, to_numpy

        model = resident["model"]
        with torch_seeded(seed, -1, -1, "lora-init"):  # drawn on the CPU: the same on any device
            for m in model.modules():
                if hasattr(m, "reset_lora_parameters"):
                    device = m.lora_A["default"].weight.device
                    m.lora_A.to("cpu"), m.lora_B.to("cpu")
                    m.reset_lora_parameters("default", True)
                    m.lora_A.to(device), m.lora_B.to(device)
        state = to_numpy(adapter_of(model))
        if self.params.variant == "feddpa":  # the global half of the rank-2r factors
            r = self.params.lora_rank
            state = {k: v[:r] if "lora_A" in k else v[:, :r] for k, v in state.items()}
        return state

    def make_policy(self):
        return FedAvgPolicy(self.make_optimizer(), weighted=False)

    def _stages(self):
        from fedray.methods.favor.train import StageConfig

        p = self.params
        mk = lambda e: StageConfig(e, p.micro_batch, p.accumulation, p.lora_lr, p.max_steps)  # noqa
        return mk(p.shared_epochs), mk(p.private_epochs)

    def client_update(self, ctx: ClientContext, broadcast) -> ClientOutput:
        """One client round of the configured variant (``round_<variant>`` below)."""
        import torch

        from fedray.methods.favor.train import to_numpy, to_torch

        p, v = self.params, self.params.variant
        ids = torch.from_numpy(np.array(ctx.x_train)).to(ctx.device)  # a writable copy
        align = p.align if p.align is not None else v in ("favor", "global_asce")
        target = None
        if align and ctx.extra and "target" in ctx.extra and p.lambda_align > 0:
            target = torch.as_tensor(ctx.extra["target"], device=ctx.device)
        run = _Round(ctx.resident["model"], to_torch(broadcast, ctx.device), ids, target,
                     *self._stages(), dict(seed=ctx.seed, round=ctx.round,
                                           client=ctx.client_id), ctx.state or {}, ctx)
        upload, metrics, state = getattr(self, f"round_{v}")(run)
        if state is not None:
            state["tau"] = ctx.round
        return ClientOutput(to_numpy(upload), len(ids), metrics, state)

    @classmethod
    def cohort_fit(cls, cfg: Any, input_shape: tuple[int, ...] | None,
                   num_classes: int | None) -> CohortFit:
        """A cohort of authors shares the one resident LM (:mod:`fedray.methods.favor.
        cohort`): the ``favor``, ``fedavg`` and ``fedprox`` variants, with ``on`` only —
        ``auto`` never takes it, since a cohort's activations grow with its authors and
        cannot be sized before the LM is built (set ``runtime.cohort_size`` to the authors
        one device holds); the device checks as it trains."""
        import math

        from fedray.methods.favor.cohort import cohort_problems

        return CohortFit(cohort_problems(cfg.algorithm.get("variant", "favor")), math.inf)

    def cohort_update(self, contexts: list[ClientContext], broadcast) -> list[ClientOutput]:
        """The client rounds of a cohort of authors through the one resident LM with
        stacked LoRA factors (:func:`fedray.methods.favor.cohort.client_rounds`); each
        output as :meth:`client_update` gives it, up to float32 rounding."""
        import torch

        from fedray.methods.favor import cohort
        from fedray.methods.favor.train import to_numpy, to_torch

        p, v = self.params, self.params.variant
        first = contexts[0]
        align = p.align if p.align is not None else v in ("favor", "global_asce")
        authors = []
        for ctx in contexts:
            target = None
            if align and ctx.extra and "target" in ctx.extra and p.lambda_align > 0:
                target = torch.as_tensor(ctx.extra["target"], device=ctx.device)
            authors.append(cohort.Author(ctx.client_id, torch.from_numpy(
                np.array(ctx.x_train)).to(ctx.device), target))
        model, server = first.resident["model"], to_torch(broadcast, first.device)
        shared, private = self._stages()
        if v == "favor":
            if any(a.target is None for a in authors) and any(a.target is not None
                                                              for a in authors):
                raise ValueError("a cohort mixes authors with and without a style target")
            rounds = cohort.client_rounds(model, server, authors, shared, private,
                                          p.lambda_prox, p.lambda_align, first.seed,
                                          first.round, proj_hidden=p.proj_hidden,
                                          ramp=p.ramp)
            kept = [{k: to_numpy(a) for k, a in state.items()} for _, state, _ in rounds]
        else:
            prox = fedprox_weight(p.lambda_prox) if v == "fedprox" else 0.0
            ends, metrics = cohort.shared_stage(model, server, authors, shared, prox,
                                                first.seed, first.round)
            rounds = [({k: e[k] - server[k] for k in server}, None, m)
                      for e, m in zip(ends, metrics, strict=True)]
            kept = [None] * len(rounds)
        out = []
        for ctx, (upload, _, metrics), state in zip(contexts, rounds, kept, strict=True):
            if state is not None:
                state["tau"] = ctx.round
            out.append(ClientOutput(to_numpy(upload), len(ctx.x_train), metrics, state))
        return out

    def round_favor(self, r: _Round) -> tuple:
        """Shared stage (task + λ_prox) → upload; private residual from the shared endpoint
        with λ_align κ_t alignment; keeps both."""
        from fedray.methods.favor.train import client_round, to_numpy

        p = self.params
        upload, kept, metrics = client_round(
            r.model, r.server, r.ids, r.ids, r.target, r.shared, r.private, p.lambda_prox,
            p.lambda_align, private=True, proj_hidden=p.proj_hidden, ramp=p.ramp, **r.args)
        return upload, metrics, {k: to_numpy(a) for k, a in kept.items()}

    def round_feddpa(self, r: _Round) -> tuple:
        """FedDPA: the global adapter trained alone → upload; a local adapter and its gate."""
        from fedray.methods.favor.train import feddpa_round, to_numpy, to_torch

        local = to_torch(r.prev["local"], r.ctx.device) if "local" in r.prev else None
        upload, kept, metrics = feddpa_round(r.model, r.server, local, r.prev.get("gate", 0.0),
                                             r.ids, r.ids, r.shared, r.private, **r.args)
        return upload, metrics, {"local": to_numpy(kept["local"]), "gate": kept["gate"]}

    def round_pfedme(self, r: _Round) -> tuple:
        """pFedMe: a personalized θ solves the Moreau envelope around the local copy w."""
        from fedray.methods.favor.train import pfedme_stage, to_numpy

        p = self.params
        w, theta, metrics = pfedme_stage(r.model, r.server, r.ids, r.ids, r.shared,
                                         p.lambda_pfedme, p.pfedme_inner_steps,
                                         p.pfedme_inner_lr, **r.args)
        return {k: w[k] - r.server[k] for k in r.server}, metrics, {"personal": to_numpy(theta)}

    def round_fedavg(self, r: _Round, prox: float = 0.0) -> tuple:
        """LoRA-FedAvg: the shared stage only; evaluated with the global adapter."""
        from fedray.methods.favor.train import shared_stage

        end, metrics = shared_stage(r.model, r.server, r.ids, r.ids, r.shared, prox, **r.args)
        return {k: end[k] - r.server[k] for k in r.server}, metrics, None

    def round_fedprox(self, r: _Round) -> tuple:
        """LoRA-FedProx: the shared stage with FedProx's μ/2 ‖A − A_t‖², μ = ``lambda_prox``."""
        return self.round_fedavg(r, fedprox_weight(self.params.lambda_prox))

    def round_global_asce(self, r: _Round) -> tuple:
        """The shared stage with the alignment loss, no private branch, no prox."""
        from fedray.methods.favor.train import private_stage

        p = self.params
        res, metrics = private_stage(r.model, r.server, r.ids, r.ids, r.target, r.shared,
                                     p.lambda_align, proj_hidden=p.proj_hidden, ramp=p.ramp,
                                     **r.args)
        return res, metrics, None  # the aligned update of the (only) global adapter

    def round_ditto(self, r: _Round) -> tuple:
        """Ditto: shared stage → upload; a persistent personal adapter pulled to the global
        one with λ_ditto/2 (+ alignment with ``align: true``)."""
        from fedray.methods.favor.train import shared_stage

        end, metrics = shared_stage(r.model, r.server, r.ids, r.ids, r.shared, 0.0, **r.args)
        upload = {k: end[k] - r.server[k] for k in r.server}
        return self._personal(r, upload, metrics, r.server, self.params.lambda_ditto / 2)

    def round_local(self, r: _Round) -> tuple:
        """Local-only: a persistent personal adapter, nothing leaves the client."""
        return self._personal(r, {}, {}, None, 0.0)

    def _personal(self, r: _Round, upload: dict, metrics: dict, anchor: Any, pull: float
                  ) -> tuple:
        from fedray.methods.favor.train import private_stage, to_numpy, to_torch

        p = self.params
        personal = to_torch(r.prev["personal"], r.ctx.device) if "personal" in r.prev else \
            {k: t.clone() for k, t in r.server.items()}
        res, mp = private_stage(r.model, personal, r.ids, r.ids, r.target, r.private,
                                p.lambda_align, proj_hidden=p.proj_hidden, ramp=p.ramp,
                                prox_anchor=personal if anchor is None else anchor, prox=pull,
                                **r.args)
        return upload, metrics | mp, {"personal": to_numpy({k: personal[k] + res[k]
                                                            for k in personal})}

    def evaluate(self, resident, broadcast, x, y, device="cpu"):
        """LM loss and next-token accuracy of the global adapter on held-out blocks."""
        import torch

        from fedray.methods.favor.train import lm_scores, to_torch
        from fedray.models.training import input_tensor

        model = resident["model"]
        adapter = to_torch(broadcast, device)
        if self.params.variant == "feddpa":
            from fedray.methods.favor.train import mix

            adapter = mix(adapter, {k: torch.zeros_like(v) for k, v in adapter.items()}, 0.0)
        ids = input_tensor(np.asarray(x), device)
        loss = correct = count = 0
        for i in range(0, len(ids), 8):
            lsum, ok, n = lm_scores(model, adapter, ids[i:i + 8])
            loss, correct, count = loss + lsum, correct + ok, count + n
        return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1),
                "n": float(len(ids))}
