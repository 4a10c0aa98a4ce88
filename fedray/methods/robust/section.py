"""The ``robust`` config section and the rule object a FedAvg-family policy calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedray.core import registry
from fedray.core.seeding import rng
from fedray.core.spec import ConfigError, spec
from fedray.methods.robust import rules

State = dict[str, np.ndarray]


@dataclass
class RobustConfig:
    """Byzantine-robust aggregation (:mod:`fedray.methods.robust.rules`) in place of the
    FedAvg family's weighted mean; the server optimizer then steps from the robust
    aggregate. Each client's weight in it (``robust_kept``: 1 as in a plain mean, 0
    excluded) lands in its ``clients.parquet`` row."""

    rule: Literal["none", "median", "trimmed_mean", "krum", "multi_krum", "bulyan",
                  "norm_bound", "centered_clip", "fltrust"] = spec(
        "none", help="none (the weighted mean), median / trimmed_mean (coordinate-wise, Yin et "
                     "al. 2018), krum / multi_krum (Blanchard et al. 2017), bulyan (El Mhamdi "
                     "et al. 2018), norm_bound (Sun et al. 2019), centered_clip (Karimireddy "
                     "et al. 2021), fltrust (Cao et al. 2021)")
    f: int = spec(0, ge=0, help="krum, multi_krum, bulyan: malicious updates per round the "
                                "rule withstands (krum needs n > 2f + 2, bulyan n >= 4f + 3)")
    m: int | None = spec(None, ge=1, help="multi_krum: updates averaged (default n - f)")
    trim: float = spec(0.1, ge=0, lt=0.5, help="trimmed_mean: β, the share of values cut at "
                                               "each end of every coordinate (floor(βn))")
    bound: float = spec(1.0, gt=0, help="norm_bound: M, every update scaled to L2 norm <= M")
    tau: float = spec(1.0, gt=0, help="centered_clip: τ, the clipping radius around the "
                                      "previous round's aggregate")
    iters: int = spec(1, ge=1, help="centered_clip: L, clipping iterations per round")
    root_samples: int = spec(100, ge=1, help="fltrust: samples of the server's root dataset, "
                                             "drawn once from the clients' training splits "
                                             "(never the test splits); the server trains on "
                                             "them as a client would (local.*)")

    def validate(self, cfg: Any) -> None:
        """The rule needs a FedAvg-family method, every upload on the driver, no central DP,
        and its assumption on the round's cohort size (clients sampled per round)."""
        if self.rule == "none":
            return
        method = registry.method_of(cfg)
        registry.require(method, "robust", "robust.rule", self.rule)
        if cfg.runtime.reduce == "executors":
            raise ConfigError("runtime.reduce", "executors",
                              f"driver with robust.rule={self.rule} (a robust rule needs every "
                              f"upload, not partial sums)")
        if cfg.dp.enabled:
            raise ConfigError("robust.rule", self.rule,
                              "none with dp.enabled (the accountant's sensitivity is that of "
                              "the clipped mean)")
        n = cfg.clients.sampled_count()
        why = rules.requirement(self.rule, n, self.f, self.trim, self.m)
        if why:
            knob, text = why
            raise ConfigError(f"robust.{knob}", getattr(self, knob),
                              f"robust.rule={self.rule} needs {text}; clients sampled per "
                              f"round: {n}")


