"""FLITE — federated latent fine-tuning (papers/flite-federated-lightweight-fine-tuning.txt,
Algorithm 1).

Every client holds the shared pretrained base θ^pre (downloaded once, counted once) and the
frozen factors U_l, V_l (regenerated from one 64-bit seed: zero bytes). Each round:

1. the server broadcasts the mean latent z̄ (D floats; D = Σ_l d_l, 1,280 for ResNet-18 at
   d = 64 over its 20 conv weights);
2. a client sets z ← z̄ and trains only z for E local epochs with Adam (lr 1e-2, weight
   decay 1e-4, gradient clip 1.0 on the latents), the network's mapped weights being
   θ_l = θ_l^pre + U_l V_lᵀ z_l on every forward pass; the head (frozen orthogonal by
   default) and all other parameters stay frozen;
3. it uploads z — quantized by the payload codec (``payload.upload=int8|int4``): with
   ``quant_scope="vector"`` the whole latent is one tensor, so one fp32 scale and one fp32
   zero-point (the paper's 648 B at int4 = 640 B of codes + 8 B), with ``"layer"`` one pair
   per mapped layer;
4. the server takes the unweighted (or sample-weighted) mean, and logs the averaging-
   identity error max |mean_k θ(z_k) − θ(z̄)| every round (paper: ≈ 6e-8 in fp32).

Without ``base`` the mapped model is a random initialisation — the from-scratch setting the
paper shows collapsing (§3.2), kept for that ablation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import ConfigError, build_dataclass, spec
from fedray.methods.base import (
    BASE_HELP,
    WEIGHTED_HELP,
    ClientContext,
    ClientOutput,
    CohortFit,
)
from fedray.methods.fedavg.method import FedAvg, apply_base, check_base
from fedray.methods.fedavg.policy import FedAvgPolicy, weighted_mean


@dataclass
class FliteParams:
    base: str | None = spec(None, help=BASE_HELP)
    d: int = spec(64, ge=1, help="latent size d_l per mapped layer")
    r: int = spec(32, ge=1, help="rank r of the frozen factors (r <= d)")
    factor_seed: int = spec(0, ge=0, help="the one 64-bit seed of every layer's U_l, V_l")
    layers: list[str] | None = spec(None, help="fnmatch patterns of mapped parameters "
                                               "(default: every conv weight)")
    mode: Literal["stored", "regenerated"] = spec(
        "stored", help="keep U_l in memory, or regenerate it from the seed in chunks")
    lr: float = spec(1e-2, gt=0, help="Adam learning rate on the latents")
    weight_decay: float = spec(1e-4, ge=0, help="Adam weight decay on the latents")
    clip: float | None = spec(1.0, gt=0, help="gradient-norm clip on the latents")
    weighted: bool = spec(False, help=WEIGHTED_HELP)  # unweighted: Alg. 1
    quant_scope: Literal["vector", "layer"] = spec(
        "vector", help="one quantizer scale/zero for the whole latent, or one per layer")
    identity_check: bool = spec(True, help="log the averaging-identity error every round")

    def validate(self, cfg: Any) -> None:
        if self.r > self.d:
            raise ConfigError("algorithm.r", self.r, f"at most algorithm.d = {self.d}")
        self.base = check_base(self.base, cfg.model if cfg is not None else None)
        if self.base is None and self.identity_check:
            raise ConfigError("algorithm.identity_check", True,
                              "false without algorithm.base (the server has no θ^pre)")
        if cfg is None:
            return
        if self.base is not None:
            from fedray.methods.flite.factors import check_dims
            from fedray.methods.flite.identity import mapped_names
            from fedray.models.pretrain import load_base

            pre, _ = load_base(self.base)
            for name in mapped_names(pre, self.layers):
                check_dims(name, int(pre[name].size), self.d, self.r)


def latent_layout(names: list[str], d: int) -> list[tuple[str, int]]:
    return [(n, d) for n in names]


class FlitePolicy(FedAvgPolicy):
    """Mean of the latents (FedAvg in latent space, Eq. 2) plus the identity check."""

    def __init__(self, params: FliteParams, layout: list[tuple[str, int]], checker: Any):
        super().__init__(weighted=params.weighted)
        self.optimizer = None  # the latent is the mean itself (Eq. 2): no server step
        self.layout, self.checker = layout, checker

    def _vector(self, upload: dict) -> np.ndarray:
        if "z" in upload:
            return np.asarray(upload["z"], np.float32)
        return np.concatenate([np.asarray(upload[f"z/{n}"], np.float32) for n, _ in self.layout])

    def aggregate(self, global_state, updates, round):
        latents = [(cid, n, {"z": self._vector(u)}) for cid, n, u in updates]
        mean = weighted_mean(latents, self.weighted)["z"]
        new = {"z": mean.astype(np.float32)}
        metrics = {"latent_norm": float(np.linalg.norm(mean))}
        if self.checker is not None:
            counts = np.array([n for _, n, _ in latents], dtype=np.float64)
            w = counts / counts.sum() if self.weighted else np.full(len(latents),
                                                                    1.0 / len(latents))
            z = np.stack([u["z"] for _, _, u in latents])
            metrics["identity_error"] = self.checker.error(z, w, new["z"])
        return new, metrics


@register_method
class Flite(FedAvg):
    """Delta low-rank latent federated fine-tuning (FLITE)."""

    name = "flite"
    Params = FliteParams
    # it uploads the latent z itself, not a delta: no transforms (error feedback would pile
    # up absolute values, per-layer scopes rename it; its codec is payload.upload), no server
    # optimizer (the new latent is the mean, Eq. 2), not linear (the identity check needs
    # every latent); no local DP-SGD (Adam on the latents, through the mapping)
    capabilities = frozenset({"dp", "client_state", "vectorizable", "finetune"})
    unread_local = {"lr": "its Adam's rate on the latents is algorithm.lr",
                    "momentum": "its optimizer is Adam on the latents",
                    "weight_decay": "its Adam's is algorithm.weight_decay",
                    "keep_optimizer_state": "its Adam starts afresh each round"}
    server_optimizer = None

    @classmethod
    def sweep_preset(cls, cfg: Any) -> dict[str, dict]:
        """The paper's latent size d and factor rank r grid."""
        return {"algorithm.d": {"choice": [32, 64, 128]}, "algorithm.r": {"choice": [8, 16, 32]}}

    def build_resident(self, input_shape, num_classes, device):
        from fedray.methods.flite.mapping import LatentMapping
        from fedray.models.pretrain import build_base_model

        model = build_base_model(self.cfg, input_shape, num_classes, head="orthogonal")
        if self.params.base:
            apply_base(model, self.params.base, self.cfg.model)
        p = self.params
        return LatentMapping(model, d=p.d, r=p.r, seed=p.factor_seed, layers=p.layers,
                             mode=p.mode).to(device)

    def init_global_state(self, resident, seed):
        return {"z": np.zeros(resident.D, dtype=np.float32)}

    def _train(self, ctx: ClientContext, broadcast, epochs: int, purpose: str) -> dict:
        """Set z ← z̄ and train only the latents (Adam, wd, clip) for ``epochs``. The Adam
        is new each round, its moments at zero: the paper does not say whether a client's
        optimizer state survives between rounds, and a fresh one is the stateless client
        cross-device FL assumes (a sampled client need not have been sampled before)."""
        from fedray.models.training import Adam, train_local

        mapping, p, loc = ctx.resident, self.params, self.cfg.local
        mapping.set_latent_vector(broadcast["z"])
        opt = Adam(mapping.latent_parameters(), lr=p.lr, weight_decay=p.weight_decay,
                   clip=p.clip)
        metrics, _ = train_local(
            mapping, ctx.x_train, ctx.y_train, epochs=epochs, batch_size=loc.batch_size,
            lr=p.lr, seed=ctx.seed, round=ctx.round, client=ctx.client_id,
            max_steps=loc.max_steps if purpose == "local" else None, device=ctx.device,
            bf16=loc.bf16, optimizer=opt, purpose=purpose)
        return metrics

    def client_update(self, ctx: ClientContext, broadcast) -> ClientOutput:
        mapping, p = ctx.resident, self.params
        metrics = self._train(ctx, broadcast, self.cfg.local.epochs, "local")
        if p.quant_scope == "vector":
            upload = {"z": mapping.latent_vector().cpu().numpy()}
        else:
            upload = {f"z/{m.name}": m.z.detach().cpu().numpy() for m in mapping.maps}
        return ClientOutput(upload, len(ctx.x_train), metrics)

    @classmethod
    def cohort_fit(cls, cfg: Any, input_shape: tuple[int, ...] | None,
                   num_classes: int | None) -> CohortFit:
        """A cohort stacks its clients' latents and runs the one resident mapping for all of
        them (:mod:`fedray.methods.flite.cohort`). Refused: ``local.bf16`` and a model whose
        forward keeps batch statistics or draws randomness (BatchNorm, dropout); under
        ``on``, also one whose batched gradient fails (a probe of two clients through a
        d = r = 1 mapping of the configured model and mode, on the CPU).

        ``work``: one client step's multiply-adds — the network's forward and backward on
        its batch (3 × ``local.batch_size`` × the convolutions' and linear layers'
        multiply-adds per sample) plus the factor products U (Vᵀ z) and their transpose
        (2 r Σ_l P_l). ``auto`` (``pays``) takes FLITE where the factor products are at
        least :data:`~fedray.methods.flite.cohort.AUTO_SHARE` (1/20) of the network's
        part: a cohort reads each U_l (or regenerates each G_l) once for all its clients —
        one matrix product instead of K memory-bound matrix-vector products — while its
        batched (grouped) convolutions cost about what the clients' own do. Measured on a
        CPU, one thread, d = 64, r = 32 (``benchmarks/cohorts.py --workloads flite
        flite_regen``, cohort / sequential CPU time): the FLITE digits study's width-8
        ResNet-18 on 8×8 inputs (factor share 0.43) 0.44× with 8 clients, 0.30× with 16,
        regenerated 0.20×; the small CNN on 8×8 (0.064) 0.47×; widths 8–16 on 8×8–16×16
        (0.1–0.4) 0.49–0.58×. At shares of 0.006–0.027 it does not pay: the width-8
        ResNet-18 on 32×32 1.13× (and 1.5× the peak memory), widths 32–64 on 32×32 and a
        FEMNIST-sized CNN 0.89–1.0×; ``auto`` leaves those one client at a time.

        ``client_bytes``: each client's stacked latent, its gradient and Adam moments (4 D
        floats), its mapped weights (θ and δ, each with its gradient: 4 Σ_l P_l floats; 5
        regenerated, whose product is transposed once more) and its batch's activations
        forward and backward (2 × batch × the model's activations per sample)."""
        if cfg.local.bf16:
            return CohortFit(["local.bf16 autocasts one client's mapped model at a time"])
        if input_shape is None:  # a table read at run time: checked with its shape then
            return CohortFit([])
        from fedray.methods.flite.cohort import AUTO_SHARE, cohort_problems
        from fedray.methods.flite.factors import mapped_layers
        from fedray.models.cohort import activation_numel, forward_macs
        from fedray.models.pretrain import build_base_model

        p = build_dataclass(cls.Params, {k: v for k, v in cfg.algorithm.items()
                                         if k != "name"}, "algorithm")
        model = build_base_model(cfg, tuple(input_shape), num_classes, head="orthogonal")
        problems = [f"model {cfg.model['name']}: {why}" for why in cohort_problems(
            model, input_shape, p.mode, p.layers, probe=cfg.runtime.vectorize == "on")]
        if problems:
            return CohortFit(problems)
        sizes = dict(model.named_parameters())
        names = mapped_layers(model, p.layers)
        mapped = sum(sizes[n].numel() for n in names)
        batch = cfg.local.batch_size
        network = 3 * batch * forward_macs(model, input_shape)
        products = 2 * p.r * mapped
        pays = products >= AUTO_SHARE * network
        if cfg.runtime.vectorize == "auto" and not pays:
            return CohortFit([], float(network + products), pays=False)  # no memory to size
        copies = 4 + (p.mode == "regenerated")
        acts = 2 * batch * activation_numel(model, input_shape)
        return CohortFit([], float(network + products),
                         4 * (4 * p.d * len(names) + copies * mapped + acts), pays)

    def cohort_update(self, contexts: list[ClientContext], broadcast) -> list[ClientOutput]:
        """:meth:`client_update` of each context, the latents of all of them trained as one
        batched computation (:func:`fedray.methods.flite.cohort.train_latents`)."""
        from fedray.methods.flite.cohort import train_latents

        first, p, loc = contexts[0], self.params, self.cfg.local
        mapping = first.resident
        trained = train_latents(
            mapping, broadcast["z"], [(c.x_train, c.y_train) for c in contexts],
            [c.client_id for c in contexts], epochs=loc.epochs, batch_size=loc.batch_size,
            lr=p.lr, weight_decay=p.weight_decay, clip=p.clip, seed=first.seed,
            round=first.round, max_steps=loc.max_steps, device=first.device)
        layout = mapping.latent_layout()
        out = []
        for ctx, (z, metrics) in zip(contexts, trained, strict=True):
            if p.quant_scope == "vector":
                upload = {"z": z}
            else:
                parts = np.split(z, np.cumsum([d for _, d in layout])[:-1])
                upload = {f"z/{name}": part.copy()
                          for (name, _), part in zip(layout, parts, strict=True)}
            out.append(ClientOutput(upload, len(ctx.x_train), metrics))
        return out

    def to_delta(self, global_state, upload):
        """DP clips in latent space: the client's latent minus the broadcast latent z̄ (the
        upload is z itself, or its per-layer parts, concatenated in the mapping's layer order
        whatever order they arrived in)."""
        z = upload["z"] if "z" in upload else np.concatenate(
            [np.ravel(upload[f"z/{n}"]) for n, _ in self._layout()])
        return {"z": np.asarray(z, np.float32) - global_state["z"]}

    def from_delta(self, global_state, delta):
        return {"z": (global_state["z"] + delta["z"]).astype(np.float32)}

    def evaluate(self, resident, broadcast, x, y, device="cpu"):
        from fedray.models.training import evaluate

        resident.set_latent_vector(broadcast["z"])
        return evaluate(resident, x, y, device)

    def finetune_evaluate(self, ctx, broadcast, epochs):
        from fedray.models.training import evaluate

        self._train(ctx, broadcast, epochs, "finetune")
        return evaluate(ctx.resident, ctx.x_test, ctx.y_test, ctx.device)

    def _layout(self) -> list[tuple[str, int]]:
        """(layer, latent size) in the mapping's order, from the base (cached)."""
        if getattr(self, "_layout_cache", None) is None:
            from fedray.methods.flite.identity import mapped_names
            from fedray.models.pretrain import load_base

            pre, _ = load_base(self.params.base)
            self._layout_cache = latent_layout(mapped_names(pre, self.params.layers),
                                               self.params.d)
        return self._layout_cache

    def make_policy(self) -> FlitePolicy:
        from fedray.methods.flite.factors import LayerFactors
        from fedray.methods.flite.identity import IdentityChecker, mapped_names
        from fedray.models.pretrain import load_base

        if self.params.base is None:
            return FlitePolicy(self.params, [], None)
        pre, _ = load_base(self.params.base)
        names = mapped_names(pre, self.params.layers)
        layout = self._layout_cache = latent_layout(names, self.params.d)
        checker = None
        if self.params.identity_check:
            layers = [LayerFactors(self.params.factor_seed, i, int(pre[n].size), self.params.d,
                                   self.params.r, None, n) for i, n in enumerate(names)]
            checker = IdentityChecker(pre, layers, keep_u=self.params.mode == "stored")
        return FlitePolicy(self.params, layout, checker)
