"""FedAvg's aggregation rule: the pseudo-gradient Δ = Σ_i w_i Δ_i, w_i = n_i / Σ_j n_j
(``weighted``) or 1/N, summed in client-id order in float64 (so the result does not depend
on which executor produced which update), handed to the run's server optimizer
(:mod:`fedray.services.server_opt`): ``sgd`` with η_s = 1 is McMahan et al.'s FedAvg,
``momentum`` is FedAvgM, ``adam`` / ``yogi`` / ``adagrad`` are Reddi et al.'s FedOpt family."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.methods.base import AggregationPolicy, State, accumulate_rows, add_weighted, stack_runs
from fedray.services.server_opt import SGD, ServerOptimizer, norm

RUN = 4  # from this many consecutive rows of one stack on, they are added as its slice


def _runs(deltas: list[Any]) -> list[tuple[int, int, bool]]:
    """``deltas`` cut into runs [i, j): True for at least :data:`RUN` consecutive rows of
    one stack (:func:`~fedray.methods.base.stack_runs`; added as its slice), False for the
    uploads between them, merged (added one by one)."""
    out: list[tuple[int, int, bool]] = []
    for i, j in stack_runs(deltas):
        sliced = j - i >= RUN
        if not sliced and out and not out[-1][2]:
            out[-1] = (out[-1][0], j, False)
        else:
            out.append((i, j, sliced))
    return out


def weighted_mean(updates: list[tuple[int, int, State]], weighted: bool = True) -> State:
    """Σ_i w_i Δ_i in the given (client-id) order, accumulated in float64 from zero: each
    term w_i·Δ_i a float64 product, added one client after another. Consecutive rows of
    one cohort's stack (:class:`~fedray.methods.base.StackRow`) are added as the stack's
    slice (:func:`~fedray.methods.base.accumulate_rows`: the same bits; for a small model
    one addition per client over all tensors instead of two operations per tensor)."""
    counts = np.array([n for _, n, _ in updates], dtype=np.float64)
    w = counts / counts.sum() if weighted and counts.sum() > 0 else np.full(
        len(updates), 1.0 / len(updates))
    out = {name: np.zeros(np.shape(v), dtype=np.float64) for name, v in updates[0][2].items()}
    deltas = [delta for _, _, delta in updates]
    for i, j, sliced in _runs(deltas):
        if sliced:
            first = deltas[i]
            accumulate_rows(out, {k: first.stack[k][first.row:first.row + j - i]
                                  for k in out}, w[i:j].tolist())
            continue
        for name, acc in out.items():
            for wi, delta in zip(w[i:j], deltas[i:j], strict=True):
                add_weighted(acc, delta[name], wi)
    return out


class FedAvgPolicy(AggregationPolicy):
    """Linear: with ``runtime.reduce=executors`` the mean is Σ_i w_i Δ_i / Σ_i w_i from sums
    the executors reduced, instead of Σ_i (w_i / Σ_j w_j) Δ_i here — equal up to rounding,
    and as deterministic (the executors' groups and their order do not depend on how many
    executors there are)."""

    def __init__(self, optimizer: ServerOptimizer | None = None, weighted: bool = True,
                 robust: Any = None):
        self.optimizer = optimizer if optimizer is not None else SGD.of()
        self.weighted = weighted
        self.robust = robust  # a RobustRule (robust.rule): its aggregate replaces the mean

    def weight(self, num_samples: int) -> float:
        return float(num_samples) if self.weighted else 1.0

    @property
    def root_samples(self) -> int:
        return self.robust.root_samples if self.robust is not None else 0

    def set_reference(self, update: State) -> None:
        self.robust.reference = update

    def aggregate(self, global_state, updates, round):
        if self.robust is None:
            return self.step(global_state, weighted_mean(updates, self.weighted))
        mean, metrics = self.robust.combine(updates, self.weighted)
        if mean is None:  # too few reporters for the rule's assumption: the round is skipped
            return global_state, metrics
        new, stepped = self.step(global_state, mean)
        return new, {**stepped, **metrics}

    def aggregate_sum(self, global_state, total, weight, round):
        return self.step(global_state, {k: v / weight for k, v in total.items()})

    def state_dict(self) -> dict[str, Any]:
        return {"robust": self.robust.state_dict()} if self.robust is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.robust is not None and "robust" in state:
            self.robust.load_state_dict(state["robust"])

    def step(self, global_state: State, mean: State) -> tuple[State, dict[str, float]]:
        """The server optimizer's step from the pseudo-gradient ``mean``."""
        new, metrics = self.optimizer.step(global_state, mean)
        return new, {"update_norm": norm(mean), **metrics}
