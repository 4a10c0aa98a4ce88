"""``fedray report`` and ``fedray compare``: PNG plots, a Markdown summary and one
self-contained HTML page (tables and plots inline, nothing fetched) of runs.

Plots: accuracy vs round (global test set, and personalized = mean over clients of the
global model on each client's local test split, with its spread over clients), accuracy vs
cumulative bytes (log x: the communication/accuracy trade-off), accuracy vs simulated time
(fleet clock) and vs privacy spent (client-level DP) when runs have them, per-tier
personalized accuracy when a run has several capacity tiers, and, for runs with malicious
clients, a backdoor's attack success rate and a robust rule's detection precision and
recall per round, for runs with secure aggregation its bytes and simulated seconds per
round by protocol phase; ``compare`` of runs that differ in both defence (method, robust rule) and
attack adds a defences × attacks heatmap of the final global accuracy. Every accuracy axis is a
fraction correct (↑ better) with the chance level drawn: 1/classes of the run's dataset
(from ``data.json``, else the config's dataset), none for BlogText, whose accuracy is FAVoR's
next-token accuracy (its chance depends on the vocabulary and the text, not a class count).

``compare`` groups seeds: runs whose stored ``config.yaml`` is equal except for the
top-level ``seed`` and ``name`` are one group, plotted as mean ± sd (sample sd, ddof 1) over
their runs with error bars, and summarised in a second table; runs without a config, or
alone in their group, are plotted as they are. ``report`` of a single run has no seeds to
group (its personalized accuracy shows ± sd over clients instead).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from fedray.core import registry
from fedray.core.config import DataConfig, dataset_shape, parse_text
from fedray.core.outputs import refuse_links, staged_dir
from fedray.core.spec import ConfigError, build_dataclass, shown
from fedray.core.storage import StateFileError, Storage
from fedray.observe.metrics import read_metrics
from fedray.observe.plots import (
    FRACTION,
    UP,
    axis_label,
    chance_line,
    error_bars,
    heatmap,
    markdown_html,
    mean_sd,
    save_figure,
)
from fedray.observe.plots import images as _images
from fedray.observe.plots import pyplot as _plt

ACCURACY = axis_label("global test accuracy", FRACTION, UP)
# the per-run table's columns summarised over seeds in ``compare``
GROUPED = ["final_global_accuracy", "best_global_accuracy", "final_personalized_accuracy",
           "total_bytes"]


def _load(run_dir: str) -> dict[str, Any]:
    """A run directory's tables and files, read as data and confined to it (a link inside
    is refused): a damaged file is one :class:`StateFileError` naming it."""
    storage = Storage(run_dir)
    rounds = _metrics(run_dir, "rounds")
    try:
        clients = _metrics(run_dir, "clients")
    except FileNotFoundError:
        clients = None
    summary = _json(storage, "summary.json")
    config: dict[str, Any] = {}
    if storage.exists("config.yaml"):
        config = parse_text(storage.read_bytes("config.yaml"), "yaml",
                            storage.path("config.yaml"), "run directory")
    # shown: a stored name is one printable line, never Markdown of its own (an image line)
    label = shown(summary.get("name") or os.path.basename(os.path.normpath(run_dir)))
    data = config.get("data")
    dataset = data.get("dataset") if isinstance(data, dict) else None
    return {"dir": run_dir, "rounds": rounds, "clients": clients, "summary": summary,
            "label": label, "config": config, "dataset": dataset,
            "chance": _chance(config, _json(storage, "data.json"))}


def _metrics(run_dir: str, kind: str) -> pd.DataFrame:
    import pyarrow as pa

    try:
        table = read_metrics(run_dir, kind)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, pa.ArrowException) as e:
        if isinstance(e, StateFileError):
            raise
        raise StateFileError(f"{run_dir}/{kind}.parquet", f"a readable metrics table "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") \
            from None
    if "round" not in table.column_names:
        raise StateFileError(f"{run_dir}/{kind}.parquet", "a metrics table with a 'round' "
                                                          "column")
    return table.to_pandas()


def _json(storage: Storage, name: str) -> dict[str, Any]:
    return storage.read_json(name) if storage.exists(name) else {}


def _chance(config: dict[str, Any], data_summary: dict[str, Any]) -> float | None:
    """The accuracy of guessing, 1/classes: the class count the run's data reported
    (``data.json``), else the one its configured dataset has; None for BlogText (next-token
    accuracy) and when neither is known."""
    data = config.get("data") or {}
    if data.get("dataset") == "blogtext" or data_summary.get("task") == "multilabel":
        return None  # next-token accuracy; per-label accuracy at 0.5 (not 1/classes)
    classes = data_summary.get("num_classes")
    if not classes:
        try:
            classes = dataset_shape(build_dataclass(DataConfig, data, "data"))[1]
        except (ConfigError, TypeError, ValueError):
            return None
    return 1.0 / classes if classes and classes > 1 else None


# ----------------------------------------------------------------------------- groups


def _groups(runs: list[dict], by_seed: bool) -> list[dict[str, Any]]:
    """The plotted series: one per run, or with ``by_seed`` one per set of runs whose config
    is equal except for ``seed`` and ``name`` (see the module docstring), in first-seen
    order."""
    groups: dict[str, list[dict]] = {}
    for i, run in enumerate(runs):
        cfg = {k: v for k, v in run["config"].items() if k not in ("seed", "name")}
        key = json.dumps(cfg, sort_keys=True, default=str) if by_seed and cfg else f"#{i}"
        groups.setdefault(key, []).append(run)
    out = []
    for members in groups.values():
        labels = [r["label"] for r in members]
        label = labels[0]
        if len(members) > 1:
            names = " + ".join(dict.fromkeys(labels))
            if len(names) > 40:
                names = os.path.commonprefix(labels).rstrip("-_ .") or labels[0] + " …"
            label = f"{names} (mean ± sd, {len(members)} seeds)"
        out.append({"label": label, "runs": members})
    return out


def _frame(run: dict, y: str, x: str = "round") -> pd.DataFrame:
    """(round, x, y) of the run's rounds where ``y`` was measured."""
    r = run["rounds"]
    if y not in r or x not in r:
        return pd.DataFrame(columns=["round", "x", "y"])
    ev = r[r[y].notna()]
    return pd.DataFrame({"round": ev["round"].to_numpy(), "x": ev[x].to_numpy(),
                         "y": ev[y].to_numpy()})


