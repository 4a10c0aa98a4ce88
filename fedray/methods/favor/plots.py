"""The FAVoR job's plot, style_retention.png: does each method's generated text keep its
author's style? One bar per method on four style measures (:mod:`.evaluate`), each panel
saying in words what it measures and which way is better, with its chance level dashed, and
mean ± sd error bars over seeds when the results hold several rows of one method (each row
is one seeded run of that method).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fedray.observe.plots import UP, axis_label, chance_line, describe, mean_sd, pyplot, save


@dataclass(frozen=True)
class Panel:
    """One style measure: its results column, title, y-axis label, chance level (a number,
    ``"authors"`` for 1/number of authors, or None when guessing has no fixed score) and
    y-axis range (None: matplotlib's)."""

    column: str
    title: str
    ylabel: str
    chance: float | str | None
    ylim: tuple[float, float] | None = None


PANELS = [
    Panel("author_accuracy", "Author attribution of generated text",
          axis_label("generations closest to their own author's\nASCE prototype",
                     "fraction", UP), "authors"),
    Panel("gen_gen_auc", "Style consistency between generations",
          axis_label("same-author verification AUC,\ngenerated vs generated (ASCE)", None,
                     UP), 0.5, (0.0, 1.0)),
    Panel("gen_source_auc", "Style match to the author's own posts",
          axis_label("same-author verification AUC,\ngenerated vs human posts (ASCE)", None,
                     UP), 0.5, (0.0, 1.0)),
    Panel("semsim", "Content kept (SemSim)",
          axis_label("MiniLM cosine similarity,\ngeneration vs human continuation", None, UP),
          None),
]


def style_retention_plot(rows: Iterable[Mapping[str, Any]], path: str,
                         authors: int | None = None) -> dict[str, Any]:
    """Draw the results table ``rows`` (one mapping per method and seed: ``method`` and the
    :data:`PANELS` columns, as the FAVoR job's results.parquet) to the PNG ``path``.
    ``authors`` (the roster size) sets the author-attribution chance level 1/authors; without
    it that panel has no chance line. Returns what was drawn: ``path``, the figure's
    :func:`fedray.observe.plots.describe` and, per panel, its column, chance level and each
    method's mean, sd (None for a single seed) and n."""
    rows = [dict(r) for r in rows]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 4.4))
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    seeds = max((sum(r["method"] == m for r in rows) for m in methods), default=0)
    panels = []
    for ax, panel in zip(axes, PANELS, strict=True):
        stats = []
        for m in methods:
            mean, sd, n = mean_sd(_value(r.get(panel.column)) for r in rows
                                  if r["method"] == m)
            stats.append({"method": m, "mean": mean, "sd": sd, "n": n})
        x = range(len(methods))
        heights = [s["mean"] if s["mean"] is not None else 0.0 for s in stats]
        if seeds > 1:
            ax.bar(x, heights, color=[colors[m] for m in methods],
                   yerr=[s["sd"] or 0.0 for s in stats], capsize=4, ecolor="black")
        else:
            ax.bar(x, heights, color=[colors[m] for m in methods])
        for i, s in enumerate(stats):
            if s["mean"] is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8)
        level = (1.0 / authors if authors else None) if panel.chance == "authors" \
            else panel.chance
        what = f"chance (1/{authors} authors)" if panel.chance == "authors" else "chance"
        chance_line(ax, level, what)
        ax.set_xticks(list(x), methods, rotation=30, ha="right")
        ax.set(title=panel.title, ylabel=panel.ylabel)
        if panel.ylim:
            ax.set_ylim(*panel.ylim)
        ax.grid(alpha=0.3, axis="y")
        if level is not None:
            ax.legend(fontsize=8, loc="best")
        panels.append({"column": panel.column, "chance": level, "methods": stats})
    spread = f"mean ± sd over {seeds} seeds" if seeds > 1 else "one seed"
    fig.suptitle(f"Does generated text keep its author's style? {len(methods)} methods "
                 f"compared ({spread}; dashed: chance)")
    info = describe(fig)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save(fig, os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    return {"path": path, **info, "panels": panels}


def _value(v: Any) -> float | None:
    """A plottable number, or None (a metric the run could not compute)."""
    if v is None or isinstance(v, str):
        return None
    v = float(v)
    return v if math.isfinite(v) else None
