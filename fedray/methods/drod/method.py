"""Capacity-heterogeneous FL with nested sub-models: DROD and the baselines it is compared to.

Every method here is a reduction ``axis`` crossed with an aggregation ``rule`` (DROD §4):

==================  ==========  =======  =============================================
name                axis        rule     what a tier trains
==================  ==========  =======  =============================================
``drod``            dual        od       (s, b) on the θ curve, resampled per step
``fjord``           width       od       width p (= s, b = 1) resampled per step
``heterofl``        width       static   its fixed leading-channel sub-model
``fedrolex``        width       rolling  a channel window rolled by one per round
``shortcut_fjord``  shortcut    od       identity blocks (deepest first), resampled
``depth_fedavg``    depth       static   its leading blocks + its stage's exit head
``depth_fjord``     depth       od       a depth (with its exit head), resampled
``shortcut_fedavg`` shortcut    static   its fixed identity blocks (no resampling)
``fiarse``          width       fiarse   its structural cut, magnitude-masked (below)
``scalefl``         scalefl     static   width and depth at one ratio, every exit trained
==================  ==========  =======  =============================================

Any ``od`` arm takes ``kd: true`` (FjORD's self-distillation, "w/ KD" in DROD's tables): each
step also trains the tier's own largest sub-model on the labels and distils its softened
outputs into the sampled one, ``(1 − α) CE(z_p, y) + α T² KL(σ(z_max/T) ‖ σ(z_p/T)) +
CE(z_max, y)`` (Horvath et al. 2021, §3.3; α = ``kd_alpha``, T = ``kd_temperature`` — the DROD
paper gives neither, ours are documented defaults); no extra term when the sampled sub-model
is the tier's own.

``fiarse`` (Wu et al. 2024, importance-aware sub-model extraction) crosses any structural axis
with a magnitude mask: the structure is solved at ρ^(1 − share) of the parameters
(``fiarse_share``; at ρ itself under ``match: flops``, since a mask removes no multiply), then
each conv/linear weight of the sub-model keeps its largest-magnitude entries so the whole
sub-model holds ρ of the full model's parameters (under ``flops`` the mask keeps ρ^share of
them). The mask is recomputed every round from the current global weights — a weight that
grows past the threshold joins the sub-model — so importance follows training; masked entries
are zero in the client's model and never updated; only the kept values travel up, and the
server averages each entry over the clients whose mask held it. Layer-wise top-k (FIARSE also
has a model-wise variant) keeps every layer alive at the smallest tier.

``scalefl`` (Ilhan et al. 2023): the ``scalefl`` ladder axis cuts width and depth at one ratio,
every tier's sub-model carries the exit heads of the shallower tiers' depths, and the local
loss is the sum over exits of ``(1 − α) CE + α T² KL(σ(z_final/T) ‖ σ(z_exit/T))`` with the
sub-model's final exit as the teacher (plain CE for the final exit) — ScaleFL's
self-distillation. Exit heads are one per stage (DepthFL's), so two cuts inside one stage
share its head, and the smallest tier, having no shallower exit, trains its final one alone.
The fleet clock charges every arm its budget ρ per sample; the extra forward/backward of
``kd`` and the dense FLOPs of a FIARSE mask are not charged.

A tier is a budget ρ (``runtime.tiers[].capacity``) solved into a sub-model on the shared
ladder (:mod:`fedray.methods.drod.ladder`). The server sends each tier only its sub-model and
averages every coordinate over the clients that hold it
(:class:`fedray.methods.drod.slice_mean.SliceMeanPolicy`). Under ``od`` (Ordered Dropout), at
every local step a client samples uniformly one of the ladder's sub-models its own contains
(s ≤ s_own, s·b ≤ s_own·b_own), from (seed, round, client, step).

With ``continual.tasks`` the client also runs the configured continual-learning objective
(:mod:`fedray.methods.drod.continual.objectives`); its replay buffer, Fisher and
anchor/teacher live in the client state store. Choices where the papers leave the federated
case open: EWC's anchor θ* and BiC's teacher are the global model that finished the previous
task (the client's first broadcast of the new task); EWC's Fisher is estimated at a task's
last round on the broadcast weights with the task's data; BiC's two-parameter stage runs
once per task after its last round on a class-balanced split (held-out new-class samples,
old-class exemplars); DER++ stores the logits of the sub-model sampled at that step.
Evaluation scores each tier's own sub-model, per task.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core.config import dataset_shape
from fedray.core.registry import register_method
from fedray.core.spec import ConfigError, spec
from fedray.methods.base import (
    WEIGHTED_HELP,
    Algorithm,
    ClientContext,
    ClientOutput,
    CohortFit,
    ReportSection,
    State,
)
from fedray.methods.drod.selection import fiarse_masks, od_choices
from fedray.models.geometry import RESNET_BLOCKS

SLICEABLE = ("sliceable_resnet18", "sliceable_resnet34")


@dataclass
class HeteroParams:
    axis: Literal["dual", "width", "shortcut", "depth", "scalefl"] = spec(
        "dual", help="what a smaller tier cuts: dual (DROD's s and b), width, shortcut "
                     "(identity blocks), depth, scalefl (width and depth at one ratio, "
                     "ScaleFL)")
    rule: Literal["od", "static", "rolling", "fiarse"] = spec(
        "od", help="od: Ordered Dropout (sample a nested sub-model every step, FjORD); "
                   "static: the tier's fixed sub-model (HeteroFL); rolling: FedRolex; "
                   "fiarse: the structural cut plus a magnitude mask recomputed every round "
                   "(FIARSE)")
    theta: float = spec(0.5, ge=0, le=1, help="DROD's split θ: s = ρ^((1−θ)/2), b = ρ^θ")
    match: Literal["params", "flops"] = spec("params", help="budget ρ counts parameters or "
                                                            "inference FLOPs")
    grid: list[float] | None = spec(None, help="budgets Ordered Dropout samples from "
                                               "(default: the tiers' budgets)")
    kd: bool = spec(False, help="FjORD's self-distillation (rule od): also train the tier's "
                                "largest sub-model each step and distil it into the sampled one")
    kd_alpha: float = spec(0.5, ge=0, le=1, help="weight α of the distillation term (kd, "
                                                 "ScaleFL's exits)")
    kd_temperature: float = spec(1.0, gt=0, help="softmax temperature T of the distillation")
    fiarse_share: float = spec(0.5, ge=0, lt=1, help="rule fiarse: the share of the budget "
                                                     "the magnitude mask takes (structure at "
                                                     "ρ^(1−share) of the parameters)")
    weighted: bool = spec(True, help=WEIGHTED_HELP)
    augment: bool = spec(False, help="random crop (pad 4) + horizontal flip of images")

    def validate(self, cfg: Any) -> None:
        if cfg is None:
            return
        if cfg.model.get("name") not in SLICEABLE:
            raise ConfigError("model.name", cfg.model.get("name"), f"one of {SLICEABLE} "
                                                                   f"(nested sub-models)")
        if self.axis in ("depth", "scalefl") and not cfg.model.get("exits"):
            raise ConfigError("model.exits", cfg.model.get("exits", False),
                              f"true for the {self.axis} axis (a cut model ends in an exit "
                              f"head)")
        if self.rule == "rolling" and self.axis != "width":
            raise ConfigError("algorithm.rule", self.rule, "rolling only on the width axis")
        if self.axis == "scalefl" and self.rule != "static":
            raise ConfigError("algorithm.rule", self.rule, "static on the scalefl axis "
                                                           "(ScaleFL fixes each tier's split)")
        if self.kd and self.rule != "od":
            raise ConfigError("algorithm.kd", self.kd, "false unless algorithm.rule is od "
                                                       "(self-distillation of the sampled "
                                                       "sub-model)")
        for i, r in enumerate(self.grid or []):
            if not 0 < r <= 1:
                raise ConfigError(f"algorithm.grid[{i}]", r, "a budget in (0, 1]")
        try:
            tier_ladder(cfg, self)
        except ValueError as e:
            raise ConfigError("runtime.tiers", [t.capacity for t in cfg.runtime.tiers],
                              f"budgets the {self.axis} axis can nest ({e})") from e


def arch_of(cfg: Any, input_shape: tuple[int, ...], num_classes: int):
    from fedray.models.geometry import arch_for

    kw = {k: v for k, v in cfg.model.items() if k != "name"}
    blocks = RESNET_BLOCKS[cfg.model["name"].removeprefix("sliceable_")]
    return arch_for(tuple(input_shape), num_classes, blocks, kw.get("width", 64),
                    kw.get("groups", 8), kw.get("exits", False), cfg.model["name"])


def data_shape(cfg: Any) -> tuple[tuple[int, ...], int]:
    """Input shape and class count of the configured image dataset, without loading it."""
    shape, classes = dataset_shape(cfg.data)
    if len(shape) != 3:
        raise ConfigError("data.dataset", cfg.data.dataset, "an image dataset (digits, "
                                                            "cifar10, cifar100) for the "
                                                            "sliceable ResNet")
    return shape, classes


@functools.lru_cache(maxsize=64)
def _ladder(arch, hw, budgets, axis, theta, match):
    from fedray.methods.drod.ladder import solve_ladder

    return {r.budget: r for r in solve_ladder(arch, hw, budgets, axis, theta, match)}


def structure_budget(rho: float, params: HeteroParams) -> float:
    """The budget the structural cut is solved at: ρ, or ρ^(1 − share) under FIARSE's
    parameter ladder (the magnitude mask spends the rest)."""
    if params.rule == "fiarse" and params.match == "params" and rho < 1:
        return float(rho ** (1 - params.fiarse_share))
    return float(rho)


@dataclass(frozen=True)
class Ladder:
    """The configured tiers solved once into sub-models of one network: each tier's rung,
    the grid of nested rungs (Ordered Dropout's choices), the exit depths each tier's
    sub-model carries, and FIARSE's keep fraction per tier (empty for other rules; counted
    from the built sub-models, so only when asked: a config check stays torch-free)."""

    arch: Any
    hw: tuple[int, int]
    tiers: dict[str, Any]
    grid: list
    depths: dict[str, tuple[int, ...]]
    capacity: dict[str, float]  # each tier's budget ρ (runtime.tiers[].capacity)
    params: Any

    @functools.cached_property
    def keep(self) -> dict[str, float]:
        if self.params.rule != "fiarse":
            return {}
        return {t: fiarse_keep(self.arch, self.hw, r, self.capacity[t], self.params)
                for t, r in self.tiers.items()}

    def param_ratio(self, tier: str) -> float:
        """The share of the full model's parameters the tier's sub-model holds (a FIARSE
        mask keeps ``keep`` of its conv/linear weights)."""
        from fedray.models.sliceable import held_count

        g = self.tiers[tier].geometry
        total = held_count(self.arch, self.hw, g)
        cut = (1.0 - self.keep.get(tier, 1.0)) * held_count(self.arch, self.hw, g, min_ndim=2)
        return (total - cut) / held_count(self.arch, self.hw)


def tier_ladder(cfg: Any, params: HeteroParams, shape=None) -> Ladder:
    """The :class:`Ladder` of the configured tiers (capacities read once, here)."""
    input_shape, classes = shape or data_shape(cfg)
    arch, hw = arch_of(cfg, input_shape, classes)
    rho = {t.name: float(t.capacity) for t in cfg.runtime.tiers}
    caps = {name: structure_budget(r, params) for name, r in rho.items()}
    budgets = sorted(set(caps.values()) | set(params.grid or []), reverse=True)
    rungs = _ladder(arch, hw, tuple(budgets), params.axis, float(params.theta), params.match)
    tiers = {name: rungs[cap] for name, cap in caps.items()}
    grid = [rungs[float(b)] for b in sorted(params.grid or set(caps.values()))]
    depths = {t: exit_depths(arch, r.geometry, grid, params) for t, r in tiers.items()}
    return Ladder(arch, hw, tiers, grid, depths, rho, params)


def exit_depths(arch: Any, own: Any, grid: list, params: HeteroParams) -> tuple[int, ...]:
    """The shallower depths whose exit heads a tier's sub-model ``own`` carries: the depths
    Ordered Dropout may sample (``od``) or ScaleFL's early exits; none otherwise."""
    if not arch.exits or not (params.rule == "od" or params.axis == "scalefl"):
        return ()
    return tuple(sorted({r.geometry.depth for r in grid if r.geometry.within(own)
                         and r.geometry.depth < own.depth}))