def _aggregate(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per round over the runs: mean x, mean y, sample sd of y (NaN for one run), count."""
    df = pd.concat([f for f in frames if len(f)]) if any(len(f) for f in frames) else \
        pd.DataFrame(columns=["round", "x", "y"], dtype=float)
    g = df.astype(float).groupby("round")
    return pd.DataFrame({"x": g["x"].mean(), "mean": g["y"].mean(), "sd": g["y"].std(ddof=1),
                         "n": g["y"].count()})


def _draw(ax: Any, label: str, frames: list[pd.DataFrame]) -> tuple[Any, pd.DataFrame]:
    """One series: a line for one run, mean ± sd error bars over several; returns its colour
    and the aggregated curve."""
    curve = _aggregate(frames)
    if len(frames) > 1:
        bars = error_bars(ax, curve["x"], curve["mean"], curve["sd"], label)
        return bars.lines[0].get_color(), curve
    line, = ax.plot(curve["x"], curve["mean"], marker=".", label=label)
    return line.get_color(), curve


def _chance_lines(ax: Any, runs: list[dict]) -> None:
    for level in sorted({r["chance"] for r in runs if r["chance"] is not None}):
        chance_line(ax, level, f"chance (1/{round(1 / level)} classes)")


def _what(groups: list[dict], runs: list[dict]) -> str:
    """What a figure compares, for its title: the run, or the series side by side, and the
    dataset they share."""
    labels = [g["label"] for g in groups]
    what = " vs ".join(labels)
    if len(what) > 90:
        what = f"{len(labels)} series"
    datasets = {r["dataset"] for r in runs}
    return what + (f" on {datasets.pop()}" if len(datasets) == 1 and None not in datasets
                   else "")


def _title(measure: str, what: str) -> str:
    """A plot title: what is measured, then what is compared, wrapped to the plot's width."""
    return "\n".join(textwrap.fill(t, 70, break_on_hyphens=False) for t in (measure, what))


def _finish(ax: Any, **labels: Any) -> None:
    ax.set(**labels)
    if labels.get("xlabel") == "round":
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


# ----------------------------------------------------------------------------- plots


def _accuracy_plots(runs: list[dict], groups: list[dict], out_dir: str) -> list[dict]:
    """The figures (see the module docstring); each as :func:`fedray.observe.plots.save_figure`
    describes it."""
    what = _what(groups, runs)
    figures = [_per_round_plot(runs, groups, what, out_dir),
               _cost_plot(runs, groups, what, out_dir, "cum_bytes", "Accuracy vs communication",
                          axis_label("cumulative bytes sent, upload + download", "log scale",
                                     "← cheaper"), log=True)]
    timed = [g for g in groups if all("cum_sim_seconds" in r["rounds"] for r in g["runs"])]
    if timed:  # the virtual clock (fedray.services.fleet): what a deployment would wait for
        longest = max(float(r["rounds"]["cum_sim_seconds"].max()) for g in timed
                      for r in g["runs"])
        unit, scale = (("seconds", 1.0) if longest < 120 else
                       ("minutes", 60.0) if longest < 7200 else ("hours", 3600.0))
        figures.append(_cost_plot(
            runs, timed, what, out_dir, "cum_sim_seconds", "Accuracy vs simulated time",
            axis_label("simulated time on the fleet clock", unit, "← faster"), scale=scale))
    private = [g for g in groups if all("dp_epsilon" in r["rounds"] for r in g["runs"])]
    if private:  # client-level DP (fedray.services.privacy): what each accuracy cost in privacy
        figures.append(_cost_plot(
            runs, private, what, out_dir, "dp_epsilon", "Accuracy vs privacy spent",
            "client-level ε so far (at the run's δ; ← more private)"))
    figures += _attack_plots(groups, what, out_dir)
    figures += _secagg_plots(groups, out_dir)
    tiered = [g for g in groups if all(_tiers(r) for r in g["runs"])]
    if tiered:
        figures.append(_tier_plot(runs, tiered, what, out_dir))
    return figures


def _per_round_plot(runs: list[dict], groups: list[dict], what: str, out_dir: str) -> dict:
    """Global and personalized accuracy against the round, side by side; one run's band is
    its spread over clients, several seeds' bars their spread over seeds."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    seeded = any(len(g["runs"]) > 1 for g in groups)
    for g in groups:
        _draw(axes[0], g["label"], [_frame(r, "global_accuracy") for r in g["runs"]])
        color, curve = _draw(axes[1], g["label"],
                             [_frame(r, "personalized_accuracy") for r in g["runs"]])
        if len(g["runs"]) == 1 and len(curve):  # one run: its spread over clients
            sd = _frame(g["runs"][0], "personalized_accuracy_std").set_index("round")["y"]
            sd = sd.reindex(curve.index).fillna(0).to_numpy(float)
            axes[1].fill_between(curve["x"].to_numpy(float), curve["mean"] - sd,
                                 curve["mean"] + sd, color=color, alpha=0.15)
    for ax in axes:
        _chance_lines(ax, runs)
    spread = "bars: ± sd over seeds" if seeded else ""
    band = "band: ± sd over clients" if any(len(g["runs"]) == 1 for g in groups) else ""
    _finish(axes[0], title="Global model on the global test set", xlabel="round",
            ylabel=ACCURACY)
    _finish(axes[1], title="Personalized: global model on each client's local test split\n"
                           f"(mean over clients; {'; '.join(p for p in (band, spread) if p)})",
            xlabel="round", ylabel=axis_label("personalized accuracy", FRACTION, UP))
    fig.suptitle(f"Accuracy per round: {what}")
    return save_figure(fig, out_dir, "accuracy_vs_round.png")


_COST_FILES = {"cum_bytes": "accuracy_vs_bytes.png", "cum_sim_seconds": "accuracy_vs_sim_time.png",
               "dp_epsilon": "accuracy_vs_epsilon.png"}


def _cost_plot(runs: list[dict], groups: list[dict], what: str, out_dir: str, x: str,
               title: str, xlabel: str, scale: float = 1.0, log: bool = False) -> dict:
    """Global accuracy against the rounds' cumulative cost column ``x`` (bytes sent, the
    fleet clock's seconds, the client-level ε spent), ``x`` divided by ``scale``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for g in groups:
        frames = [_frame(r, "global_accuracy", x) for r in g["runs"]]
        _draw(ax, g["label"], [f.assign(x=f["x"] / scale) for f in frames] if scale != 1.0
              else frames)
    if log:
        ax.set_xscale("log")
    _chance_lines(ax, runs)
    _finish(ax, title=_title(title, what), xlabel=xlabel, ylabel=ACCURACY)
    return save_figure(fig, out_dir, _COST_FILES[x])


def _tier_plot(runs: list[dict], groups: list[dict], what: str, out_dir: str) -> dict:
    """Personalized accuracy per capacity tier against the round (DROD's fleets)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for g in groups:
        for tier in _tiers(g["runs"][0]):
            _draw(ax, f"{g['label']} · {tier}", [_tier_frame(r, tier) for r in g["runs"]])
    _chance_lines(ax, runs)
    _finish(ax, title=_title("Personalized accuracy per capacity tier (mean over the "
                             "tier's evaluated clients)", what),
            xlabel="round", ylabel=axis_label("personalized accuracy", FRACTION, UP))
    return save_figure(fig, out_dir, "accuracy_per_tier.png")


def _attack_plots(groups: list[dict], what: str, out_dir: str) -> list[dict]:
    """Runs with malicious clients (the ``adversary`` section): a backdoor's success rate
    and a robust rule's per-round detection precision and recall against the round."""
    plt = _plt()
    panels = [(col, title, label) for col, title, label in [
        ("attack_success_rate", "Backdoor: triggered test images classified as the target",
         axis_label("attack success rate", "fraction", "↓ better")),
        ("adversary/detection_recall", "Malicious client-rounds the rule excluded",
         axis_label("detection recall", "fraction", UP)),
        ("adversary/detection_precision", "Excluded client-rounds that were malicious",
         axis_label("detection precision", "fraction", UP))]
        if any(col in r["rounds"] and r["rounds"][col].notna().any()
               for g in groups for r in g["runs"])]
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (col, title, label) in zip(axes[0], panels, strict=True):
        for g in groups:
            if all(col in r["rounds"] for r in g["runs"]):
                _draw(ax, g["label"], [_frame(r, col) for r in g["runs"]])
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, title=title, xlabel="round", ylabel=label)
    fig.suptitle(f"Under attack: {what}")
    return [save_figure(fig, out_dir, "attack_vs_round.png")]


