"""ORDERS study: FedAvg vs FedProx vs ORDERS on four non-IID settings, three models, seeds.

Scale that runs on a 2-core machine: scikit-learn digits (8×8), 20 clients, 10 sampled per
round, 20 rounds, 2 local epochs, SGD lr 0.05, batch 16. Models: MLP (64), CNN (8, 16
channels), LSTM (32 hidden, the 8 image rows as a sequence). Non-IID settings:

- label: Dirichlet(0.3) label skew;
- quantity: client sizes ~ Dirichlet(0.3), labels IID;
- feature: a per-client affine input transform + noise (feature_skew = 1.0), labels IID;
- drift: Dirichlet(0.5) label skew, and from round 11 half of the clients see permuted
  labels (concept drift).

Methods: FedAvg; FedProx (μ = 0.1); ORDERS as written (difference aggregation) with
sigmoid (β = 0.5, γ = N/3) and with inverse weights; and the usable variant
``combine=rank_mean`` (sigmoid rank weights, normalized, all ≥ 0).

Per run: personalized accuracy (global model on each client's local test split, mean over
clients) and its spread across clients, the same after one local fine-tuning epoch, global
test accuracy, rounds to reach the target personalized accuracy, bytes; under drift also
the rounds after the drift until the fine-tuned personalized accuracy regains 90% of its
last pre-drift value (a global model cannot fit both label maps; one local epoch can).

    .venv/bin/python benchmarks/orders_study.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.join(ROOT, "jobs"))
from orders_noniid import MODELS, NONIID  # noqa: E402  (the job's settings, one definition)

BASE = ["rounds=20", "clients.num_clients=20", "clients.fraction=0.5", "local.epochs=2",
        "local.batch_size=16", "local.lr=0.05", "eval.every=2", "eval.finetune_epochs=1",
        "eval.local_before_after=true", "data.dataset=digits",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]"]
METHODS = {
    "fedavg": ["algorithm.name=fedavg"],
    "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.1"],
    "orders_sigmoid": ["algorithm.name=orders", "algorithm.weighting=sigmoid"],
    "orders_inverse": ["algorithm.name=orders", "algorithm.weighting=inverse"],
    "orders_rank_mean": ["algorithm.name=orders", "algorithm.weighting=sigmoid",
                         "algorithm.combine=rank_mean"],
}


def first_round(rounds: pd.DataFrame, col: str, target: float, after: int = 0) -> float:
    hit = rounds[(rounds["round"] > after) & (rounds[col] >= target)]
    return float(hit["round"].iloc[0] - after) if len(hit) else math.nan


def run_one(noniid: str, model: str, method: str, seed: int, target: float, work: str) -> dict:
    from fedray.core.config import load_config
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    cfg = load_config(None, BASE + NONIID[noniid] + MODELS[model] + METHODS[method]
                      + [f"seed={seed}", f"name={noniid}-{model}-{method}-s{seed}"])
    run_dir = os.path.join(work, cfg.name)
    summary = run_experiment(cfg, run_dir, progress=False)
    rounds = read_metrics(run_dir, "rounds").to_pandas()
    ev = rounds.dropna(subset=["personalized_accuracy"])
    last = ev.iloc[-1]
    out = {"noniid": noniid, "model": model, "method": method, "seed": seed,
           "personalized_accuracy": float(last["personalized_accuracy"]),
           "personalized_spread": float(last["personalized_accuracy_std"]),
           "personalized_accuracy_ft": float(last["personalized_accuracy_ft"]),
           "global_accuracy": float(last["global_accuracy"]),
           "rounds_to_target": first_round(ev, "personalized_accuracy", target),
           "total_bytes": int(summary["total_upload_bytes"] + summary["total_download_bytes"]),
           "curve": ev[["round", "personalized_accuracy"]].values.tolist()}
    if noniid == "drift":
        pre = ev[ev["round"] <= 10]["personalized_accuracy_ft"]
        level = 0.9 * float(pre.iloc[-1]) if len(pre) else math.nan
        out["drift_recovery_rounds"] = first_round(ev, "personalized_accuracy_ft", level,
                                                   after=10)
    return out


def table(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby(["model", "noniid", "method"])
    agg = g.agg(pacc=("personalized_accuracy", "mean"), pacc_sd=("personalized_accuracy", "std"),
                spread=("personalized_spread", "mean"),
                pacc_ft=("personalized_accuracy_ft", "mean"),
                gacc=("global_accuracy", "mean"),
                rounds_to_target=("rounds_to_target", "mean"),
                bytes=("total_bytes", "mean"), seeds=("seed", "nunique"))
    if "drift_recovery_rounds" in df:
        agg["drift_recovery"] = g["drift_recovery_rounds"].mean()
    return agg.reset_index()


def markdown(t: pd.DataFrame) -> str:
    cols = ["model", "noniid", "method", "pacc", "pacc_sd", "spread", "pacc_ft", "gacc",
            "rounds_to_target", "drift_recovery", "bytes"]
    cols = [c for c in cols if c in t]
    head = {"pacc": "pers. acc", "pacc_sd": "± sd (seeds)", "spread": "spread (clients)",
            "pacc_ft": "pers. acc +1 FT epoch", "gacc": "global acc",
            "rounds_to_target": "rounds to target", "drift_recovery": "drift recovery rounds",
            "bytes": "MB"}
    lines = ["| " + " | ".join(head.get(c, c) for c in cols) + " |",
             "|" + "---|" * len(cols)]
    for _, r in t.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if c == "bytes":
                cells.append(f"{v / 1e6:.1f}")
            elif isinstance(v, float):
                cells.append("–" if math.isnan(v) else f"{v:.3f}" if c not in (
                    "rounds_to_target", "drift_recovery") else f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claims(t: pd.DataFrame) -> dict:
    """The text's claims, measured: relative personalized-accuracy gain of each ORDERS
    variant over FedAvg and FedProx, and FedProx's / ORDERS' rounds-to-target under drift
    (> 1: ORDERS converges faster)."""
    pacc = t.set_index(["method", "model", "noniid"])["pacc"]
    methods = set(t["method"])
    variants = [v for v in ["orders_sigmoid", "orders_inverse", "orders_rank_mean"]
                if v in methods]
    out: dict = {}
    for variant in variants:
        out[variant] = []
        for base in [b for b in ["fedavg", "fedprox"] if b in methods]:
            rel = (pacc.loc[variant] / pacc.loc[base] - 1.0) * 100
            out[variant].append({"vs": base, "min_%": float(rel.min()),
                                 "max_%": float(rel.max()), "mean_%": float(rel.mean())})
    drift = t[t["noniid"] == "drift"].set_index(["method", "model"])["rounds_to_target"]
    if "fedprox" in methods and len(drift):
        out["drift_speedup_over_fedprox_by_model"] = {
            v: {m: float(drift.loc[("fedprox", m)] / drift.loc[(v, m)])
                for m in drift.loc["fedprox"].index} for v in variants}
    return out


def plot(df: pd.DataFrame, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for model in sorted(df["model"].unique()):
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), sharey=True)
        for ax, noniid in zip(axes, NONIID, strict=True):
            sub = df[(df["model"] == model) & (df["noniid"] == noniid)]
            for method in METHODS:
                curves = [np.array(c) for c in sub[sub["method"] == method]["curve"]]
                if not curves:
                    continue
                r = curves[0][:, 0]
                m = np.mean([c[:, 1] for c in curves], axis=0)
                ax.plot(r, m, marker=".", label=method)
            if noniid == "drift":
                ax.axvline(11, color="grey", ls="--", lw=0.8)
            ax.set(title=f"{model} · {noniid}", xlabel="round")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("personalized accuracy (mean over seeds)")
        axes[-1].legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, f"orders_study_{model}.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--noniid", nargs="+", default=list(NONIID), choices=list(NONIID))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--target", type=float, default=0.8,
                    help="personalized accuracy whose first crossing counts as converged")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "orders_study"))
    args = ap.parse_args()

    import ray
    from tqdm import tqdm

    os.makedirs(args.out, exist_ok=True)
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    rows = []
    grid = [(n, m, a, s) for m in args.models for n in args.noniid for a in args.methods
            for s in args.seeds]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        for n, m, a, s in tqdm(grid, desc="orders study", unit="run"):
            rows.append(run_one(n, m, a, s, args.target, work))
    ray.shutdown()
    df = pd.DataFrame(rows)
    df.drop(columns=["curve"]).to_parquet(os.path.join(args.out, "runs.parquet"))
    t = table(df)
    t.to_parquet(os.path.join(args.out, "table.parquet"))
    plots = plot(df, args.out)
    result = {"table_markdown": markdown(t), "claims": claims(t), "plots": plots,
              "runs": len(rows), "minutes": (time.perf_counter() - t0) / 60}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(result, f, indent=2, default=float)
    print(result["table_markdown"])
    print(json.dumps(result["claims"], indent=1, default=float))


if __name__ == "__main__":
    main()
