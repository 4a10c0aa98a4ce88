"""FedAvg (McMahan et al., 2017), client side: local SGD from the broadcast model, upload
the update Δ_i = θ_i − θ_t (not θ_i, so codecs quantize small deltas). The server side is
:class:`fedray.methods.fedavg.policy.FedAvgPolicy`. FedProx and ORDERS reuse this client."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.registry import register_method
from fedray.core.spec import ConfigError, spec
from fedray.methods.base import (
    AUTO_WORK,
    BASE_HELP,
    WEIGHTED_HELP,
    AggregationPolicy,
    Algorithm,
    ClientContext,
    ClientOutput,
    CohortFit,
    StackRow,
    State,
)
from fedray.methods.fedavg.policy import FedAvgPolicy
from fedray.wire.payload import Payload


def check_base(base: str | None, model_cfg: dict | None = None) -> str | None:
    """Fail at config time when ``algorithm.base`` is not a `fedray pretrain` output of the
    configured model; return it as the executors must open it (absolute: they may work in
    another directory)."""
    if base is None:
        return None
    from fedray.core.storage import absolute
    from fedray.models.pretrain import load_base_meta

    base = absolute(base)
    meta = load_base_meta(base)
    if model_cfg is not None:
        _same_model(base, meta, model_cfg)
    return base


def _same_model(base: str, meta: dict, model_cfg: dict) -> None:
    if meta["model"] != model_cfg:
        raise ConfigError("algorithm.base", base, f"a base pretrained with model = {model_cfg}"
                                                  f" (this one: {meta['model']})")


def apply_base(model: Any, base: str, model_cfg: dict) -> None:
    """Load the pretrained weights into ``model`` and freeze its head if it was pretrained
    frozen (FLITE §3.5: the frozen head is never trained nor communicated)."""
    from fedray.models.heads import classifier
    from fedray.models.pretrain import load_base
    from fedray.models.training import set_state

    state, meta = load_base(base)
    _same_model(base, meta, model_cfg)
    set_state(model, state)
    if meta["head"] != "trainable":
        classifier(model).requires_grad_(False)


@dataclass
class FedAvgParams:
    """FedAvg's knobs; FedProx and the compressed baselines extend them."""

    weighted: bool = spec(True, help=WEIGHTED_HELP)
    base: str | None = spec(None, help=BASE_HELP)

    def validate(self, cfg: Any) -> None:
        self.base = check_base(self.base, cfg.model if cfg is not None else None)