SECAGG_PHASES = ("advertise", "share", "masked_input", "unmask")


def _secagg_plots(groups: list[dict], out_dir: str) -> list[dict]:
    """Runs with secure aggregation (``secagg/*`` columns): per round, the bytes of every
    client together — the model's download, the masked input (the upload) and each protocol
    phase stacked on top — and the simulated seconds — the round without SecAgg's phases
    (training, upload) and each phase on top; one row per series (its first run), at most
    four."""
    plt = _plt()
    shown = [g for g in groups if "secagg/advertise_up_bytes" in g["runs"][0]["rounds"]][:4]
    if not shown:
        return []
    fig, axes = plt.subplots(len(shown), 2, figsize=(12, 4.2 * len(shown)), squeeze=False)
    for (left, right), g in zip(axes, shown, strict=True):
        r = g["runs"][0]["rounds"]
        x = r["round"].to_numpy()
        phase_bytes = {ph: (r[f"secagg/{ph}_up_bytes"] + r[f"secagg/{ph}_down_bytes"]
                            ).to_numpy(float) for ph in SECAGG_PHASES}
        layers = {"model download (no SecAgg cost)": r["download_bytes"].to_numpy(float),
                  "masked input = upload": phase_bytes.pop("masked_input")}
        layers |= {f"{ph} messages (SecAgg)": v for ph, v in phase_bytes.items()}
        left.stackplot(x, *layers.values(), labels=list(layers), alpha=0.85)
        _finish(left, title=_title("Bytes per round, all clients", g["label"]),
                xlabel="round", ylabel=axis_label("bytes", "B", "↓ better"))
        secs = {ph: r[f"secagg/{ph}_seconds"].to_numpy(float) for ph in SECAGG_PHASES}
        base = r["sim_seconds"].to_numpy(float) - sum(secs.values())
        right.stackplot(x, base, *secs.values(),
                        labels=["round without SecAgg's phases", "advertise keys (SecAgg)",
                                "share keys (SecAgg)", "mask expansion (SecAgg)",
                                "unmasking (SecAgg)"], alpha=0.85)
        _finish(right, title=_title("Simulated seconds per round", g["label"]),
                xlabel="round", ylabel=axis_label("simulated time", "s", "↓ better"))
    fig.suptitle("Secure aggregation: what it costs")
    return [save_figure(fig, out_dir, "secagg_costs.png")]


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as {dotted key: its value as JSON text}."""
    out: dict[str, str] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def _labels(flats: list[dict[str, str]], keys: list[str], strip: str = "") -> list[str]:
    """Each run's values of ``keys`` as ``key=value, ...`` (``strip`` cut from the keys)."""
    return [", ".join(f"{k.removeprefix(strip)}={json.loads(f[k]) if k in f else None}"
                      for k in keys) for f in flats]


