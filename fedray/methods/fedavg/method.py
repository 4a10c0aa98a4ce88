"""FedAvg (McMahan et al., 2017), client side: local SGD from the broadcast model, upload
the update Δ_i = θ_i − θ_t (not θ_i, so codecs quantize small deltas). The server side is
:class:`fedray.methods.fedavg.policy.FedAvgPolicy`. FedProx and ORDERS reuse this client."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

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
    State,
)
from fedray.methods.engine import Correction, LocalEngine, Objective
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


def check_init(cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> None:
    """The configured model's start θ₀ is whole (:mod:`fedray.models.init`): every
    parameter written by an initialiser, every buffer none writes the same whatever torch's
    generator held; a :class:`ConfigError` at ``model.name`` naming the tensor, before
    Ray."""
    from fedray.models import build_configured
    from fedray.models.init import UnwrittenTensor, check_initial_state

    try:
        check_initial_state(lambda: build_configured(cfg.model, input_shape, num_classes),
                            cfg.seed)
    except UnwrittenTensor as e:
        raise ConfigError("model.name", cfg.model["name"], f"a model whose start every "
                                                          f"initialiser writes: {e}") from None


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
    # what a method's hooks add per client of a cohort, for its memory check: tensors the
    # size of the trainable parameters (client_tensors), and forward passes (objective)
    cohort_copies: ClassVar[int] = 0
    cohort_forwards: ClassVar[int] = 0

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
        if cfg.algorithm.get("base") is None and data.input_shape is not None:
            check_init(cfg, data.input_shape, data.num_classes)

    @classmethod
    def check_dp_sgd(cls, cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> None:
        """Local DP-SGD needs a model Opacus can wrap (no BatchNorm) and no kept optimizer
        state (its optimizer is Opacus' own, rebuilt every round)."""
        from fedray.models import build_configured
        from fedray.models.training import opacus_problems

        loc = cfg.local
        if loc.keep_optimizer_state:
            raise ConfigError("local.keep_optimizer_state", True,
                              "false with local DP-SGD (local.dp_noise_multiplier)")
        problems = opacus_problems(build_configured(cfg.model, input_shape, num_classes))
        if problems:
            raise ConfigError("model.name", cfg.model["name"],
                              f"a model Opacus can wrap for local DP-SGD ({problems[0]})")

    @functools.cached_property
    def engine(self) -> LocalEngine:
        """The local-training engine every client of this run trains with."""
        return LocalEngine.of(self.cfg)

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        return self.engine.keeps_optimizer

    @property
    def base(self) -> str | None:
        return getattr(self.params, "base", None)

    def build_resident(self, input_shape, num_classes, device):
        from fedray.models import build_configured

        model = build_configured(self.cfg.model, input_shape, num_classes)
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
        from fedray.models.init import initial_state
        from fedray.models.training import get_state

        return get_state(resident) if self.base else initial_state(resident, seed)

    # the local-training engine's hooks (fedray.methods.engine): written once, run one
    # client at a time or as a cohort

    def client_tensors(self, ctx: ClientContext, broadcast: State) -> State | None:
        """The client's own tensors :meth:`correction` reads, one per trainable parameter
        by name (None: none). FedDyn's ∇L_k(θ_k^{t−1}) from its kept state."""
        return None

    def correction(self, model: Any, broadcast: State, device: str) -> Correction | None:
        """A per-step gradient edit ``fix(params, own)`` that writes each trainable
        parameter's ``p.grad`` in place (``own``: :meth:`client_tensors` as tensors, in the
        same order; in a cohort both carry a leading client axis), or None: plain SGD.
        FedProx adds μ(θ − θ_t) here."""
        return None

    def upload(self, broadcast: State, trained: State, own: State | None,
               steps: np.ndarray) -> State:
        """What the clients send, stacked along a leading client axis (a client trained
        alone is a stack of one): from their trained parameters (by name), their own
        tensors (:meth:`client_tensors`, stacked) and the local steps K_i each took (an int
        array). Here the update Δ_i = θ_i − θ_t (not θ_i, so codecs quantize small
        deltas)."""
        return {k: v - np.asarray(broadcast[k], dtype=np.float32) for k, v in trained.items()}

    def objective(self, model: Any, broadcast: State, device: str) -> Objective | None:
        """An extra term of the local loss, ``term(z, features_of, x, own)`` → one value
        per row of the batch (the engine adds its mean over the client's rows), or None:
        the task's loss alone. ``z`` is the trained model's representation of ``x`` (its
        classifier's input), ``features_of(params, x)`` the representation under other
        parameters by name, ``own`` as in :meth:`correction`. MOON's contrastive term."""
        return None

    def finish(self, ctx: ClientContext, out: ClientOutput, broadcast: State,
               trained: State) -> ClientOutput:
        """The client's output completed from its trained parameters (by name): extra
        metrics or upload entries, and the state it keeps (``out.state`` holds the
        engine's optimizer state, when kept)."""
        return out

    def client_update(self, ctx: ClientContext, broadcast: State) -> ClientOutput:
        return self.engine.run(self, [ctx], broadcast, cohort=False)[0]

    @classmethod
    def cohort_fit(cls, cfg: Any, input_shape: tuple[int, ...] | None,
                   num_classes: int | None) -> CohortFit:
        """The configured model, built on the CPU: whether it trains as a cohort
        (:func:`fedray.models.cohort.cohort_problems`), one step's multiply-adds
        (trainable parameters × batch size; infinite — never chosen by ``auto`` — for a
        model with convolutions or recurrent cells, :func:`~fedray.models.cohort.
        dense_only`) and each client's bytes in a cohort (fp32 parameters, gradients,
        momentum and a proximal temporary, plus its batch's saved activations forward and
        backward; and a method's own per-client tensors, :attr:`cohort_copies`, and extra
        forward passes, :attr:`cohort_forwards`)."""
        if input_shape is None:  # a table read at run time: checked with its shape then
            return CohortFit([])
        from fedray.models import build_configured
        from fedray.models.cohort import activation_numel, cohort_problems, dense_only

        model = build_configured(cfg.model, input_shape, num_classes)
        problems = [f"model {cfg.model['name']}: {why}" for why in cohort_problems(
            model, input_shape, num_classes, probe=cfg.runtime.vectorize == "on")]
        if problems:
            return CohortFit(problems)
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        batch = cfg.local.batch_size
        work = float(params * batch) if dense_only(model) else math.inf
        if cfg.runtime.vectorize == "auto" and work > AUTO_WORK:
            return CohortFit(problems, work)  # auto says no: no memory to size
        copies = 3 + (cfg.local.momentum > 0) + cls.cohort_copies
        acts = (2 + cls.cohort_forwards) * batch * activation_numel(model, input_shape)
        return CohortFit(problems, work, 4 * (copies * params + acts))

    def cohort_update(self, contexts: list[ClientContext], broadcast: State
                      ) -> list[ClientOutput]:
        """The same hooks as :meth:`client_update`, the cohort trained as one batched
        computation (:meth:`fedray.methods.engine.LocalEngine.run`)."""
        return self.engine.run(self, contexts, broadcast, cohort=True)

    def evaluate(self, resident, broadcast, x, y, device="cpu"):
        from fedray.models.training import evaluate, set_state

        set_state(resident, broadcast)
        return evaluate(resident, x, y, device)

    def finetune_evaluate(self, ctx, broadcast, epochs):
        return self.engine.finetune(ctx, broadcast, epochs)

    def make_policy(self) -> AggregationPolicy:
        from fedray.methods.robust import robust_rule

        return FedAvgPolicy(self.make_optimizer(), self.params.weighted, robust_rule(self.cfg))