class RobustRule:
    """One round's robust aggregate of the FedAvg family's ``(client_id, n_i, Δ_i)`` uploads
    (client-id order): the tensors flattened in name order into one float64 row per client,
    the rule applied, the result unflattened. ``centered_clip`` keeps the previous aggregate
    (``state_dict``: checkpointed with the policy, restored on ``--resume``)."""

    def __init__(self, cfg: RobustConfig):
        self.cfg = cfg
        self.previous: np.ndarray | None = None
        self.reference: State | None = None  # fltrust: this round's server update g0

    @property
    def root_samples(self) -> int:
        """Samples of the server root dataset the rule needs an update on (0: none)."""
        return self.cfg.root_samples if self.cfg.rule == "fltrust" else 0

    def combine(self, updates: list[tuple[int, int, State]], weighted: bool
                ) -> tuple[State | None, dict[str, Any]]:
        """(aggregate, metrics); (None, metrics) when fewer updates reported than the rule
        needs (a fleet's dropouts, deadlines or availability): the round is skipped — the
        model and the server optimizer stay as they are, ``robust_skipped`` says so and
        every reporter's ``robust_kept`` is 0."""
        c = self.cfg
        if rules.requirement(c.rule, len(updates), c.f, c.trim, c.m):
            return None, {"robust_skipped": 1.0, "robust_excluded": float(len(updates)),
                          "per_client": {cid: {"robust_kept": 0.0} for cid, _, _ in updates}}
        names = list(updates[0][2])
        shapes = [np.shape(updates[0][2][k]) for k in names]
        x = np.stack([np.concatenate([np.asarray(d[k], np.float64).ravel() for k in names])
                      for _, _, d in updates])
        if c.rule == "median":
            out = rules.median(x)
        elif c.rule == "trimmed_mean":
            out = rules.trimmed_mean(x, c.trim)
        elif c.rule == "krum":
            out = rules.krum(x, c.f)
        elif c.rule == "multi_krum":
            out = rules.multi_krum(x, c.f, c.m)
        elif c.rule == "bulyan":
            out = rules.bulyan(x, c.f)
        elif c.rule == "fltrust":
            if self.reference is None:
                raise RuntimeError("robust.rule=fltrust aggregates against the server's "
                                   "update of the round, and none was given")
            ref = np.concatenate([np.asarray(self.reference[k], np.float64).ravel()
                                  for k in names])
            self.reference = None  # one round's
            out = rules.fltrust(x, ref)
        elif c.rule == "norm_bound":
            counts = np.array([n for _, n, _ in updates], np.float64)
            out = rules.norm_bound(x, c.bound, counts if weighted and counts.sum() else None)
        else:
            start = self.previous if self.previous is not None and \
                len(self.previous) == x.shape[1] else None
            out = rules.centered_clip(x, c.tau, c.iters, start)
            self.previous = out.aggregate
        state, at = {}, 0
        for k, shape in zip(names, shapes, strict=True):
            size = int(np.prod(shape))
            state[k] = out.aggregate[at:at + size].reshape(shape)
            at += size
        metrics = {"robust_skipped": 0.0, "robust_excluded": float((out.kept == 0).sum()),
                   "robust_kept_mean": float(out.kept.mean()),
                   "per_client": {cid: {"robust_kept": float(k)}
                                  for (cid, _, _), k in zip(updates, out.kept, strict=True)}}
        return state, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prev = state.get("previous")
        self.previous = None if prev is None else np.asarray(prev, np.float64)


def root_dataset(data: Any, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """FLTrust's server root dataset: ``samples`` samples of the clients' training splits
    (the complement of every test split), drawn from ``(seed, "fltrust-root")``: clients in
    a seeded order until enough samples are pooled, then ``samples`` of the pool (all of it
    when the clients hold fewer). The same on every executor and after ``--resume``. Our
    choice where Cao et al. collect a fresh set: the server's samples may also be in some
    client's training split, never in any test split."""
    gen = rng(seed, purpose="fltrust-root")
    xs, ys, held = [], [], 0
    for c in gen.permutation(data.num_clients):
        x, y = data.client_arrays(int(c), 0, "train")
        xs.append(np.asarray(x))
        ys.append(np.asarray(y))
        held += len(x)
        if held >= samples:
            break
    x, y = np.concatenate(xs), np.concatenate(ys)
    pick = np.sort(gen.choice(len(x), min(samples, len(x)), replace=False))
    return x[pick], y[pick]


registry.register_section("robust", RobustConfig)