def _heatmap(runs: list[dict], out_dir: str) -> list[dict]:
    """A study of defences × attacks: runs whose configs differ both in ``adversary.*``
    keys (the attack) and in other keys (the defence: method, its parameters, the robust
    rule...), seed and name aside; each pair's final global accuracy, mean over its runs
    (seeds). The labels are the keys that differ, so no two settings share a cell."""
    ran = [r for r in runs if r["config"] and "global_accuracy" in r["rounds"]
           and r["rounds"]["global_accuracy"].notna().any()]
    flats = [_flat({k: v for k, v in r["config"].items() if k not in ("seed", "name",
                                                                       "run_dir")})
             for r in ran]
    varying = sorted(k for k in {k for f in flats for k in f}
                     if len({f.get(k) for f in flats}) > 1)
    attack_keys = [k for k in varying if k.startswith("adversary.")]
    defence_keys = [k for k in varying  # where and how it ran is not a defence
                    if not k.startswith(("adversary.", "runtime.", "tracking."))]
    if not attack_keys or not defence_keys:
        return []
    cells: dict[tuple[str, str], list[float]] = {}
    for r, d, a in zip(ran, _labels(flats, defence_keys), _labels(flats, attack_keys,
                                                                   "adversary."),
                       strict=True):
        cells.setdefault((d, a), []).append(float(r["rounds"]["global_accuracy"].dropna()
                                                  .iloc[-1]))
    defences = list(dict.fromkeys(d for d, _ in cells))
    attacks = list(dict.fromkeys(a for _, a in cells))
    grid = np.full((len(defences), len(attacks)), np.nan)
    for (d, a), v in cells.items():
        grid[defences.index(d), attacks.index(a)] = float(np.mean(v))
    def wrap(labels: list[str]) -> list[str]:  # long key=value lists over a few lines
        return [textwrap.fill(t, 28) for t in labels]

    fig, ax = heatmap(grid, wrap(defences), wrap(attacks), "accuracy (↑ better)")
    ax.set(xlabel="attack", ylabel="defence")
    fig.suptitle("Defences × attacks: final global test accuracy\n(mean over each pair's runs)",
                 fontsize=10)
    return [save_figure(fig, out_dir, "defences_vs_attacks.png")]