@register_method
class FedAvg(Algorithm):
    """Local SGD on every sampled client, sample-weighted mean of the updates."""

    name = "fedavg"
    Params = FedAvgParams
    capabilities = frozenset({"dp", "dp_sgd", "transforms", "linear", "client_state",
                              "server_optimizer", "vectorizable", "robust", "attack",
                              "multilabel", "before_after", "finetune"})
    server_optimizer = "sgd"

    @classmethod
    def check(cls, cfg: Any) -> None:
        super().check(cfg)
        if not cfg.local.momentum:
            from fedray.core.config import check_unread

            check_unread(cfg.local, "local", {"keep_optimizer_state": "plain SGD keeps no "
                                                                      "state between a "
                                                                      "client's rounds"},
                         f"{cls.name} without local.momentum")
        if cfg.local.dp_noise_multiplier is not None:
            shape, classes = cls.input_of(cfg)
            if shape is not None:  # a table read at run time: the executor checks the model
                cls.check_dp_sgd(cfg, shape, classes)

    @classmethod
    def build_data(cls, cfg: Any, dataset: Any = None) -> Any:
        """The default client data, with the clients' local test splits cut to samples
        ``algorithm.base`` was not pretrained on."""
        from fedray.models.pretrain import unseen_local_tests

        return unseen_local_tests(cfg.algorithm.get("base"), cfg,
                                  super().build_data(cfg, dataset))

    @classmethod
    def check_data(cls, cfg: Any, data: Any) -> None:
        """``algorithm.base`` holds this run's model on this data and has not seen any
        sample this run tests on."""
        from fedray.models.pretrain import check_base_split, check_base_state

        check_base_state(cfg.algorithm.get("base"), cfg, data)
        check_base_split(cfg.algorithm.get("base"), cfg, data)

    @classmethod
    def check_dp_sgd(cls, cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> None:
        """Local DP-SGD needs a model Opacus can wrap (no BatchNorm) and no kept optimizer
        state (its optimizer is Opacus' own, rebuilt every round)."""
        from fedray.models import build_model
        from fedray.models.training import opacus_problems

        loc = cfg.local
        if loc.keep_optimizer_state:
            raise ConfigError("local.keep_optimizer_state", True,
                              "false with local DP-SGD (local.dp_noise_multiplier)")
        kwargs = {k: v for k, v in cfg.model.items() if k != "name"}
        problems = opacus_problems(build_model(cfg.model["name"], tuple(input_shape),
                                               num_classes, **kwargs))
        if problems:
            raise ConfigError("model.name", cfg.model["name"],
                              f"a model Opacus can wrap for local DP-SGD ({problems[0]})")

    def dp_sgd(self) -> Any:
        """Local DP-SGD settings (``local.dp_*``), or None when off."""
        from fedray.models.training import DPSGD

        loc = self.cfg.local
        if loc.dp_noise_multiplier is None:
            return None
        return DPSGD(loc.dp_noise_multiplier, loc.dp_max_grad_norm, loc.dp_delta)

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return self.cfg.local.keep_optimizer_state and self.cfg.local.momentum > 0

    @property
    def base(self) -> str | None:
        return getattr(self.params, "base", None)

    def build_resident(self, input_shape, num_classes, device):
        from fedray.models import build_model

        kwargs = {k: v for k, v in self.cfg.model.items() if k != "name"}
        model = build_model(self.cfg.model["name"], tuple(input_shape), num_classes, **kwargs)
        if self.base:
            apply_base(model, self.base, self.cfg.model)
        return model.to(device)

    def base_bytes(self) -> int:
        """Bytes of the pretrained base each client downloads once (0 without a base)."""
        from fedray.models.pretrain import load_base

        return Payload.encode(load_base(self.base)[0]).nbytes if self.base else 0

    def trainable(self, model: Any) -> list[str]:
        """Names of the parameters clients train and upload."""
        return [n for n, q in model.named_parameters() if q.requires_grad]

    def init_global_state(self, resident, seed):

        from fedray.core.seeding import torch_seeded
        from fedray.models.training import get_state

        if self.base:
            return get_state(resident)
        # drawn on the CPU from the seed alone: the same start on any device (every module of
        # the registry's models resets all its parameters and buffers)
        model = copy.deepcopy(resident).to_empty(device="cpu")
        with torch_seeded(seed, -1, -1, "model-init"):
            for m in model.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        return get_state(model)

    def grad_hook(self, model: Any, broadcast: State, device: str) -> Any:
        """A per-step gradient edit (``None``: plain SGD). FedProx overrides it."""
        return None

    def client_update(self, ctx: ClientContext, broadcast: State) -> ClientOutput:
        from fedray.models.training import evaluate, get_state, set_state, train_local

        model, loc = ctx.resident, self.cfg.local
        set_state(model, broadcast)
        metrics: dict[str, float] = {}
        if self.cfg.eval.local_before_after:
            metrics["acc_before"] = evaluate(model, ctx.x_test, ctx.y_test, ctx.device)["accuracy"]
        opt_state = (ctx.state or {}).get("optimizer") if self.uses_client_state else None
        train_metrics, opt_state = train_local(
            model, ctx.x_train, ctx.y_train, epochs=loc.epochs, batch_size=loc.batch_size,
            lr=loc.lr, momentum=loc.momentum, weight_decay=loc.weight_decay, seed=ctx.seed,
            round=ctx.round, client=ctx.client_id, max_steps=loc.max_steps, device=ctx.device,
            grad_hook=self.grad_hook(model, broadcast, ctx.device), optimizer_state=opt_state,
            bf16=loc.bf16, dp_sgd=self.dp_sgd())
        metrics.update(train_metrics)
        if self.cfg.eval.local_before_after:
            metrics["acc_after"] = evaluate(model, ctx.x_test, ctx.y_test, ctx.device)["accuracy"]
        local = get_state(model)
        delta = {k: local[k] - np.asarray(broadcast[k], dtype=np.float32)
                 for k in self.trainable(model)}
        state = {"optimizer": opt_state} if self.uses_client_state else None
        return ClientOutput(delta, len(ctx.x_train), metrics, state)

    @classmethod
    def cohort_fit(cls, cfg: Any, input_shape: tuple[int, ...] | None,
                   num_classes: int | None) -> CohortFit:
        """The configured model, built on the CPU: whether it trains as a cohort
        (:func:`fedray.models.cohort.cohort_problems`), one step's multiply-adds
        (trainable parameters × batch size; infinite — never chosen by ``auto`` — for a
        model with convolutions or recurrent cells, :func:`~fedray.models.cohort.
        dense_only`) and each client's bytes in a cohort (fp32 parameters, gradients,
        momentum and a proximal temporary, plus its batch's saved activations forward and
        backward)."""
        if input_shape is None:  # a table read at run time: checked with its shape then
            return CohortFit([])
        from fedray.models import build_model
        from fedray.models.cohort import activation_numel, cohort_problems, dense_only

        kwargs = {k: v for k, v in cfg.model.items() if k != "name"}
        model = build_model(cfg.model["name"], tuple(input_shape), num_classes, **kwargs)
        problems = [f"model {cfg.model['name']}: {why}" for why in cohort_problems(
            model, input_shape, num_classes, probe=cfg.runtime.vectorize == "on")]
        if problems:
            return CohortFit(problems)
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        batch = cfg.local.batch_size
        work = float(params * batch) if dense_only(model) else math.inf
        if cfg.runtime.vectorize == "auto" and work > AUTO_WORK:
            return CohortFit(problems, work)  # auto says no: no memory to size
        copies = 3 + (cfg.local.momentum > 0)
        acts = 2 * batch * activation_numel(model, input_shape)
        return CohortFit(problems, work, 4 * (copies * params + acts))

    def cohort_update(self, contexts: list[ClientContext], broadcast: State
                      ) -> list[ClientOutput]:
        """:meth:`client_update` of each context, the local SGD of all of them as one
        batched computation (:func:`fedray.models.cohort.train_cohort_stacked`); the
        updates Δ_i = θ_i − θ are taken on the stack at once, each client's upload its row
        (:class:`~fedray.methods.base.StackRow`)."""
        from fedray.models.cohort import train_cohort_stacked
        from fedray.models.training import evaluate, set_state

        first, model, loc = contexts[0], contexts[0].resident, self.cfg.local
        set_state(model, broadcast)
        compare = self.cfg.eval.local_before_after
        before = [evaluate(model, c.x_test, c.y_test, c.device)["accuracy"] for c in contexts] \
            if compare else []
        states = [(c.state or {}).get("optimizer") for c in contexts] \
            if self.uses_client_state else None
        trained = train_cohort_stacked(
            model, [(c.x_train, c.y_train) for c in contexts], [c.client_id for c in contexts],
            epochs=loc.epochs, batch_size=loc.batch_size, lr=loc.lr, momentum=loc.momentum,
            weight_decay=loc.weight_decay, seed=first.seed, round=first.round,
            max_steps=loc.max_steps, device=first.device,
            grad_hook=self.grad_hook(model, broadcast, first.device), optimizer_states=states)
        out, names = [], self.trainable(model)
        deltas = {k: trained.params[k] - np.asarray(broadcast[k], dtype=np.float32)
                  for k in names}
        for i, ctx in enumerate(contexts):
            metrics = ({"acc_before": before[i]} if compare else {}) | trained.metrics[i]
            if compare:
                set_state(model, {**broadcast, **trained.client(i).params})
                metrics["acc_after"] = evaluate(model, ctx.x_test, ctx.y_test,
                                                ctx.device)["accuracy"]
            state = {"optimizer": trained.optimizer_states[i]} if self.uses_client_state \
                else None
            out.append(ClientOutput(StackRow(deltas, i), len(ctx.x_train), metrics, state))
        return out

    def evaluate(self, resident, broadcast, x, y, device="cpu"):
        from fedray.models.training import evaluate, set_state

        set_state(resident, broadcast)
        return evaluate(resident, x, y, device)

    def finetune_evaluate(self, ctx, broadcast, epochs):
        from fedray.models.training import evaluate, set_state, train_local

        loc = self.cfg.local
        set_state(ctx.resident, broadcast)
        train_local(ctx.resident, ctx.x_train, ctx.y_train, epochs=epochs,
                    batch_size=loc.batch_size, lr=loc.lr, momentum=loc.momentum,
                    weight_decay=loc.weight_decay, seed=ctx.seed, round=ctx.round,
                    client=ctx.client_id, device=ctx.device, bf16=loc.bf16, purpose="finetune")
        return evaluate(ctx.resident, ctx.x_test, ctx.y_test, ctx.device)

    def make_policy(self) -> AggregationPolicy:
        from fedray.methods.robust import robust_rule

        return FedAvgPolicy(self.make_optimizer(), self.params.weighted, robust_rule(self.cfg))
