"""Continual-learning diagnostics for ``fedray report``: the accuracy matrix R[t, i] of each
tier as a heatmap (class-IL and task-IL) and ACC / forgetting per tier and for the fleet."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.methods.drod.continual.metrics import accuracy_matrix, summarize
from fedray.observe.plots import FRACTION, UP, axis_label, pyplot, save


def setting(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """(tiers, tasks, rounds_per_task) of a continual run's stored config, None for any
    other run."""
    cl = (cfg or {}).get("continual") or {}
    if not cl.get("tasks"):
        return None
    return {"tiers": [t["name"] for t in cfg["runtime"]["tiers"]], "tasks": cl["tasks"],
            "rounds_per_task": cl["rounds_per_task"]}


def summary(rows: list[dict], s: dict[str, Any]) -> dict[str, dict[str, float]]:
    return summarize(rows, s["tiers"], s["tasks"], s["rounds_per_task"])


def plots(rows: list[dict], s: dict[str, Any], out_dir: str, label: str) -> list[str]:
    """One heatmap per tier and setting (class-IL: all classes seen so far compete;
    task-IL: only the scored task's), on one shared 0–1 colour scale."""
    plt = pyplot()
    tiers = s["tiers"]
    fig, axes = plt.subplots(2, len(tiers), figsize=(3.6 * len(tiers) + 1, 6.4), squeeze=False,
                             layout="constrained")
    for col, tier in enumerate(tiers):
        for row, kind in enumerate(("class_il", "task_il")):
            R = accuracy_matrix(rows, tier, kind, s["tasks"], s["rounds_per_task"])
            ax = axes[row][col]
            image = ax.imshow(np.ma.masked_invalid(R), vmin=0, vmax=1, cmap="viridis")
            ax.set(title=f"{tier} · {kind.replace('_', '-')}", xlabel="task scored i",
                   ylabel="after training on task t")
            if s["tasks"] <= 20:
                ax.set(xticks=range(s["tasks"]), yticks=range(s["tasks"]))
            for (t, i), v in np.ndenumerate(R):
                if not np.isnan(v) and s["tasks"] <= 10:
                    ax.text(i, t, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="w" if v < 0.5 else "k")
    fig.suptitle(f"{label}: accuracy matrix R[t, i] per tier (below the diagonal: "
                 "retention of earlier tasks)")
    fig.colorbar(image, ax=axes, label=axis_label("test accuracy", FRACTION, UP),
                 shrink=0.8)
    return [save(fig, out_dir, "accuracy_matrix.png")]