def _tiers(run: dict) -> list[str]:
    """The capacity tiers of a run with client evaluations on more than one tier."""
    c = run["clients"]
    if c is None or "eval_accuracy" not in c or c["tier"].nunique() < 2:
        return []
    return sorted(c["tier"].dropna().unique())


def _tier_frame(run: dict, tier: str) -> pd.DataFrame:
    c = run["clients"]
    c = c[(c["tier"] == tier) & c["eval_accuracy"].notna()]
    m = c.groupby("round")["eval_accuracy"].mean()
    return pd.DataFrame({"round": m.index, "x": m.index, "y": m.to_numpy()})


# ----------------------------------------------------------------------------- tables


def _row(run: dict) -> dict[str, Any]:
    r = run["rounds"]
    ev = r[~r["global_accuracy"].isna()]
    last = ev.iloc[-1] if len(ev) else None

    return {
        "run": run["label"], "rounds": int(r["round"].max()),
        "final_global_accuracy": _num(last["global_accuracy"]) if last is not None else None,
        "best_global_accuracy": _num(ev["global_accuracy"].max()) if len(ev) else None,
        "final_personalized_accuracy": _num(last["personalized_accuracy"])
        if last is not None else None,
        "personalized_accuracy_std": _num(last["personalized_accuracy_std"])
        if last is not None else None,
        "total_bytes": _num(r["cum_bytes"].iloc[-1]),
        "upload_bytes_per_round": _num(r["upload_bytes"].mean()),
        **_payload(run),
        "mean_round_seconds": _num(r["seconds"].mean()),
        "simulated_hours": _num(r["cum_sim_seconds"].iloc[-1] / 3600)
        if "cum_sim_seconds" in r else None,
        "client_failures": _num(r["failed"].sum() + r["rejected"].sum()),
        **({"dp_epsilon": _num(r["dp_epsilon"].iloc[-1])} if "dp_epsilon" in r else {}),
    }


