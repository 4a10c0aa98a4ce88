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

Issue #16 (FLITE like-for-like) adds:

* ``fedavg_int4w`` — textbook int4 FedAvg of *weights*: each client uploads the int4 codes
  of its local weights θ_i (``payload.transforms=[weights, int4]``, no error feedback) and
  the server averages the dequantized weights; ``fedavg_int4`` quantizes the update Δ_i.
  The paper's "int4 full-weight FedAvg collapses to chance" (§5.9, Table 5) is about the
  former.
* ``rsweep`` — r ∈ {8, 16, 32, 64} at d = 64 (``--r-values``; r = 32 is ``flite_d64``).
* K = 32 in the ``clients`` sweep (``--clients-k``, default 4 16 32).
* ``budget`` — a fixed per-client upload budget (the paper's §5.5 / App. 0.A.1 view, there
  200 MB on CIFAR-10 = one full-weight round): B = the upload of one fp32 FedAvg round per
  client, measured in this run; each method runs ⌊B / its per-round upload⌋ rounds, capped
  at ``--budget-cap`` (default 10 = the main study's horizon; FLITE d = 64 would afford
  136), and the table reports accuracy at (at most) equal cumulative upload bytes. A
  method's first n rounds are read from a cached longer run of it when there is one.

Runs are cached under ``--cache`` (default ``OUT/runs``, one JSON per run, keyed by its
overrides and the base's recipe, so a rerun or another study reuses finished runs), and so
are the pretrained bases. ``--studies`` picks the parts and ``--tag`` suffixes the output
files, so a partial study does not overwrite the full one's.

    .venv/bin/python benchmarks/flite_study.py --seeds 0 1 2
    .venv/bin/python benchmarks/flite_study.py --seeds 0 1 2 --tag issue16 \
        --studies main rsweep clients budget --methods fedavg_fp32 fedavg_int4 fedavg_int4w \
        --clients-k 32
"""

from __future__ import annotations

import argparse
import hashlib
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
# every run tests on the split of seed 0, the split the bases are pretrained on (no base ever
# saw a test sample; the seed drives the partition, sampling and initialisation)
SPLIT = ["data.dataset=digits", "data.split_seed=0"]
BASE = SPLIT + ["rounds=10", "local.epochs=1", "local.batch_size=16",
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
    # int4 of the weights θ_i, not of Δ_i: the paper's "int4 full-weight FedAvg" (§5.9)
    "fedavg_int4w": ["algorithm.name=fedavg", "payload.transforms=[weights, int4]",
                     "payload.error_feedback=false"] + SGD,
    "powersgd_r2": ["algorithm.name=powersgd", "algorithm.rank=2"] + SGD,
    "powersgd_r8": ["algorithm.name=powersgd", "algorithm.rank=8"] + SGD,
    "topk_1pct": ["algorithm.name=topk", "algorithm.density=0.01"] + SGD,
    "topk_10pct": ["algorithm.name=topk", "algorithm.density=0.1"] + SGD,
}
R_VALUES = (8, 16, 32, 64)
for _r in R_VALUES:  # the r sweep at d = 64 (FLITE App. 0.F sweeps r at d = 256)
    if _r != 32:
        METHODS[f"flite_d64_r{_r}"] = ["algorithm.name=flite", "algorithm.d=64",
                                       f"algorithm.r={_r}"]
BUDGET_METHODS = ["fedavg_fp32", "fedavg_int8", "fedavg_int4", "fedavg_int4w", "powersgd_r2",
                  "powersgd_r8", "topk_1pct", "topk_10pct", "flite_d64", "flite_d64_int4"]
STUDIES = ("main", "clients", "heads", "rsweep", "budget")


def r_method(r: int) -> str:
    return "flite_d64" if r == 32 else f"flite_d64_r{r}"


def base_overrides(head: str, model: list[str] = MODEL) -> list[str]:
    return SPLIT + ["seed=0", f"pretrain.head={head}"] + model + PRETRAIN


def _digest(items: list[str]) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:12]


def make_base(head: str, out: str, model: list[str] = MODEL) -> dict:
    """Pretrain the base of ``head`` into ``out``, or read it back when ``out`` holds one
    (a cached base: same recipe, same seed, so the same weights)."""
    from fedray.core.config import load_config
    from fedray.core.storage import Storage
    from fedray.models.pretrain import load_base, pretrain

    if Storage(out).exists("base.json"):
        return load_base(out)[1]
    cfg = load_config(None, base_overrides(head, model))
    with tempfile.TemporaryDirectory() as tmp:  # a half-written base never lands in out
        meta = pretrain(cfg, os.path.join(tmp, "base"), progress=False)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        os.replace(os.path.join(tmp, "base"), out)
    return meta


def quantized_base_accuracy(base: str, transforms: list[str], model_overrides: list[str] = MODEL
                            ) -> float:
    """Global test accuracy of the base after one pass of its uploaded (trainable) tensors
    through ``transforms`` — e.g. ``["weights", "int4"]``: what int4 weight-FedAvg's server
    would hold if every client sent the base unchanged (the quantization floor alone)."""
    import numpy as np

    from fedray.core.config import load_config
    from fedray.data import load_dataset
    from fedray.methods.fedavg.method import apply_base
    from fedray.models.pretrain import build_base_model, load_base
    from fedray.models.training import evaluate, get_state, set_state
    from fedray.wire.transforms import TransformChain, parse_transforms

    cfg = load_config(None, BASE + model_overrides)
    data = load_dataset(cfg.data, cfg.seed)
    model = build_base_model(cfg, data.input_shape, data.num_classes)
    apply_base(model, base, cfg.model)
    state = get_state(model)
    shapes = {n: state[n].shape for n, q in model.named_parameters() if q.requires_grad}
    chain = TransformChain(parse_transforms(transforms), error_feedback=False)
    zeros = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    upload = chain.client(zeros, shapes, None, seed=0, round=1, client=0, reference=state)[0]
    delta = chain.server(upload, shapes, reference=state)
    set_state(model, {k: v + delta[k] if k in delta else v for k, v in state.items()})
    assert load_base(base)[1]["model"] == cfg.model
    return float(evaluate(model, data.x_test, data.y_test)["accuracy"])


def _cache_path(cache: str | None, partition: str, method: str, seed: int, k: int,
                head: str, rounds: int) -> tuple[str, list[str], str | None]:
    name = f"{partition}-{method}-k{k}-s{seed}" + (f"-R{rounds}" if rounds != 10 else "")
    overrides = BASE + MODEL + PARTITIONS[partition] + METHODS[method] + [
        f"seed={seed}", f"clients.num_clients={k}", f"rounds={rounds}"]
    key = f"{name}-{head}-{_digest(overrides + base_overrides(head))}"
    return name, overrides, os.path.join(cache, key + ".json") if cache else None


def run_one(study: str, partition: str, method: str, seed: int, k: int, base: str,
            work: str, *, head: str = "orthogonal", rounds: int = 10,
            cache: str | None = None, prefix_of: int = 0) -> dict:
    """One federated run's result row, read from ``cache`` when the same overrides (and the
    same base recipe) ran before; ``study`` only labels the row.

    ``prefix_of``: also accept a cached run of the same configuration with more rounds (up
    to ``prefix_of``) and report its first ``rounds`` rounds — the same thing, since nothing
    in a run depends on how many rounds follow (client sampling and every draw come from
    (seed, round, client); learning rates are constant across rounds)."""
    from fedray.core.config import load_config
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    name, overrides, path = _cache_path(cache, partition, method, seed, k, head, rounds)
    if path and os.path.exists(path):
        with open(path) as f:
            row = json.load(f)
        return row | {"study": study}
    for longer in range(rounds + 1, prefix_of + 1):
        longer_path = _cache_path(cache, partition, method, seed, k, head, longer)[2]
        if longer_path and os.path.exists(longer_path):
            with open(longer_path) as f:
                row = json.load(f)
            per_round = row["upload_bytes_per_client_total"] / longer
            return row | {"study": study, "rounds": rounds, "prefix_of": longer,
                          "accuracy": float(dict(row["curve"])[rounds]),
                          "curve": row["curve"][:rounds],
                          "upload_bytes_per_client_total": per_round * rounds}
    cfg = load_config(None, overrides + [f"algorithm.base={base}", f"name={name}"])
    run_dir = os.path.join(work, f"{study}-{name}-{head}")
    t0 = time.perf_counter()
    summary = run_experiment(cfg, run_dir, progress=False)
    seconds = time.perf_counter() - t0
    table = read_metrics(run_dir, "rounds").to_pandas()
    clients = read_metrics(run_dir, "clients").to_pandas()
    trained = clients[clients["sampled"]] if "sampled" in clients else clients
    later = trained[trained["round"] > 1]
    per_round = float(later["upload_bytes"].mean() + later["download_bytes"].mean()) \
        if len(later) else float("nan")
    row = {"study": study, "partition": partition, "method": method, "seed": seed,
           "clients": k, "rounds": rounds, "head": head,
           "accuracy": float(table["global_accuracy"].iloc[-1]),
           "bytes_per_client_round": per_round,
           "upload_bytes_per_client_round": float(trained["upload_bytes"].mean()),
           "upload_bytes_per_client_total": float(trained["upload_bytes"].sum() / k),
           "model_parameters": summary["model_parameters"], "seconds": seconds,
           "curve": list(zip(table["round"].tolist(), table["global_accuracy"].tolist(),
                             strict=True))}
    if "policy/identity_error" in table:
        row["identity_error"] = float(table["policy/identity_error"].max())
    if path:
        os.makedirs(cache, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(row | {"overrides": overrides}, f, default=float)
        os.replace(path + ".tmp", path)
    return row


def plot(df: pd.DataFrame, out_dir: str, base_acc: float, tag: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = df[(df["study"] == "main")]
    parts = [p for p in PARTITIONS if p in set(main["partition"])]
    fig, axes = plt.subplots(1, len(parts), figsize=(5 * len(parts), 4.2), sharey=True,
                             squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
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
    axes[0][0].set_ylabel("global test accuracy (mean ± sd over seeds)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out_dir, f"flite_pareto{tag}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_budget(df: pd.DataFrame, budget: float, out_dir: str, base_acc: float,
                tag: str = "") -> str:
    """Accuracy vs cumulative upload bytes per client of each budget run (mean over seeds of
    the per-round curves), with the budget as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for method, g in df.groupby("method", sort=False):
        per_round = g["upload_bytes_per_client_round"].iloc[0]
        curves = pd.DataFrame([dict(c) for c in g["curve"]]).mean()
        x = [0.0] + [per_round * r for r in curves.index]
        y = [base_acc] + curves.tolist()
        ax.plot(x[1:], y[1:], "-*" if method.startswith("flite") else "-o", ms=4,
                label=f"{method} ({len(curves)} rounds)")
    ax.axvline(budget, color="k", ls=":", lw=1, label="budget B")
    ax.axhline(base_acc, color="grey", ls="--", lw=0.8,
               label="pretrained base (seed-0 test split)")
    ax.set_xscale("log")
    ax.set(xlabel="cumulative upload bytes per client", ylabel="global test accuracy",
           title="fixed upload budget B = one fp32 FedAvg round (dir0.5, K = 8)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path = os.path.join(out_dir, f"flite_budget{tag}.png")
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
    main_methods = [m for m in METHODS if not m.startswith("flite_d64_r")]  # r sweep apart
    ap.add_argument("--methods", nargs="+", default=main_methods, choices=list(METHODS),
                    help="methods of the main study")
    ap.add_argument("--partitions", nargs="+", default=list(PARTITIONS),
                    choices=list(PARTITIONS))
    ap.add_argument("--studies", nargs="*", default=list(STUDIES), choices=STUDIES,
                    help="parts to run (default all; none: only --floor-widths)")
    ap.add_argument("--no-sweeps", action="store_true", help="only the main study")
    ap.add_argument("--clients-k", type=int, nargs="+", default=[4, 16, 32],
                    help="K of the clients sweep (K = 8 is the main study's)")
    ap.add_argument("--r-values", type=int, nargs="+", default=list(R_VALUES),
                    choices=list(R_VALUES), help="r of the r sweep at d = 64")
    ap.add_argument("--budget-methods", nargs="+", default=BUDGET_METHODS,
                    choices=list(METHODS))
    ap.add_argument("--budget-cap", type=int, default=10,
                    help="most rounds any method runs in the budget study (10: the main "
                         "study's horizon)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "flite_study"))
    ap.add_argument("--cache", default=None,
                    help="finished runs and bases (default OUT/runs; '' disables)")
    ap.add_argument("--tag", default="", help="suffix of the output files (partial studies)")
    ap.add_argument("--floor-widths", type=int, nargs="*", default=[],
                    help="also pretrain bases of these ResNet-18 widths (64 = full) and report "
                         "their accuracy with int4/int8 weights (the quantization floor)")
    args = ap.parse_args()
    studies = ["main"] if args.no_sweeps else args.studies
    cache = os.path.join(args.out, "runs") if args.cache is None else args.cache or None
    tag = f"_{args.tag}" if args.tag else ""

    import numpy as np
    import ray
    from tqdm import tqdm

    from fedray.models.pretrain import load_base

    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    rows, bases = [], {}
    with tempfile.TemporaryDirectory() as work:
        heads = ["orthogonal"] + (["kaiming", "trainable"] if "heads" in studies else [])
        for head in heads:
            root = cache or work
            path = os.path.join(root, f"base-{head}-{_digest(base_overrides(head))}")
            bases[head] = (path, make_base(head, path)["test_accuracy"])
        grid = []
        if "main" in studies:
            grid += [("main", p, m, s, 8, "orthogonal") for p in args.partitions
                     for m in args.methods for s in args.seeds]
        if "clients" in studies:
            grid += [("clients", "dir0.5", m, s, k, "orthogonal") for k in args.clients_k
                     for m in ("flite_d64", "fedavg_fp32") for s in args.seeds]
        if "heads" in studies:
            grid += [(f"head_{h}", "dir0.5", m, s, 8, h) for h in ("kaiming", "trainable")
                     for m in ("flite_d64", "fedavg_fp32") for s in args.seeds]
        if "rsweep" in studies:
            grid += [("rsweep", "dir0.5", r_method(r), s, 8, "orthogonal")
                     for r in args.r_values for s in args.seeds]
        if grid or "budget" in studies:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     log_to_driver=False, logging_level="ERROR")  # never join another's Ray

        def run(study, part, method, seed, k, head, rounds=10, prefix_of=0):
            row = run_one(study, part, method, seed, k, bases[head][0], work, head=head,
                          rounds=rounds, cache=cache, prefix_of=prefix_of)
            rows.append(row)
            return row

        for job in tqdm(grid, desc="flite study", unit="run"):
            run(*job)
        budget = None
        if "budget" in studies:
            # per-round upload of each method: exact and seed-independent, from a 1-round run
            # (or any cached run of it); B = fp32 FedAvg's
            up = {}
            for m in dict.fromkeys(["fedavg_fp32", *args.budget_methods]):
                probe = run_one("probe", "dir0.5", m, args.seeds[0], 8,
                                bases["orthogonal"][0], work, rounds=1, cache=cache,
                                prefix_of=max(10, args.budget_cap))
                up[m] = probe["upload_bytes_per_client_round"]
            budget = up["fedavg_fp32"]
            plan = {m: min(args.budget_cap, int(budget // up[m])) for m in args.budget_methods}
            for m, n in tqdm([(m, n) for m, n in plan.items() if n >= 1],
                             desc="budget", unit="method"):
                for s in args.seeds:
                    row = run("budget", "dir0.5", m, s, 8, "orthogonal", rounds=n,
                              prefix_of=max(10, args.budget_cap))
                    row["affordable_rounds"] = int(budget // up[m])
        if ray.is_initialized():
            ray.shutdown()
    df = pd.DataFrame(rows)
    if len(df):
        df.drop(columns=["curve"]).to_parquet(os.path.join(args.out, f"runs{tag}.parquet"))
    base_acc = bases["orthogonal"][1]
    agg = {"accuracy": ("accuracy", "mean"), "sd": ("accuracy", "std")}
    result: dict = {"base_accuracy": {h: a for h, (_, a) in bases.items()},
                    "base_accuracy_int4_weights": quantized_base_accuracy(
                        bases["orthogonal"][0], ["weights", "int4"]),
                    "base_accuracy_int8_weights": quantized_base_accuracy(
                        bases["orthogonal"][0], ["weights", "int8"]),
                    "runs": len(rows),
                    "run_seconds_total": float(df.get("seconds", pd.Series(dtype=float))
                                              .sum()), "studies": studies}
    if "main" in studies:
        main_t = df[df["study"] == "main"].groupby(["partition", "method"]).agg(
            **agg, up_bytes=("upload_bytes_per_client_round", "mean"),
            bytes=("bytes_per_client_round", "mean"), params=("model_parameters", "first")
        ).reset_index()
        main_t["compression"] = 4 * main_t["params"] / main_t["up_bytes"]
        # paired with fp32 FedAvg on the same seed (same test split, partition, sampling)
        mains = df[df["study"] == "main"]
        ref = mains[mains["method"] == "fedavg_fp32"].set_index(["partition", "seed"])
        if len(ref):
            diff = mains.join(ref["accuracy"].rename("ref"), on=["partition", "seed"])
            diff["d"] = diff["accuracy"] - diff["ref"]
            paired = diff.groupby(["partition", "method"])["d"].agg(["mean", "min", "max"])
            main_t = main_t.join(paired.rename(columns={
                "mean": "vs_fp32", "min": "vs_fp32_min", "max": "vs_fp32_max"}),
                on=["partition", "method"])
        cols = ["partition", "method", "accuracy", "sd"] + (
            ["vs_fp32", "vs_fp32_min", "vs_fp32_max"] if len(ref) else []) + [
            "up_bytes", "bytes", "compression"]
        result["main"] = markdown(main_t, cols)
        result["pareto"] = plot(df, args.out, base_acc, tag)
        ident = df.loc[df["study"] == "main"].get("identity_error")
        result["identity_error_max"] = float(ident.max()) if ident is not None else None
    if "clients" in studies:
        k8 = (df["study"] == "main") & (df["partition"] == "dir0.5") & df["method"].isin(
            ["flite_d64", "fedavg_fp32"])  # K = 8 of the sweep is the main study's
        k_t = df[(df["study"] == "clients") | k8].groupby(["clients", "method"]).agg(
            **agg).reset_index()
        result["clients"] = markdown(k_t, ["clients", "method", "accuracy", "sd"])
    if "heads" in studies:
        h_t = df[df["study"].str.startswith("head_") | ((df["study"] == "main") & (
            df["partition"] == "dir0.5") & df["method"].isin(["flite_d64", "fedavg_fp32"]))]
        h_t = h_t.groupby(["head", "method"]).agg(**agg).reset_index()
        result["heads"] = markdown(h_t, ["head", "method", "accuracy", "sd"])
    if "rsweep" in studies:
        r_t = df[df["study"] == "rsweep"].groupby("method", sort=False).agg(
            **agg, up_bytes=("upload_bytes_per_client_round", "mean"),
            identity_error=("identity_error", "max")).reset_index()
        r_t.insert(1, "r", [32 if m == "flite_d64" else int(m.rsplit("_r", 1)[1])
                            for m in r_t["method"]])
        r_t["d"] = 64
        result["rsweep"] = markdown(r_t.sort_values("r"), ["r", "d", "method", "accuracy",
                                                            "sd", "up_bytes",
                                                            "identity_error"])
    if budget is not None:
        b = df[df["study"] == "budget"]
        b_t = b.groupby("method", sort=False).agg(
            rounds=("rounds", "first"), affordable=("affordable_rounds", "first"), **agg,
            up_bytes_round=("upload_bytes_per_client_round", "mean"),
            cum_up_bytes=("upload_bytes_per_client_total", "mean")).reset_index()
        b_t["share_of_budget"] = b_t["cum_up_bytes"] / budget
        for c in ("rounds", "affordable"):  # integers, not floats, in the table
            b_t[c] = b_t[c].astype(int).astype(str)
        result["budget_bytes"] = budget
        result["budget_cap"] = args.budget_cap
        result["budget"] = markdown(b_t, ["method", "affordable", "rounds", "up_bytes_round",
                                          "cum_up_bytes", "share_of_budget", "accuracy",
                                          "sd"])
        result["budget_plot"] = plot_budget(b, budget, args.out, base_acc, tag)
    floors = []
    for w in args.floor_widths:  # no federation: the base alone, quantized once
        model = ["model.name=resnet18", f"model.width={w}"]
        path = os.path.join(cache or tempfile.mkdtemp(),
                            f"base-orthogonal-{_digest(base_overrides('orthogonal', model))}")
        meta = make_base("orthogonal", path, model)
        floors.append({"width": str(w), "parameters": sum(int(np.prod(v.shape)) for v in
                                                     load_base(path)[0].values()),
                       "base": meta["test_accuracy"],
                       "int8_weights": quantized_base_accuracy(path, ["weights", "int8"], model),
                       "int4_weights": quantized_base_accuracy(path, ["weights", "int4"], model)})
    if floors:
        result["floors"] = markdown(pd.DataFrame(floors), ["width", "parameters", "base",
                                                           "int8_weights", "int4_weights"])
    result["minutes"] = (time.perf_counter() - t0) / 60
    with open(os.path.join(args.out, f"summary{tag}.json"), "w") as f:
        json.dump(result, f, indent=2, default=float)
    with open(os.path.join(args.out, f"tables{tag}.md"), "w") as f:
        for key in ("main", "clients", "heads", "rsweep", "budget", "floors"):
            if key in result:
                f.write(f"## {key}\n\n{result[key]}\n\n")
    for key in ("main", "clients", "heads", "rsweep", "budget"):
        if key in result:
            print(result[key], "\n")
    print(json.dumps({k: result[k] for k in ("base_accuracy", "base_accuracy_int4_weights",
                                             "base_accuracy_int8_weights", "runs", "minutes")},
                     default=float))


if __name__ == "__main__":
    main()
