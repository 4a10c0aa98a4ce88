"""Attacks × defences study (issue #30): how each robust rule — and ORDERS, whose rank
weights favour the largest updates — holds up when some clients lie.

Setting: scikit-learn digits (8×8) with Dirichlet(0.5) label skew, 50 clients, 10 sampled per
round, 20 rounds, MLP (64), 1 local epoch, SGD lr 0.05, batch 16; the malicious clients are
⌊share · 50⌋ drawn from the seed (so a round holds a varying number of them).

Attacks: none (the malicious clients honest: the rule's cost without an attack), sign flip,
scaling × 10, ALIE, IPM (ε = 0.5), min-max (unit direction), label flip (c → 9 − c), and a
backdoor (3×3 trigger on half of each attacker's samples, target 0, no boost).

Rules: FedAvg (weighted mean), median, trimmed mean (β = 0.2), Krum (f = 3: the most n = 10
allows), Multi-Krum (f = 3, m = 7), Bulyan (f = 1: n ≥ 4f + 3), norm bounding (M = 0.2,
about the median honest update norm, 0.17-0.19), centered clipping (τ = 0.2, L = 1),
FLTrust (100 root samples), ORDERS as written with sigmoid and with inverse rank weights,
and ORDERS' usable variant ``combine=rank_mean`` (sigmoid rank weights, normalized).

Per run: final clean (global test) accuracy, the backdoor's attack success rate, detection
precision and recall (a client-round counts as detected when the rule excluded it), wall
seconds. Rows are appended to ``--out``/rows.jsonl as they finish (a re-run skips the done
ones); ``--table`` writes the tables and the heatmaps from them.

    .venv/bin/python benchmarks/robust_study.py --seeds 0 1 2 --shares 0.1 0.2 0.3
    .venv/bin/python benchmarks/robust_study.py --table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np
import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE = ["rounds=20", "clients.num_clients=50", "clients.per_round=10", "local.epochs=1",
        "local.batch_size=16", "local.lr=0.05", "model.hidden=[64]", "eval.every=5",
        "eval.clients=none", "data.dataset=digits", "data.partition=dirichlet",
        "data.alpha=0.5", "runtime.keep_warm=true",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]"]
ATTACKS = {
    "none": ["adversary.attack=none"],
    "sign_flip": ["adversary.attack=sign_flip"],
    "scale_x10": ["adversary.attack=scale", "adversary.scale=10"],
    "alie": ["adversary.attack=alie"],
    "ipm": ["adversary.attack=ipm", "adversary.eps=0.5"],
    "min_max": ["adversary.attack=min_max"],
    "label_flip": ["adversary.attack=label_flip"],
    "backdoor": ["adversary.attack=backdoor", "adversary.poison_fraction=0.5"],
}
RULES = {
    "fedavg": [],
    "median": ["robust.rule=median"],
    "trimmed_mean": ["robust.rule=trimmed_mean", "robust.trim=0.2"],
    "krum": ["robust.rule=krum", "robust.f=3"],
    "multi_krum": ["robust.rule=multi_krum", "robust.f=3"],
    "bulyan": ["robust.rule=bulyan", "robust.f=1"],
    "norm_bound": ["robust.rule=norm_bound", "robust.bound=0.2"],
    "centered_clip": ["robust.rule=centered_clip", "robust.tau=0.2"],
    "fltrust": ["robust.rule=fltrust", "robust.root_samples=100"],
    "orders_sigmoid": ["algorithm.name=orders", "algorithm.weighting=sigmoid"],
    "orders_inverse": ["algorithm.name=orders", "algorithm.weighting=inverse"],
    "orders_rank_mean": ["algorithm.name=orders", "algorithm.weighting=sigmoid",
                         "algorithm.combine=rank_mean"],
}


def key(row: dict) -> tuple:
    return row["attack"], row["rule"], row["share"], row["seed"]


def run_one(attack: str, rule: str, share: float, seed: int, work: str) -> dict:
    from fedray.core.config import load_config
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    name = f"{attack}-{rule}-{share:g}-s{seed}"
    cfg = load_config(None, BASE + ATTACKS[attack] + RULES[rule] + [
        f"adversary.fraction={share}", f"seed={seed}", f"name={name}"])
    run_dir = os.path.join(work, name)
    t = time.perf_counter()
    summary = run_experiment(cfg, run_dir, progress=False)
    rounds = read_metrics(run_dir, "rounds").to_pandas()
    ev = rounds.dropna(subset=["global_accuracy"])
    adv = summary["adversary"]
    return {"attack": attack, "rule": rule, "share": share, "seed": seed,
            "accuracy": float(ev["global_accuracy"].iloc[-1]),
            "attack_success_rate": adv.get("final_attack_success_rate"),
            "detection_precision": adv.get("detection_precision"),
            "detection_recall": adv.get("detection_recall"),
            "malicious_client_rounds": adv["malicious_client_rounds"],
            "curve": ev[["round", "global_accuracy"]].values.tolist(),
            "seconds": time.perf_counter() - t}


def load(path: str) -> pd.DataFrame:
    with open(path) as f:
        return pd.DataFrame([json.loads(line) for line in f if line.strip()])


def grid(df: pd.DataFrame, value: str, share: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(mean, sd over seeds) of ``value`` at ``share``: rules × attacks, in study order."""
    sub = df[np.isclose(df["share"], share)]
    g = sub.groupby(["rule", "attack"])[value]
    mean = g.mean().unstack().reindex(index=[r for r in RULES if r in set(sub["rule"])],
                                      columns=[a for a in ATTACKS if a in set(sub["attack"])])
    return mean, g.std().unstack().reindex_like(mean)