def _num(v: Any) -> Any:
    """A JSON number (float or int) of a table value; None for a missing one."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v) if isinstance(v, (float, np.floating)) else int(v)


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


def _group_summary(group: dict, rows: dict[str, dict]) -> dict[str, Any]:
    """A group's runs, seeds and mean / sd / n over its runs of the :data:`GROUPED`
    columns."""
    members = group["runs"]
    metrics = {}
    for col in GROUPED:
        mean, sd, n = mean_sd(rows[r["dir"]].get(col) for r in members)
        metrics[col] = {"mean": mean, "sd": sd, "n": n}
    return {"label": group["label"], "runs": [r["dir"] for r in members],
            "seeds": [r["config"].get("seed") for r in members], "n": len(members),
            "metrics": metrics}


FMT = {"total_bytes": "{:,.0f}", "upload_bytes_per_round": "{:,.0f}",
       "upload_bytes_per_client_round": "{:,.0f}", "compression_ratio": "{:,.1f}×"}


def _cell(col: str, v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return FMT.get(col, "{:.4f}").format(v)
    return f"{v:,}" if isinstance(v, int) else str(v)


def _table(cols: list[str], cells: list[list[str]]) -> str:
    # a "|" inside a cell (a run name) would split it: shown as "/" in Markdown
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def _markdown(rows: list[dict], title: str, plots: list[str], out_dir: str,
              runs: list[dict], groups: list[dict] | None = None) -> str:
    cols = list(dict.fromkeys(c for row in rows for c in row))
    text = f"# {title}\n\n" + _table(cols, [[_cell(c, row.get(c)) for c in cols]
                                           for row in rows])
    text += "\n" + _notes(runs) + "\n"
    if groups:
        head = ["group", "runs", "seeds"] + [f"{c} (mean ± sd)" for c in GROUPED]
        body = []
        for g in groups:
            stats = [_cell(c, m["mean"]) + ("" if m["sd"] is None else
                                            " ± " + _cell(c, m["sd"]))
                     for c, m in g["metrics"].items()]
            body.append([g["label"], str(g["n"]), ", ".join(map(str, g["seeds"]))] + stats)
        text += "\n## Over seeds\n\nRuns whose config is equal except for seed and name, " \
                "as mean ± sample sd over their runs.\n\n" + _table(head, body)
    return text + "\n" + _images(plots, out_dir)


def _notes(runs: list[dict]) -> str:
    """What the table's and the plots' numbers are, with the chance level."""
    parts = ["Accuracies are fractions of test examples predicted correctly (↑ better); "
             "bytes are cumulative upload + download (↓ better)."]
    chances = {(r["dataset"], r["chance"]) for r in runs}
    for dataset, level in sorted(chances, key=str):
        if level is not None:
            parts.append(f"Chance on {dataset}: 1/{round(1 / level)} classes = {level:.3f} "
                         "(dashed line).")
        elif dataset == "blogtext":
            parts.append("On blogtext the accuracy is next-token accuracy: no chance level "
                         "is drawn.")
    return " ".join(parts) + "\n"


# ----------------------------------------------------------------------------- commands


def _write(out_dir: str, md_name: str, html_name: str, text: str) -> tuple[str, str]:
    """REPORT.md-style Markdown and its self-contained HTML twin; returns both paths."""
    md = os.path.join(out_dir, md_name)
    with open(md, "w") as f:
        f.write(text)
    page = os.path.join(out_dir, html_name)
    with open(page, "w", encoding="utf-8") as f:
        f.write(markdown_html(text, out_dir))
    return md, page


def _common_chance(runs: list[dict]) -> float | None:
    levels = {r["chance"] for r in runs}
    return levels.pop() if len(levels) == 1 else None


def report(run_dir: str, out_dir: str | None = None, overwrite: bool = False
           ) -> dict[str, Any]:
    """Plots, REPORT.md and report.html for one run (default into RUN_DIR/report), plus the
    sections its method adds (:meth:`fedray.methods.base.Algorithm.report_sections`:
    ORDERS' norms and ranks, the continual accuracy matrices, ...). report.html holds the
    same tables and every plot inline, so the run can be shared as one file. The result
    names the files and has ``figures`` (what each plot shows: titles, axis labels, chance
    levels, error bars) and ``chance_level`` (None when there is none)."""
    run = _load(run_dir)
    final = out_dir or refuse_links(os.path.abspath(run_dir), "report", "report")
    with staged_dir(final, overwrite, "--out" if out_dir else "report") as stage, \
            _as_data_error(run_dir):
        res = _report(run, stage)
    return _rebased(res, stage, final) | {"run_dir": run_dir}


def _report(run: dict[str, Any], out_dir: str) -> dict[str, Any]:
    run_dir = run["dir"]
    groups = _groups([run], by_seed=False)
    figures = _accuracy_plots([run], groups, out_dir)
    plots = [f["path"] for f in figures]
    row = _row(run)
    text = _markdown([row], f"fedray run: {run['label']}", plots, out_dir, [run])
    diagnostics: dict[str, Any] = {}
    for section in _method_sections(run, out_dir):
        diagnostics[section.key] = section.data
        plots += section.plots
        text += f"\n## {section.title}\n\n{section.markdown}\n\n" + \
            _images(section.plots, out_dir)
    md, page = _write(out_dir, "REPORT.md", "report.html", text)
    return {"run_dir": run_dir, "out_dir": out_dir, "plots": plots, "markdown": md,
            "html": page, "metrics": row, "diagnostics": diagnostics, "figures": figures,
            "chance_level": run["chance"]}


def _method_sections(run: dict[str, Any], out_dir: str) -> list:
    """The report sections of the run's method (none when config.yaml is missing or names a
    method this installation does not have)."""
    name = (run.get("config") or {}).get("algorithm", {}).get("name")
    try:
        method = registry.method(name)
    except ValueError:
        return []
    return method.report_sections(run, out_dir)


def compare(run_dirs: list[str], out_dir: str, overwrite: bool = False) -> dict[str, Any]:
    """Overlay several runs in the same plots, one table and compare.html (tables and plots
    inline). Runs that differ only in seed (and name) are grouped: one series of mean ± sd
    error bars, and a second table; the result's ``groups`` has, per series, its runs, seeds
    and the mean / sd / n of the final and best accuracies and the bytes."""
    runs = [_load(d) for d in run_dirs]
    if len({r["label"] for r in runs}) < len(runs):
        for r in runs:
            r["label"] = os.path.basename(os.path.normpath(r["dir"]))
    with staged_dir(out_dir, overwrite) as stage, _as_data_error(", ".join(run_dirs)):
        res = _compare(runs, stage)
    return _rebased(res, stage, out_dir) | {"runs": run_dirs}


@contextlib.contextmanager
def _as_data_error(where: str) -> Iterator[None]:
    """Drawing reads nothing but the run's own tables: a column missing or of the wrong
    kind there is a damaged run directory (one :class:`StateFileError`), not a crash."""
    try:
        yield
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        if isinstance(e, (StateFileError, ConfigError)):
            raise
        raise StateFileError(where, f"a run directory as fedray writes it (its tables or "
                                    f"files do not hold what a report reads: "
                                    f"{type(e).__name__}: {str(e)[:120]})") from None


def _rebased(obj: Any, stage: str, final: str) -> Any:
    """``obj`` with every path under the staging directory moved to where it landed."""
    if isinstance(obj, str):
        return final + obj[len(stage):] if obj == stage or obj.startswith(stage + os.sep) \
            else obj
    if isinstance(obj, dict):
        return {k: _rebased(v, stage, final) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebased(v, stage, final) for v in obj]
    return obj


def _compare(runs: list[dict[str, Any]], out_dir: str) -> dict[str, Any]:
    run_dirs = [r["dir"] for r in runs]
    groups = _groups(runs, by_seed=True)
    figures = _accuracy_plots(runs, groups, out_dir) + _heatmap(runs, out_dir)
    plots = [f["path"] for f in figures]
    rows = [_row(r) for r in runs]
    by_dir = {r["dir"]: row for r, row in zip(runs, rows, strict=True)}
    summaries = [_group_summary(g, by_dir) for g in groups]
    seeded = [s for s in summaries if s["n"] > 1]
    md, page = _write(out_dir, "COMPARE.md", "compare.html",
                      _markdown(rows, "fedray comparison", plots, out_dir, runs, seeded))
    return {"runs": run_dirs, "out_dir": out_dir, "plots": plots, "markdown": md,
            "html": page, "metrics": rows, "groups": summaries, "figures": figures,
            "chance_level": _common_chance(runs)}
