"""Accuracy against the client-level privacy budget: DP-FedAvg on full weights against FLITE's
1,280-value latent channel, ε ∈ {∞, 8, 4, 1}, on scikit-learn digits, 3 seeds.

The question the FLITE paper leaves open: does a 1,280-value latent upload pay less for
privacy than full weights? The Gaussian noise on the mean has the same std z·C/K per
coordinate for both, but FLITE's update lives in D = 1,280 coordinates against the model's
~175,000, so the noise norm is √(175,000/1,280) ≈ 12× smaller relative to the clip.

Setting: the FLITE study's narrow ResNet-18-GN (width 8, frozen orthogonal head) pretrained
centrally on 30% of the training data; N = 700 clients (IID, ~2 samples each), K = 70 per
round (q = 0.1, Poisson sampling, RDP accountant, δ = 1e-5), 20 rounds of 1 local
epoch; σ calibrated before each run to the target ε after 20 rounds (``dp.target_epsilon``);
adaptive clipping to the median update norm (Andrew et al. 2021; initial C = 0.5,
η_C = 0.2, count noise σ_b = K/20) so that neither method's clip is hand-tuned; ε = ∞ is
the same run without DP (no clipping, no noise). FedAvg: SGD lr 0.01 as in the FLITE study;
FLITE: d = 64, r = 32, Adam 1e-2.

    .venv/bin/python benchmarks/dp_study.py --seeds 0 1 2
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
CLIENTS, PER_ROUND, ROUNDS = 700, 70, 20
# every run tests on the split of seed 0, the split the base is pretrained on (its training
# samples are never among the test samples; the seed drives the partition, sampling and noise)
SPLIT = ["data.dataset=digits", "data.split_seed=0"]
BASE = SPLIT + [f"rounds={ROUNDS}", "local.epochs=1", "local.batch_size=16",
        f"clients.num_clients={CLIENTS}", f"clients.per_round={PER_ROUND}",
        "data.partition=iid", "data.min_samples=2", "eval.every=5", "eval.clients=none",
        "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]"]
METHODS = {"fedavg": ["algorithm.name=fedavg", "local.lr=0.01"],
           "flite": ["algorithm.name=flite", "algorithm.d=64", "algorithm.r=32"]}
DP = ["dp.enabled=true", "dp.sampling=poisson", "dp.adaptive_clip=true", "dp.clip_norm=0.5"]
EPSILONS = [math.inf, 8.0, 4.0, 1.0]
BASE_RECIPE = SPLIT + ["seed=0"] + MODEL + PRETRAIN


def run_overrides(method: str, eps: float, seed: int, base: str) -> list[str]:
    """The config of one run of the study (``tests/test_honest_split.py`` checks them)."""
    dp = [] if math.isinf(eps) else DP + [f"dp.target_epsilon={eps}"]
    return BASE + MODEL + METHODS[method] + dp + [f"seed={seed}", f"algorithm.base={base}"]


def run_one(method: str, eps: float, seed: int, base: str, work: str) -> dict:
    from fedray.core.config import load_config
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    name = f"dp-{method}-eps{eps:g}-s{seed}"
    cfg = load_config(None, run_overrides(method, eps, seed, base) + [f"name={name}"])
    run_dir = os.path.join(work, name)
    summary = run_experiment(cfg, run_dir, progress=False)
    rounds = read_metrics(run_dir, "rounds").to_pandas()
    clients = read_metrics(run_dir, "clients").to_pandas()
    ups = clients.loc[clients["upload_bytes"] > 0, "upload_bytes"]
    dp_sum = summary.get("dp") or {}
    return {"method": method, "epsilon_target": eps, "seed": seed,
            "accuracy": float(rounds["global_accuracy"].iloc[-1]),
            "epsilon": dp_sum.get("epsilon", math.inf) if dp_sum else math.inf,
            "noise_multiplier": dp_sum.get("noise_multiplier", 0.0),
            "final_clip": dp_sum.get("clip_norm", math.nan),
            "upload_bytes_per_client_round": float(
                summary["total_upload_bytes"]) / (ROUNDS * PER_ROUND),
            "upload_bytes_per_upload": float(ups.mean()) if len(ups) else 0.0,
            "uploads": int(len(ups)),
            "parameters": summary["parameters"]}


def plot(df: pd.DataFrame, out_dir: str, base_acc: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labels = ["∞" if math.isinf(e) else f"{e:g}" for e in EPSILONS]
    for method, marker in (("fedavg", "o"), ("flite", "*")):
        sub = df[df["method"] == method].groupby("epsilon_target")["accuracy"]
        mean, sd = sub.mean(), sub.std()
        ax.errorbar(range(len(EPSILONS)), [mean[e] for e in EPSILONS],
                    yerr=[sd[e] for e in EPSILONS], fmt=f"-{marker}", capsize=3,
                    label={"fedavg": "DP-FedAvg, full weights",
                           "flite": "FLITE, 1,280-value latent"}[method])
    ax.axhline(base_acc, color="grey", ls="--", lw=0.8, label="pretrained base (no FL)")
    ax.axhline(0.1, color="black", ls=":", lw=0.8, label="chance (10 classes)")
    ax.set_xticks(range(len(EPSILONS)), labels)
    ax.set(xlabel="client-level ε after 20 rounds (δ = 1e-5) → more private",
           ylabel="global test accuracy ↑ (mean ± sd, 3 seeds)",
           title=f"Privacy cost on digits: N = {CLIENTS}, K = {PER_ROUND}/round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "dp_accuracy_vs_epsilon.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "dp_study"))
    ap.add_argument("--table-only", action="store_true",
                    help="redraw the table and plot from OUT/runs.parquet (no runs)")
    args = ap.parse_args()

    import ray
    from tqdm import tqdm

    from fedray.core.config import load_config
    from fedray.models.pretrain import pretrain

    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    rows = []
    if args.table_only:
        df = pd.read_parquet(os.path.join(args.out, "runs.parquet"))
        with tempfile.TemporaryDirectory() as work:
            base_acc = pretrain(load_config(None, BASE_RECIPE), os.path.join(work, "base"),
                                progress=False)["test_accuracy"]
        return write(df, base_acc, args.out, t0)
    with tempfile.TemporaryDirectory() as work:
        base = os.path.join(work, "base")
        base_acc = pretrain(load_config(None, BASE_RECIPE), base, progress=False)["test_accuracy"]
        grid = [(m, e, s) for m in METHODS for e in EPSILONS for s in args.seeds]
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        for method, eps, seed in tqdm(grid, desc="dp study", unit="run"):
            rows.append(run_one(method, eps, seed, base, work))
        ray.shutdown()
    df = pd.DataFrame(rows)
    df.to_parquet(os.path.join(args.out, "runs.parquet"))
    write(df, base_acc, args.out, t0)


def write(df: pd.DataFrame, base_acc: float, out: str, t0: float) -> None:
    """The study's table (summary.json, printed) and plot from its runs."""
    table = df.groupby(["method", "epsilon_target"], sort=False).agg(
        accuracy=("accuracy", "mean"), sd=("accuracy", "std"), epsilon=("epsilon", "max"),
        z=("noise_multiplier", "mean"), final_clip=("final_clip", "mean"),
        up_bytes=("upload_bytes_per_client_round", "mean"),
        params=("parameters", "first")).reset_index()
    lines = ["| method | target ε | ε reached | noise multiplier z | final clip C | "
             "accuracy (mean ± sd) | upload B / (rounds × K) |", "|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        inf = math.isinf(r["epsilon_target"])
        lines.append(f"| {r['method']} | {'∞' if inf else f'{r.epsilon_target:g}'} | "
                     f"{'∞' if inf else f'{r.epsilon:.3f}'} | {r.z:.3f} | "
                     f"{'–' if inf else f'{r.final_clip:.3g}'} | {r.accuracy:.4f} ± {r.sd:.4f} | "
                     f"{r.up_bytes:,.0f} |")
    result = {"base_accuracy": base_acc, "table": "\n".join(lines),
              "plot": plot(df, out, base_acc), "runs": len(df),
              "minutes": (time.perf_counter() - t0) / 60}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(result, f, indent=2, default=float)
    print(result["table"])
    print(f"base {base_acc:.4f}; {len(df)} runs in {result['minutes']:.1f} min")


if __name__ == "__main__":
    main()
