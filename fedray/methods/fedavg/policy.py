"""FedAvg's server step: θ_{t+1} = θ_t + η_s Σ_i w_i Δ_i, w_i = n_i / Σ_j n_j (``weighted``)
or 1/N; η_s = 1 is plain FedAvg. The sum runs in client-id order in float64, so the result
does not depend on which executor produced which update."""

from __future__ import annotations

import numpy as np

from fedray.methods.base import AggregationPolicy, State


def weighted_mean(updates: list[tuple[int, int, State]], weighted: bool = True) -> State:
    """Σ_i w_i Δ_i in the given (client-id) order, accumulated in float64."""
    counts = np.array([n for _, n, _ in updates], dtype=np.float64)
    w = counts / counts.sum() if weighted and counts.sum() > 0 else np.full(
        len(updates), 1.0 / len(updates))
    out = {}
    for name in updates[0][2]:
        acc = np.zeros(np.shape(updates[0][2][name]), dtype=np.float64)
        for wi, (_, _, delta) in zip(w, updates, strict=True):
            acc += wi * delta[name]
        out[name] = acc
    return out


class FedAvgPolicy(AggregationPolicy):
    """Linear: with ``runtime.reduce=executors`` the mean is Σ_i w_i Δ_i / Σ_i w_i from sums
    the executors reduced, instead of Σ_i (w_i / Σ_j w_j) Δ_i here — equal up to rounding,
    and as deterministic (the executors' groups and their order do not depend on how many
    executors there are)."""

    linear = True

    def __init__(self, server_lr: float = 1.0, weighted: bool = True):
        self.server_lr = server_lr
        self.weighted = weighted

    def weight(self, num_samples: int) -> float:
        return float(num_samples) if self.weighted else 1.0

    def aggregate(self, global_state, updates, round):
        return self.step(global_state, weighted_mean(updates, self.weighted))

    def aggregate_sum(self, global_state, total, weight, round):
        return self.step(global_state, {k: v / weight for k, v in total.items()})

    def step(self, global_state: State, mean: State) -> tuple[State, dict[str, float]]:
        """θ + η_s · mean, in float64, back to float32."""
        new = {k: (v.astype(np.float64) + self.server_lr * mean[k]).astype(np.float32)
               if k in mean else v for k, v in global_state.items()}
        norm = float(np.sqrt(sum(float((m * m).sum()) for m in mean.values())))
        return new, {"update_norm": norm}