def fiarse_keep(arch: Any, hw: tuple[int, int], rung: Any, rho: float,
                params: HeteroParams) -> float:
    """The fraction of the structural sub-model's conv/linear weights FIARSE's mask keeps so
    the sub-model holds ρ of the full model's parameters (ρ^share under ``match: flops``)."""
    from fedray.models.sliceable import held_count

    if rho >= 1:
        return 1.0
    if params.match == "flops":
        return float(rho ** params.fiarse_share)
    total = held_count(arch, hw, rung.geometry)
    maskable = held_count(arch, hw, rung.geometry, min_ndim=2)
    full = held_count(arch, hw)
    return float(np.clip((rho * full - (total - maskable)) / maskable, 1e-6, 1.0))


def masked_param_ratio(model: Any, masks: dict[str, np.ndarray]) -> float:
    """FIARSE: the share of the full model's parameters the masked sub-model holds."""
    from fedray.models.sliceable import held_count

    kept = sum(int(m.sum()) - m.size for m in masks.values())
    return (sum(p.numel() for p in model.parameters()) + kept) / held_count(model.arch,
                                                                            model.input_hw)


class Resident:
    """What an executor keeps: one built model per sub-model geometry it has run."""

    def __init__(self, cfg, params, input_shape, num_classes, device):
        self.ladder = tier_ladder(cfg, params, (tuple(input_shape), num_classes))
        self.arch, self.hw = self.ladder.arch, self.ladder.hw
        self.tiers, self.grid = self.ladder.tiers, self.ladder.grid
        self.depths, self.keep = self.ladder.depths, self.ladder.keep
        self.device = device
        self.models: dict = {}

    def model(self, geometry, all_heads: bool = False, depths: tuple[int, ...] = ()):
        from fedray.models.sliceable import SliceableResNet

        key = (geometry, all_heads, depths)
        if key not in self.models:
            self.models[key] = SliceableResNet(self.arch, self.hw, geometry,
                                               all_heads, depths).to(self.device)
        return self.models[key]

    def tier_of_state(self, state: State) -> str:
        """The tier whose sub-model has exactly these tensors: the same names (no more, no
        fewer) with the same shapes. A subset test is not enough — a smaller tier's held set
        can be a same-shaped subset of a larger one's (identity blocks on the shortcut axis,
        a depth cut within the last stage, s = 1), so the full model would read as the
        smaller tier. ``state`` holds network tensors only (callers strip ``bic.*``)."""
        from fedray.models.sliceable import held

        shapes = {k: tuple(np.shape(v)) for k, v in state.items()}
        for tier, rung in self.tiers.items():
            if shapes == dict(held(self.arch, self.hw, rung.geometry, self.depths[tier])):
                return tier
        raise ValueError("the broadcast matches no tier's sub-model")