def markdown(mean: pd.DataFrame, sd: pd.DataFrame, seeds: int) -> str:
    lines = ["| rule | " + " | ".join(mean.columns) + " |", "|---" * (len(mean.columns) + 1)
             + "|"]
    for rule, row in mean.iterrows():
        cells = []
        for a, v in row.items():
            s = sd.loc[rule, a]
            cells.append("–" if v is None or (isinstance(v, float) and math.isnan(v)) else
                         f"{v:.3f}" + (f" ± {s:.3f}" if seeds > 1 and not math.isnan(s) else ""))
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heatmap(mean: pd.DataFrame, title: str, path: str) -> None:
    from fedray.observe.plots import heatmap as draw
    from fedray.observe.plots import save

    fig, ax = draw(mean.values, list(mean.index), list(mean.columns), "accuracy (↑ better)",
                   fontsize=9)
    ax.set_title(title, fontsize=9)
    save(fig, os.path.dirname(path), os.path.basename(path), dpi=110)


def tables(df: pd.DataFrame, out: str) -> str:
    """RESULTS.md's text: per share, clean accuracy (rules × attacks), the backdoor's
    success rate and the detection precision / recall; heatmaps written next to it."""
    seeds = int(df["seed"].nunique())
    parts = []
    for share in sorted(df["share"].unique()):
        acc, sd = grid(df, "accuracy", share)
        heatmap(acc, f"final clean accuracy, {share:.0%} malicious ({seeds} seed(s))",
                os.path.join(out, f"robust_accuracy_{share:g}.png"))
        parts += [f"#### {share:.0%} of the clients malicious: final clean accuracy", "",
                  markdown(acc, sd, seeds), ""]
        bd = df[(df["attack"] == "backdoor") & np.isclose(df["share"], share)]
        if len(bd):
            g = bd.groupby("rule")[["attack_success_rate", "accuracy"]].mean()
            parts += ["backdoor success rate (clean accuracy): " + ", ".join(
                f"{r} {g.loc[r, 'attack_success_rate']:.2f} ({g.loc[r, 'accuracy']:.2f})"
                for r in RULES if r in g.index), ""]
        det = df[np.isclose(df["share"], share) & df["detection_recall"].notna()
                 & (df["attack"] != "none")]
        if len(det):
            g = det.groupby("rule")[["detection_precision", "detection_recall"]].mean()
            parts += ["detection precision / recall (excluded client-rounds, mean over "
                      "attacks): " + ", ".join(
                          f"{r} {g.loc[r, 'detection_precision']:.2f} / "
                          f"{g.loc[r, 'detection_recall']:.2f}" for r in RULES if r in g.index),
                      ""]
    text = "\n".join(parts)
    with open(os.path.join(out, "TABLES.md"), "w") as f:
        f.write(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    ap.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "robust_study"))
    ap.add_argument("--table", action="store_true", help="only write the tables and heatmaps")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "rows.jsonl")
    done = {key(r) for _, r in load(path).iterrows()} if os.path.exists(path) else set()
    todo = [(a, r, s, seed) for s in args.shares for seed in args.seeds for a in args.attacks
            for r in args.rules if (a, r, s, seed) not in done]
    if not args.table and todo:
        import ray
        from tqdm import tqdm

        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            with tempfile.TemporaryDirectory() as work:
                for attack, rule, share, seed in tqdm(todo, desc="robust study"):
                    row = run_one(attack, rule, share, seed, work)
                    with open(path, "a") as f:
                        f.write(json.dumps(row) + "\n")
        finally:
            from fedray.runtime.warm import release_warm

            release_warm()
            ray.shutdown()
    if os.path.exists(path):
        print(tables(load(path), args.out))


if __name__ == "__main__":
    main()
