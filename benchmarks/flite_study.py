"""FLITE study at a scale this machine runs: the bandwidth–accuracy Pareto of latent fine-
tuning against full-weight FedAvg (fp32/int8/int4), PowerSGD (rank 2, 8) and top-k (1%,
10%), all on the same centrally pretrained base and frozen orthogonal head.

Setting: scikit-learn digits (8×8), a narrow ResNet-18 with GroupNorm (width 8, 20 conv
layers, CIFAR stem) pretrained centrally on 30% of the training data (all classes, 20
epochs, the paper's SGD recipe scaled down), then K clients fine-tune federatedly on all of
it for 10 rounds of 1 local epoch. FLITE: d ∈ {16, 64, 256} (r = min(d, 32)), Adam 1e-2,
and d = 64 with int8/int4 latents. Partitions: IID, Dirichlet α = 0.5 and 0.1; K = 8, and
K ∈ {4, 16} for FLITE d = 64 and FedAvg at α = 0.5; the frozen-head ablation (orthogonal /
Kaiming-frozen / trainable head, each its own pretrained base). Bytes per client per round
exclude the base, which every method downloads once identically.

    .venv/bin/python benchmarks/flite_study.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["model.name=resnet18", "model.width=8"]
PRETRAIN = ["pretrain.epochs=20", "pretrain.batch_size=64", "pretrain.fraction=0.3",
            "pretrain.warmup_epochs=2"]
BASE = ["data.dataset=digits", "rounds=10", "local.epochs=1", "local.batch_size=16",
        "clients.fraction=1.0", "eval.every=1", "eval.clients=none",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]"]
PARTITIONS = {"iid": ["data.partition=iid"],
              "dir0.5": ["data.partition=dirichlet", "data.alpha=0.5"],
              "dir0.1": ["data.partition=dirichlet", "data.alpha=0.1"]}
SGD = ["local.lr=0.01"]
METHODS = {
    "flite_d16": ["algorithm.name=flite", "algorithm.d=16", "algorithm.r=16"],
    "flite_d64": ["algorithm.name=flite", "algorithm.d=64", "algorithm.r=32"],
    "flite_d256": ["algorithm.name=flite", "algorithm.d=256", "algorithm.r=32"],
    "flite_d64_int8": ["algorithm.name=flite", "algorithm.d=64", "algorithm.r=32",
                       "payload.upload=int8"],
    "flite_d64_int4": ["algorithm.name=flite", "algorithm.d=64", "algorithm.r=32",
                       "payload.upload=int4"],
    "fedavg_fp32": ["algorithm.name=fedavg"] + SGD,
    "fedavg_int8": ["algorithm.name=fedavg", "payload.upload=int8"] + SGD,
    "fedavg_int4": ["algorithm.name=fedavg", "payload.upload=int4"] + SGD,
    "powersgd_r2": ["algorithm.name=powersgd", "algorithm.rank=2"] + SGD,
    "powersgd_r8": ["algorithm.name=powersgd", "algorithm.rank=8"] + SGD,
    "topk_1pct": ["algorithm.name=topk", "algorithm.density=0.01"] + SGD,
    "topk_10pct": ["algorithm.name=topk", "algorithm.density=0.1"] + SGD,
}


def make_base(head: str, out: str) -> dict:
    from fedray.config import load_config
    from fedray.pretrain import pretrain

    cfg = load_config(None, ["data.dataset=digits", "seed=0", f"pretrain.head={head}"]
                      + MODEL + PRETRAIN)
    return pretrain(cfg, out, progress=False)


def run_one(study: str, partition: str, method: str, seed: int, k: int, base: str,
            work: str) -> dict:
    from fedray.config import load_config
    from fedray.metrics import read_metrics
    from fedray.runtime import run_experiment

    name = f"{study}-{partition}-{method}-k{k}-s{seed}"
    cfg = load_config(None, BASE + MODEL + PARTITIONS[partition] + METHODS[method] + [
        f"seed={seed}", f"clients.num_clients={k}", f"algorithm.base={base}", f"name={name}"])
    run_dir = os.path.join(work, name)
    summary = run_experiment(cfg, run_dir, progress=False)
    rounds = read_metrics(run_dir, "rounds").to_pandas()
    clients = read_metrics(run_dir, "clients").to_pandas()
    later = clients[clients["round"] > 1]
    per_round = float(later["upload_bytes"].mean() + later["download_bytes"].mean())
    row = {"study": study, "partition": partition, "method": method, "seed": seed,
           "clients": k, "accuracy": float(rounds["global_accuracy"].iloc[-1]),
           "bytes_per_client_round": per_round,
           "upload_bytes_per_client_round": float(later["upload_bytes"].mean()),
           "model_parameters": summary["model_parameters"],
           "curve": list(zip(rounds["round"].tolist(), rounds["global_accuracy"].tolist(),
                             strict=True))}
    if "policy/identity_error" in rounds:
        row["identity_error"] = float(rounds["policy/identity_error"].max())
    return row


def plot(df: pd.DataFrame, out_dir: str, base_acc: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = df[(df["study"] == "main")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for ax, part in zip(axes, PARTITIONS, strict=True):
        sub = main[main["partition"] == part].groupby("method").agg(
            acc=("accuracy", "mean"), sd=("accuracy", "std"),
            bpc=("bytes_per_client_round", "mean"))
        for method, r in sub.iterrows():
            marker = "*" if method.startswith("flite") else "o"
            ax.errorbar(r["bpc"] * 10, r["acc"], yerr=r["sd"], fmt=marker, ms=9 if marker == "*"
                        else 6, capsize=3, label=method)
        ax.axhline(base_acc, color="grey", ls="--", lw=0.8, label="pretrained base")
        ax.set_xscale("log")
        ax.set(title=f"{part}, K = 8", xlabel="bytes per client over 10 rounds (up + down)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("global test accuracy (mean ± sd over seeds)")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out_dir, "flite_pareto.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(t: pd.DataFrame, cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in t.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float):
                cells.append("–" if math.isnan(v) else f"{v:,.0f}" if abs(v) >= 100
                             else f"{v:.4f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--partitions", nargs="+", default=list(PARTITIONS),
                    choices=list(PARTITIONS))
    ap.add_argument("--no-sweeps", action="store_true", help="skip the K and head studies")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "flite_study"))
    args = ap.parse_args()

    import ray
    from tqdm import tqdm

    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    rows, bases = [], {}
    with tempfile.TemporaryDirectory() as work:
        heads = ["orthogonal"] if args.no_sweeps else ["orthogonal", "kaiming", "trainable"]
        for head in heads:
            path = os.path.join(work, f"base-{head}")
            bases[head] = (path, make_base(head, path)["test_accuracy"])
        grid = [("main", p, m, s, 8, "orthogonal") for p in args.partitions
                for m in args.methods for s in args.seeds]
        if not args.no_sweeps:
            grid += [("clients", "dir0.5", m, s, k, "orthogonal") for k in (4, 16)
                     for m in ("flite_d64", "fedavg_fp32") for s in args.seeds]
            grid += [(f"head_{h}", "dir0.5", m, s, 8, h) for h in ("kaiming", "trainable")
                     for m in ("flite_d64", "fedavg_fp32") for s in args.seeds]
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        for study, part, method, seed, k, head in tqdm(grid, desc="flite study", unit="run"):
            row = run_one(study, part, method, seed, k, bases[head][0], work)
            row["head"] = head
            rows.append(row)
        ray.shutdown()
    df = pd.DataFrame(rows)
    df.drop(columns=["curve"]).to_parquet(os.path.join(args.out, "runs.parquet"))
    base_acc = bases["orthogonal"][1]
    pareto = plot(df, args.out, base_acc)
    main_t = df[df["study"] == "main"].groupby(["partition", "method"]).agg(
        accuracy=("accuracy", "mean"), sd=("accuracy", "std"),
        up_bytes=("upload_bytes_per_client_round", "mean"),
        bytes=("bytes_per_client_round", "mean"), params=("model_parameters", "first")
    ).reset_index()
    main_t["compression"] = 4 * main_t["params"] / main_t["up_bytes"]
    result = {
        "base_accuracy": {h: a for h, (_, a) in bases.items()},
        "main": markdown(main_t, ["partition", "method", "accuracy", "sd", "up_bytes",
                                  "bytes", "compression"]),
        "identity_error_max": float(df["identity_error"].max()) if "identity_error" in df
        else None, "pareto": pareto, "runs": len(rows),
        "minutes": (time.perf_counter() - t0) / 60}
    if not args.no_sweeps:
        sweep = df[(df["partition"] == "dir0.5") & df["method"].isin(["flite_d64",
                                                                       "fedavg_fp32"])]
        k_t = sweep[sweep["head"] == "orthogonal"].groupby(["clients", "method"]).agg(
            accuracy=("accuracy", "mean"), sd=("accuracy", "std")).reset_index()
        h_t = sweep[sweep["clients"] == 8].groupby(["head", "method"]).agg(
            accuracy=("accuracy", "mean"), sd=("accuracy", "std")).reset_index()
        result["clients"] = markdown(k_t, ["clients", "method", "accuracy", "sd"])
        result["heads"] = markdown(h_t, ["head", "method", "accuracy", "sd"])
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(result, f, indent=2, default=float)
    for key in ("main", "clients", "heads"):
        if key in result:
            print(result[key], "\n")
    print(json.dumps({k: result[k] for k in ("base_accuracy", "identity_error_max", "runs",
                                             "minutes")}, default=float))


if __name__ == "__main__":
    main()
