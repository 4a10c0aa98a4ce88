"""Continual-learning metrics from an accuracy matrix (DROD §3 "Metrics").

``R[t, i]`` is the accuracy on task i's test classes after training through task t.
Class-IL takes the argmax over every class; task-IL restricts it to the scored task's own
classes (Mammoth's ``mask_classes``); both come from the same logits. ACC is the mean of the
final row; average forgetting (Chaudhry et al., 2018) is the mean over past tasks of
``max_{s < T-1} R[s, i] − R[T-1, i]``. A fleet value is the unweighted mean over tiers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def task_accuracies(logits: np.ndarray, y: np.ndarray, classes: Sequence[np.ndarray]
                    ) -> dict[str, float]:
    """Class-IL and task-IL accuracy on each task's test samples, from one set of logits."""
    out = {}
    pred = logits.argmax(1)
    for i, cls in enumerate(classes):
        mask = np.isin(y, cls)
        if not mask.any():
            continue
        sub = logits[mask][:, cls]
        out[f"task{i}/class_il"] = float((pred[mask] == y[mask]).mean())
        out[f"task{i}/task_il"] = float((cls[sub.argmax(1)] == y[mask]).mean())
    return out


def average_accuracy(R: np.ndarray) -> float:
    """ACC: the mean of the final row, over all T tasks."""
    return float(np.mean(R[-1]))


def forgetting(R: np.ndarray) -> float:
    """Mean over tasks i < T−1 of max_{s < T−1} R[s, i] − R[T−1, i] (0 for one task)."""
    T = R.shape[0]
    if T < 2:
        return 0.0
    best = R[:T - 1, :T - 1].max(0)
    return float(np.mean(best - R[T - 1, :T - 1]))


def accuracy_matrix(rows: Sequence[dict], tier: str, kind: str, tasks: int,
                    rounds_per_task: int) -> np.ndarray:
    """R[t, i] for ``tier`` from per-round metric rows (``tier/{tier}/task{i}/{kind}``)
    logged at each task's last round; NaN where a row is missing."""
    by_round = {int(r["round"]): r for r in rows}
    R = np.full((tasks, tasks), np.nan)
    for t in range(tasks):
        row = by_round.get((t + 1) * rounds_per_task)
        if row is None:
            continue
        for i in range(tasks):
            v = row.get(f"tier/{tier}/task{i}/{kind}")
            if v is not None:
                R[t, i] = v
    return R


def summarize(rows: Sequence[dict], tiers: Sequence[str], tasks: int, rounds_per_task: int
              ) -> dict[str, dict[str, float]]:
    """Class-IL/task-IL ACC and forgetting per tier and for the fleet (mean over tiers),
    over the tasks completed so far."""
    out: dict[str, dict[str, float]] = {}
    for tier in tiers:
        res = {}
        for kind in ("class_il", "task_il"):
            R = accuracy_matrix(rows, tier, kind, tasks, rounds_per_task)
            done = int(np.sum(~np.isnan(R).all(1)))
            if done == 0:
                continue
            R = R[:done, :done]
            res[f"{kind}_acc"] = average_accuracy(R)
            res[f"{kind}_forgetting"] = forgetting(R)
        res["tasks_completed"] = float(done)
        out[tier] = res
    keys = set.intersection(*(set(v) for v in out.values())) if out else set()
    out["fleet"] = {k: float(np.mean([out[t][k] for t in tiers])) for k in sorted(keys)}
    return out
