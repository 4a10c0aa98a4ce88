"""``fedray report`` and ``fedray compare``: PNG plots and a Markdown summary of runs.

Plots: accuracy vs round (global test set, and personalized = mean over clients of the
global model on each client's local test split, with its spread), accuracy vs cumulative
bytes (log x: the communication/accuracy trade-off), and per-tier personalized accuracy
when a run has several capacity tiers.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import yaml

from fedray import registry
from fedray.metrics import read_metrics
from fedray.plots import images as _images
from fedray.plots import pyplot as _plt
from fedray.plots import save


def _load(run_dir: str) -> dict[str, Any]:
    rounds = read_metrics(run_dir, "rounds").to_pandas()
    try:
        clients = read_metrics(run_dir, "clients").to_pandas()
    except FileNotFoundError:
        clients = None
    summary = {}
    path = os.path.join(run_dir, "summary.json")
    if os.path.exists(path):
        with open(path) as f:
            summary = json.load(f)
    config = {}
    path = os.path.join(run_dir, "config.yaml")
    if os.path.exists(path):
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    label = summary.get("name") or os.path.basename(os.path.normpath(run_dir))
    return {"dir": run_dir, "rounds": rounds, "clients": clients, "summary": summary,
            "label": label, "config": config}


def _accuracy_plots(runs: list[dict], out_dir: str) -> list[str]:
    plt = _plt()
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for run in runs:
        r = run["rounds"]
        ev = r[~r["global_accuracy"].isna()]
        axes[0].plot(ev["round"], ev["global_accuracy"], marker=".", label=run["label"])
        pe = r[~r["personalized_accuracy"].isna()]
        line, = axes[1].plot(pe["round"], pe["personalized_accuracy"], marker=".",
                             label=run["label"])
        axes[1].fill_between(pe["round"], pe["personalized_accuracy"]
                             - pe["personalized_accuracy_std"], pe["personalized_accuracy"]
                             + pe["personalized_accuracy_std"], color=line.get_color(),
                             alpha=0.15)
    axes[0].set(title="Global test accuracy", xlabel="round", ylabel="accuracy")
    axes[1].set(title="Personalized accuracy (mean ± std over clients)", xlabel="round")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    paths.append(save(fig, out_dir, "accuracy_vs_round.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        r = run["rounds"]
        ev = r[~r["global_accuracy"].isna()]
        ax.plot(ev["cum_bytes"], ev["global_accuracy"], marker=".", label=run["label"])
    ax.set_xscale("log")
    ax.set(title="Accuracy vs communication", xlabel="cumulative bytes (up + down)",
           ylabel="global test accuracy")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    paths.append(save(fig, out_dir, "accuracy_vs_bytes.png"))

    timed = [run for run in runs if "cum_sim_seconds" in run["rounds"]]
    if timed:  # the virtual clock (fedray.fleet): what a deployment would wait for
        longest = max(float(run["rounds"]["cum_sim_seconds"].max()) for run in timed)
        unit, scale = (("seconds", 1.0) if longest < 120 else
                       ("minutes", 60.0) if longest < 7200 else ("hours", 3600.0))
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in timed:
            r = run["rounds"]
            ev = r[~r["global_accuracy"].isna()]
            ax.plot(ev["cum_sim_seconds"] / scale, ev["global_accuracy"], marker=".",
                    label=run["label"])
        ax.set(title="Accuracy vs simulated time", xlabel=f"simulated {unit} (fleet clock)",
               ylabel="global test accuracy (↑ better)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(save(fig, out_dir, "accuracy_vs_sim_time.png"))

    tiered = [run for run in runs if run["clients"] is not None
              and "eval_accuracy" in run["clients"] and run["clients"]["tier"].nunique() > 1]
    if tiered:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in tiered:
            c = run["clients"].dropna(subset=["eval_accuracy"])
            for tier, g in c.groupby("tier"):
                m = g.groupby("round")["eval_accuracy"].mean()
                ax.plot(m.index, m.values, marker=".", label=f"{run['label']} · {tier}")
        ax.set(title="Personalized accuracy per tier", xlabel="round", ylabel="accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(save(fig, out_dir, "accuracy_per_tier.png"))
    return paths


def _row(run: dict) -> dict[str, Any]:
    r = run["rounds"]
    ev = r[~r["global_accuracy"].isna()]
    last = ev.iloc[-1] if len(ev) else None

    def f(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        return float(v) if isinstance(v, (float, np.floating)) else int(v)

    return {
        "run": run["label"], "rounds": int(r["round"].max()),
        "final_global_accuracy": f(last["global_accuracy"]) if last is not None else None,
        "best_global_accuracy": f(ev["global_accuracy"].max()) if len(ev) else None,
        "final_personalized_accuracy": f(last["personalized_accuracy"])
        if last is not None else None,
        "personalized_accuracy_std": f(last["personalized_accuracy_std"])
        if last is not None else None,
        "total_bytes": f(r["cum_bytes"].iloc[-1]),
        "upload_bytes_per_round": f(r["upload_bytes"].mean()),
        **_payload(run),
        "mean_round_seconds": f(r["seconds"].mean()),
        "simulated_hours": f(r["cum_sim_seconds"].iloc[-1] / 3600)
        if "cum_sim_seconds" in r else None,
        "client_failures": f(r["failed"].sum() + r["rejected"].sum()),
    }


def _payload(run: dict) -> dict[str, Any]:
    """Mean upload per client per round and the compression ratio against sending the
    whole model in fp32 (4 bytes per parameter)."""
    c, params = run["clients"], run["summary"].get("model_parameters")
    if c is None or "upload_bytes" not in c:
        return {}
    ok = c[c["sampled"] & (c["status"] == "ok")]["upload_bytes"]
    per = float(ok.mean()) if len(ok) else None
    ratio = 4 * params / per if per and params else None
    return {"upload_bytes_per_client_round": per, "compression_ratio": ratio}


def _markdown(rows: list[dict], title: str, plots: list[str], out_dir: str) -> str:
    cols = list(rows[0])
    fmt = {"total_bytes": "{:,.0f}", "upload_bytes_per_round": "{:,.0f}",
           "upload_bytes_per_client_round": "{:,.0f}", "compression_ratio": "{:,.1f}×"}
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |",
             "|" + "---|" * len(cols)]
    for row in rows:
        cells = []
        for c in cols:
            v = row[c]
            if v is None:
                cells.append("–")
            elif isinstance(v, float):
                cells.append(fmt.get(c, "{:.4f}").format(v))
            else:
                cells.append(f"{v:,}" if isinstance(v, int) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _images(plots, out_dir)


def report(run_dir: str, out_dir: str | None = None) -> dict[str, Any]:
    """Plots and REPORT.md for one run (default into RUN_DIR/report), plus the sections its
    method adds (:meth:`fedray.methods.base.Algorithm.report_sections`: ORDERS' norms and
    ranks, the continual accuracy matrices, ...)."""
    run = _load(run_dir)
    out_dir = out_dir or os.path.join(run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    plots = _accuracy_plots([run], out_dir)
    row = _row(run)
    text = _markdown([row], f"fedray run: {run['label']}", plots, out_dir)
    diagnostics: dict[str, Any] = {}
    for section in _method_sections(run, out_dir):
        diagnostics[section.key] = section.data
        plots += section.plots
        text += f"\n## {section.title}\n\n{section.markdown}\n\n" + \
            _images(section.plots, out_dir)
    md = os.path.join(out_dir, "REPORT.md")
    with open(md, "w") as f:
        f.write(text)
    return {"run_dir": run_dir, "out_dir": out_dir, "plots": plots, "markdown": md,
            "metrics": row, "diagnostics": diagnostics}


def _method_sections(run: dict[str, Any], out_dir: str) -> list:
    """The report sections of the run's method (none when config.yaml is missing or names a
    method this installation does not have)."""
    name = (run.get("config") or {}).get("algorithm", {}).get("name")
    try:
        method = registry.method(name)
    except ValueError:
        return []
    return method.report_sections(run, out_dir)


def compare(run_dirs: list[str], out_dir: str) -> dict[str, Any]:
    """Overlay several runs in the same plots and one table."""
    runs = [_load(d) for d in run_dirs]
    if len({r["label"] for r in runs}) < len(runs):
        for r in runs:
            r["label"] = os.path.basename(os.path.normpath(r["dir"]))
    os.makedirs(out_dir, exist_ok=True)
    plots = _accuracy_plots(runs, out_dir)
    rows = [_row(r) for r in runs]
    md = os.path.join(out_dir, "COMPARE.md")
    with open(md, "w") as f:
        f.write(_markdown(rows, "fedray comparison", plots, out_dir))
    return {"runs": run_dirs, "out_dir": out_dir, "plots": plots, "markdown": md,
            "metrics": rows}