@register_method
class Hetero(Algorithm):
    """Any reduction axis crossed with any aggregation rule (``algorithm.axis``/``rule``);
    the named methods below fix both."""

    name = "hetero"
    Params = HeteroParams
    capabilities = frozenset({"continual", "client_state", "vectorizable"})
    unread_local = {"keep_optimizer_state": "its SGD's momentum starts at zero each round"}

    def compute_cost(self, tier: Any) -> float:
        """The tier's budget ρ (its sub-model's share of the full model's parameters or
        FLOPs, ``algorithm.match``): the fleet clock's compute cost per sample."""
        return float(tier.capacity)

    @classmethod
    def build_data(cls, cfg: Any, dataset: Any = None) -> Any:
        """With ``continual.tasks``: the class-incremental task stream; else the static
        split."""
        if cfg.continual.tasks:
            from fedray.methods.drod.continual.data import build_continual

            return build_continual(cfg, dataset)
        return super().build_data(cfg, dataset)

    @classmethod
    def summarize(cls, cfg: Any, run_dir: str) -> dict[str, Any]:
        """ACC and forgetting per tier and for the fleet (continual runs)."""
        cl = cfg.continual
        if not cl.tasks:
            return {}
        from fedray.methods.drod.continual.metrics import summarize
        from fedray.observe.metrics import read_metrics

        return {"continual": summarize(read_metrics(run_dir).to_pylist(),
                                       [t.name for t in cfg.runtime.tiers], cl.tasks,
                                       cl.rounds_per_task)}

    @classmethod
    def report_sections(cls, run: dict[str, Any], out_dir: str) -> list[ReportSection]:
        """The accuracy matrices (class-IL and task-IL) and ACC / forgetting per tier."""
        from fedray.methods.drod.continual import diagnostics

        stream = diagnostics.setting(run["config"])
        if stream is None:
            return []
        rows = run["rounds"].to_dict("records")
        data = diagnostics.summary(rows, stream)
        cols = list(data["fleet"])
        text = "| tier | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n" + \
            "".join(f"| {tier} | " + " | ".join(f"{v:.4f}" for v in vals.values()) + " |\n"
                    for tier, vals in data.items())
        return [ReportSection("continual", "Continual learning (fleet = unweighted mean over "
                                           "tiers)", text,
                              diagnostics.plots(rows, stream, out_dir, run["label"]), data)]

    @property
    def uses_client_state(self) -> bool:  # type: ignore[override]
        cl = self.cfg.continual
        return bool(cl.tasks) and cl.method != "none"

    def build_resident(self, input_shape, num_classes, device):
        return Resident(self.cfg, self.params, input_shape, num_classes, device)

    def init_global_state(self, resident, seed):

        from fedray.core.seeding import torch_seeded
        from fedray.models.training import get_state

        with torch_seeded(seed, -1, -1, "model-init"):
            from fedray.models.sliceable import SliceableResNet

            model = SliceableResNet(resident.arch, resident.hw, resident.arch.full(), True)
        state = get_state(model)
        if self.cfg.continual.tasks and self.cfg.continual.method == "bic":
            state["bic.scale"] = np.ones(resident.arch.num_classes, np.float32)
            state["bic.shift"] = np.zeros(resident.arch.num_classes, np.float32)
        return state

    def make_policy(self):
        from fedray.methods.drod.slice_mean import FiarsePolicy, SliceMeanPolicy
        from fedray.models.sliceable import held

        p = self.params
        lad = tier_ladder(self.cfg, p)
        shapes = {t: held(lad.arch, lad.hw, r.geometry, lad.depths[t])
                  for t, r in lad.tiers.items()}
        args = (lad.arch, lad.hw, {t: r.geometry for t, r in lad.tiers.items()},
                self.cfg.tier_of, "rolling" if p.rule == "rolling" else "prefix", p.weighted,
                shapes)
        if p.rule == "fiarse":
            return FiarsePolicy(*args, keep=lad.keep)
        return SliceMeanPolicy(*args)

    # ------------------------------------------------------------------ client

    def _tasks(self, num_classes: int):
        from fedray.methods.drod.continual.data import task_classes

        cl = self.cfg.continual
        return task_classes(num_classes, cl.tasks, cl.class_order) if cl.tasks else None

    def client_update(self, ctx: ClientContext, broadcast: State) -> ClientOutput:
        from fedray.models.training import get_state

        model, grid, depths, masks = self._setup(ctx, broadcast)
        metrics, state, bic = self._train(ctx, model, grid, broadcast, dict(ctx.state or {}),
                                          depths, masks)
        return self._output(ctx, get_state(model), broadcast, masks, bic, metrics, state)

    @classmethod
    def cohort_fit(cls, cfg: Any, input_shape: tuple[int, ...] | None,
                   num_classes: int | None) -> CohortFit:
        """A tier's clients train as one cohort (:mod:`fedray.methods.drod.cohort`) unless
        the continual objective replays from per-client buffers. ``auto`` never takes them
        (work is infinite): the sliceable ResNet is convolutional, and batched (grouped)
        convolutions measured slower than one client after another on a CPU
        (``benchmarks/cohorts.py``, workload ``drod``). Each client's bytes: the full
        model's parameters, gradients and momentum plus its batch's activations forward and
        backward (the full geometry bounds every tier's); under EWC also its stacked Fisher
        and anchor."""
        from fedray.methods.drod.cohort import cohort_refusal

        why = cohort_refusal(cfg)
        if why or input_shape is None or cfg.runtime.vectorize == "auto":
            return CohortFit([why] if why else [], math.inf)  # auto: nothing to size
        from fedray.models.cohort import activation_numel
        from fedray.models.sliceable import SliceableResNet

        arch, hw = arch_of(cfg, input_shape, num_classes)
        model = SliceableResNet(arch, hw)
        params = sum(p.numel() for p in model.parameters())
        acts = 2 * cfg.local.batch_size * activation_numel(model, input_shape)
        # stacked parameters, momentum, the vmapped gradients and a rung's gathered copy
        copies = 4 + 2 * (bool(cfg.continual.tasks) and cfg.continual.method == "ewc")
        return CohortFit([], math.inf, 4 * (copies * params + acts))

    def cohort_update(self, contexts: list[ClientContext], broadcast: State
                      ) -> list[ClientOutput]:
        """:meth:`client_update` of each client of one tier, trained as one batched
        computation (:func:`fedray.methods.drod.cohort.train_tier_cohort`)."""
        from fedray.methods.drod.cohort import train_tier_cohort
        from fedray.models.training import get_state

        if len({c.tier for c in contexts}) != 1:
            raise ValueError("a cohort holds the clients of one tier")
        model, grid, depths, masks = self._setup(contexts[0], broadcast)
        net = {k: np.asarray(v).copy() for k, v in broadcast.items() if not k.startswith("bic.")}
        buffers = get_state(model)  # the tensors a cohort does not train (copies, any device)
        trained = train_tier_cohort(self, contexts, model, grid, depths, masks, net)
        return [self._output(ctx, {**buffers, **tr.params}, broadcast, masks, {}, tr.metrics,
                             tr.state) for ctx, tr in zip(contexts, trained, strict=True)]

    def _output(self, ctx: ClientContext, local: State, broadcast: State, masks: dict,
                bic: State, metrics: dict, state: dict) -> ClientOutput:
        """The upload: the trained sub-model minus the broadcast (FIARSE: its kept entries
        only), BiC's tensors minus theirs; the client state where the method keeps one."""
        upload = {k: local[k] - np.asarray(broadcast[k], np.float32) for k in local}
        for k, m in masks.items():  # FIARSE: only the kept entries travel
            upload[k] = upload[k][m]
        for k, v in bic.items():
            upload[k] = v - np.asarray(broadcast[k], np.float32)
        return ClientOutput(upload, len(ctx.x_train), metrics,
                            state if self.uses_client_state else None)

    def _setup(self, ctx: ClientContext, broadcast: State) -> tuple[Any, list, tuple, dict]:
        """The tier's model holding the broadcast sub-model, the rungs a step may sample
        (Ordered Dropout: every ladder rung nested in the tier's; else the tier's own), the
        exit depths its model carries and FIARSE's masks (empty for other rules)."""
        from fedray.models.training import set_state

        res: Resident = ctx.resident
        rung = res.tiers[ctx.tier]
        depths = res.depths[ctx.tier]
        model = res.model(rung.geometry, depths=depths)
        net = {k: v for k, v in broadcast.items() if not k.startswith("bic.")}
        set_state(model, net)
        grid = [r for r in res.grid if r.geometry.within(rung.geometry)] \
            if self.params.rule == "od" else [rung]
        masks = fiarse_masks(net, res.keep[ctx.tier]) if res.keep else {}
        return model, grid, depths, masks

    def _train(self, ctx: ClientContext, model: Any, grid: list, broadcast: State,
               state: dict[str, Any], depths: tuple[int, ...] = (),
               masks: dict[str, np.ndarray] | None = None
               ) -> tuple[dict[str, float], dict[str, Any], dict[str, np.ndarray]]:
        """Local SGD with Ordered Dropout (and its self-distillation), ScaleFL's exits, FIARSE's
        mask and the continual objective (:class:`~fedray.methods.drod.local.LocalObjective`);
        returns (metrics, client state, BiC tensors to upload)."""
        from fedray.methods.drod.continual.data import task_of_round

        cl = self.cfg.continual
        classes = self._tasks(model.arch.num_classes)
        method = cl.method if classes is not None else "none"
        task = task_of_round(ctx.round, cl.rounds_per_task, cl.tasks) if classes else 0
        last = bool(classes) and ctx.round % cl.rounds_per_task == 0
        objective = self._objective(ctx, model, broadcast, state, depths, masks, classes,
                                    method, task, last)
        metrics = self._sgd(ctx, model, grid, objective, masks, task)
        bic = self._bic_stage2(ctx, model, objective, classes, task, last, metrics) \
            if method == "bic" else {}
        if objective.buffer is not None:
            state["buffer"] = objective.buffer.state()
            metrics["buffer_size"] = float(len(objective.buffer))
        return metrics, state, bic

    def _objective(self, ctx: ClientContext, model: Any, broadcast: State,
                   state: dict[str, Any], depths: tuple[int, ...],
                   masks: dict[str, np.ndarray] | None, classes: list | None, method: str,
                   task: int, last: bool) -> Any:
        """The client's :class:`~fedray.methods.drod.local.LocalObjective` this round: its
        continual objective's state (replay buffer, EWC's Fisher and anchor, BiC's frozen
        corrections and teacher), the replay and augmentation generators from (seed, round,
        client)."""
        import torch

        from fedray.core.seeding import rng, torch_generator
        from fedray.methods.drod.continual.buffer import ReservoirBuffer
        from fedray.methods.drod.continual.objectives import continual_state, old_classes
        from fedray.methods.drod.local import LocalObjective
        from fedray.models.training import random_crop_flip as augment

        loc, cl, dev = self.cfg.local, self.cfg.continual, ctx.device
        old = torch.as_tensor(old_classes(classes, task) if classes else [], dtype=torch.long)
        capacity = cl.buffer_total // self.cfg.clients.num_clients
        buffer = ReservoirBuffer(capacity, state.get("buffer")) \
            if method in ("er", "derpp", "bic") else None
        tgen = torch_generator(ctx.seed, ctx.round, ctx.client_id, "augment")
        net = {k: np.asarray(v).copy() for k, v in broadcast.items() if not k.startswith("bic.")}
        fisher, anchor = continual_state(ctx, model, state, net, masks, method, task, last,
                                         cl.ewc_samples, cl.ewc_gamma)
        bic_tensor = lambda k: torch.as_tensor(np.asarray(broadcast.get(k, [])),  # noqa: E731
                                               dtype=torch.float32)
        return LocalObjective(
            method=method, params=self.params, continual=cl, old=old,
            lam=len(old) / (len(old) + len(classes[task])) if classes else 0.0,
            scale=bic_tensor("bic.scale"), shift=bic_tensor("bic.shift"),
            teacher=self._bic_teacher(model, state, depths, dev)
            if method == "bic" and task > 0 else None,
            buffer=buffer, gen=rng(ctx.seed, ctx.round, ctx.client_id, "replay"),
            replay=cl.replay_batch or loc.batch_size, fisher=fisher,
            anchor=anchor, depths=depths, own=model.geometry, device=dev,
            augment=(lambda t: augment(t, tgen)) if self.params.augment and
            ctx.x_train.ndim == 4 else (lambda t: t))

    def _sgd(self, ctx: ClientContext, model: Any, grid: list, objective: Any,
             masks: dict[str, np.ndarray] | None, task: int) -> dict[str, float]:
        """The local steps: each batch (from (seed, round, client), ``local.max_steps``)
        trains the rung Ordered Dropout drew for it; FIARSE's masked entries get no
        gradient; replayed samples are stored after each step. Returns the metrics."""
        import torch

        from fedray.core.seeding import torch_seeded
        from fedray.models.training import SGD, batches, input_tensor

        loc, dev, buffer = self.cfg.local, ctx.device, objective.buffer
        x, y = input_tensor(ctx.x_train, dev), input_tensor(ctx.y_train, dev)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = SGD(params, lr=loc.lr, momentum=loc.momentum, weight_decay=loc.weight_decay)
        named = dict(model.named_parameters())
        keep = {named[k]: torch.from_numpy(m).to(dev) for k, m in (masks or {}).items()}
        steps = list(batches(len(x), loc.batch_size, loc.epochs, ctx.seed, ctx.round,
                             ctx.client_id, loc.max_steps))
        choice = od_choices(ctx.seed, ctx.round, ctx.client_id, len(steps), len(grid))
        model.train()
        total, sub_params = 0.0, 0.0
        with torch_seeded(ctx.seed, ctx.round, ctx.client_id, "local-torch"):
            for step, idx in enumerate(steps):
                rung = grid[int(choice[step])]
                xb, yb = x[idx], y[idx]
                xin, yin = objective.inputs(xb, yb)
                opt.zero_grad()
                with torch.autocast(device_type=torch.device(dev).type, dtype=torch.bfloat16,
                                    enabled=loc.bf16):
                    loss, out = objective.loss(model, xin, yin, rung.geometry)
                loss.backward()
                for p, m in keep.items():  # FIARSE: masked entries are not in the sub-model
                    if p.grad is not None:
                        p.grad.mul_(m)
                opt.step()
                total += float(loss.detach())
                sub_params += rung.param_ratio
                if buffer is not None:
                    stored = out[:len(xb)].detach().cpu().numpy() \
                        if objective.method == "derpp" else None
                    buffer.add(ctx.x_train[idx], ctx.y_train[idx], objective.gen, stored)
        n = max(len(steps), 1)
        metrics = {"train_loss": total / n, "steps": float(len(steps)), "task": float(task),
                   "sub_param_ratio": sub_params / n}
        if masks:
            metrics["sub_param_ratio"] = masked_param_ratio(model, masks)
        return metrics

    @staticmethod
    def _bic_teacher(model: Any, state: dict[str, Any], depths: tuple[int, ...],
                     device: str) -> Any:
        """BiC: the model as the previous task left it (the client state's anchor), frozen."""
        import torch

        from fedray.models.sliceable import SliceableResNet

        teacher = SliceableResNet(model.arch, model.input_hw, model.geometry, False,
                                  depths).to(device)
        teacher.load_state_dict({k: torch.from_numpy(v) for k, v in state["anchor"].items()})
        teacher.eval()
        return teacher

    def _bic_stage2(self, ctx: ClientContext, model: Any, objective: Any, classes: list,
                    task: int, last: bool, metrics: dict[str, float]
                    ) -> dict[str, np.ndarray]:
        """BiC's tensors to upload: the corrections as broadcast, and after a task's last
        round of stage 1 its new classes' (α, β) fitted on a class-balanced held-out split
        (stage 2, once per task; added to ``metrics``)."""
        import torch

        from fedray.core.seeding import rng
        from fedray.methods.drod.continual.objectives import fit_bias

        cl, old, dev = self.cfg.continual, objective.old, ctx.device
        scale, shift = objective.scale, objective.shift
        bic = {"bic.scale": scale.numpy().copy(), "bic.shift": shift.numpy().copy()}
        xv, yv = balanced_split(ctx.x_test, ctx.y_test, objective.buffer, old.numpy(),
                                rng(ctx.seed, ctx.round, ctx.client_id, "bic-split")) \
            if last and task > 0 else (ctx.x_test[:0], ctx.y_test[:0])
        if len(yv):
            new = torch.as_tensor(classes[task])
            model.eval()
            with torch.no_grad():
                val = objective.corrected(model(torch.from_numpy(xv).to(dev)).float(),
                                          old).cpu()
            a, b = fit_bias(val, torch.from_numpy(yv), new, float(scale[new[0]]),
                            float(shift[new[0]]), cl.bic_steps, cl.bic_lr)
            bic["bic.scale"][classes[task]] = a
            bic["bic.shift"][classes[task]] = b
            metrics.update(bic_alpha=a, bic_beta=b)
        return bic

    # ------------------------------------------------------------------ evaluation

    def logits(self, resident: Resident, broadcast: State, x: np.ndarray, device: str = "cpu"
               ) -> np.ndarray:
        """Logits of the sub-model in ``broadcast`` (its tier found by shape), BiC-corrected."""
        import torch

        from fedray.models.training import set_state

        tier = resident.tier_of_state({k: v for k, v in broadcast.items()
                                       if not k.startswith("bic.")})
        model = resident.model(resident.tiers[tier].geometry, depths=resident.depths[tier])
        set_state(model, broadcast)
        model.eval()
        outs = []
        with torch.no_grad():
            for start in range(0, len(x), 512):
                outs.append(model(torch.from_numpy(x[start:start + 512]).to(device)).float()
                            .cpu().numpy())
        out = np.concatenate(outs) if outs else np.zeros((0, resident.arch.num_classes))
        if "bic.scale" in broadcast:
            out = out * broadcast["bic.scale"] + broadcast["bic.shift"]
        return out

    def evaluate(self, resident, broadcast, x, y, device="cpu"):
        from fedray.methods.drod.continual.metrics import task_accuracies

        if len(x) == 0:
            return {"loss": float("nan"), "accuracy": float("nan"), "n": 0.0}
        y = np.asarray(y)
        out = self.logits(resident, broadcast, x, device)
        shifted = out - out.max(1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        res = {"loss": float(-logp[np.arange(len(y)), y].mean()),
               "accuracy": float((out.argmax(1) == y).mean()), "n": float(len(y))}
        classes = self._tasks(resident.arch.num_classes)
        if classes is not None:
            res.update(task_accuracies(out, y, classes))
        return res


def balanced_split(x_new: np.ndarray, y_new: np.ndarray, buffer: Any, old: np.ndarray,
                   gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BiC's validation set: the same number of samples of every class, new classes from
    the client's held-out split, old classes from its exemplars (Wu et al. keep part of the
    exemplars out of training for this; a federated client's buffer is too small to split,
    so ours were replayed — documented choice). Empty when a side is missing."""
    xs = [x_new]
    ys = [y_new]
    if buffer is not None and len(buffer):
        keep = np.isin(buffer.y[:len(buffer)], old)
        xs.append(buffer.x[:len(buffer)][keep])
        ys.append(buffer.y[:len(buffer)][keep])
    x, y = np.concatenate(xs), np.concatenate(ys)
    classes, counts = np.unique(y, return_counts=True)
    if not np.isin(old, classes).any() or len(classes) < 2:
        return x[:0], y[:0]
    m = int(counts.min())
    idx = np.concatenate([np.sort(gen.choice(np.flatnonzero(y == c), m, replace=False))
                          for c in classes])
    return x[idx], y[idx]


def _with_defaults(axis: str, rule: str) -> type[HeteroParams]:
    """HeteroParams with this method's axis and rule as the defaults (the same knobs)."""
    fields = HeteroParams.__dataclass_fields__
    return dataclass(type(f"{axis.title()}{rule.title()}Params", (HeteroParams,), {
        "__annotations__": {"axis": HeteroParams.__annotations__["axis"],
                            "rule": HeteroParams.__annotations__["rule"]},
        "axis": spec(axis, help=fields["axis"].metadata["help"]),
        "rule": spec(rule, help=fields["rule"].metadata["help"])}))


@register_method
class Drod(Hetero):
    """DROD: Ordered Dropout over (s, b) on the θ curve."""

    name = "drod"
    Params = _with_defaults("dual", "od")

    @classmethod
    def sweep_preset(cls, cfg: Any) -> dict[str, dict]:
        """θ over [0, 1] (θ = 0: width only, θ = 1: branches only)."""
        return {"algorithm.theta": {"grid": [0.0, 0.25, 0.5, 0.75, 1.0]}}


@register_method
class Fjord(Hetero):
    """Width x FjORD: Ordered Dropout over the width."""

    name = "fjord"
    Params = _with_defaults("width", "od")


@register_method
class HeteroFL(Hetero):
    """Width x FedAvg (HeteroFL static slices)."""

    name = "heterofl"
    Params = _with_defaults("width", "static")


@register_method
class FedRolex(Hetero):
    """Width x FedRolex (rolling windows)."""

    name = "fedrolex"
    Params = _with_defaults("width", "rolling")


@register_method
class ShortcutFjord(Hetero):
    """Shortcut x FjORD: identity blocks deepest-first, resampled."""

    name = "shortcut_fjord"
    Params = _with_defaults("shortcut", "od")


@register_method
class DepthFedAvg(Hetero):
    """Depth x FedAvg: leading blocks and their exit head (DepthFL's cut)."""

    name = "depth_fedavg"
    Params = _with_defaults("depth", "static")


@register_method
class DepthFjord(Hetero):
    """Depth x FjORD: Ordered Dropout over depth, each sampled depth ending in its exit head."""

    name = "depth_fjord"
    Params = _with_defaults("depth", "od")


@register_method
class ShortcutFedAvg(Hetero):
    """Shortcut x FedAvg: each tier's fixed identity-block sub-model (no resampling)."""

    name = "shortcut_fedavg"
    Params = _with_defaults("shortcut", "static")


@register_method
class Fiarse(Hetero):
    """Width x FIARSE: the width cut plus a magnitude mask recomputed every round (any axis
    with ``algorithm.axis``)."""

    name = "fiarse"
    Params = _with_defaults("width", "fiarse")


@register_method
class ScaleFL(Hetero):
    """ScaleFL: width and depth cut at one ratio, every exit trained with self-distillation."""

    name = "scalefl"
    Params = _with_defaults("scalefl", "static")


METHODS = (Hetero, Drod, Fjord, HeteroFL, FedRolex, ShortcutFjord, DepthFedAvg, DepthFjord,
           ShortcutFedAvg, Fiarse, ScaleFL)
