"""DROD study on Split-digits: DROD θ ∈ {0, .25, .5, .75, 1} against the heterogeneous-model
baselines under experience replay, then the top three arms under DER++, BiC and EWC.

Ten clients in three capacity tiers (ρ = 1 / 0.251 / 0.064, round-robin 4/3/3), a narrow
sliceable ResNet-18-GN from scratch on digits upsampled to 16x16, five 2-class tasks
(class-incremental, one head, Dirichlet(0.5) redrawn per task). Every run executes on local
Ray; results are appended to a JSON file as they finish (re-running skips finished runs)
and rendered as a Markdown table (fleet = unweighted mean over tiers, mean ± sample sd over
seeds).

    .venv/bin/python benchmarks/drod_study.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TIERS = [{"name": "t100", "executors": 1, "num_cpus": 0.5, "capacity": 1.0},
         {"name": "t025", "executors": 1, "num_cpus": 0.5, "capacity": 0.251},
         {"name": "t006", "executors": 1, "num_cpus": 0.5, "capacity": 0.064}]

ARMS = {
    "DROD θ=0.25": {"name": "drod", "theta": 0.25},
    "DROD θ=0.50": {"name": "drod", "theta": 0.5},
    "DROD θ=0.75": {"name": "drod", "theta": 0.75},
    "DROD θ=1.00": {"name": "drod", "theta": 1.0},
    "Width × FjORD (DROD θ=0)": {"name": "fjord"},
    "Width × FedAvg (HeteroFL)": {"name": "heterofl"},
    "Width × FedRolex": {"name": "fedrolex"},
    "Shortcut × FjORD": {"name": "shortcut_fjord"},
    "Depth × FedAvg": {"name": "depth_fedavg"},
}


def config(arm: str, method: str, seed: int, args) -> dict:
    algorithm = dict(ARMS[arm])
    model = {"name": "sliceable_resnet18", "width": args.width}
    if algorithm["name"] == "depth_fedavg":
        model["exits"] = True
    rpt = args.rounds_per_task
    return {
        "name": f"{algorithm['name']}-{method}-s{seed}", "seed": seed,
        "rounds": args.tasks * rpt,
        "data": {"dataset": "digits", "image_size": args.image_size, "alpha": 0.5,
                 "local_test_fraction": 0.1},
        "clients": {"num_clients": 10},
        "model": model, "algorithm": algorithm,
        "local": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        "continual": {"tasks": args.tasks, "rounds_per_task": rpt, "method": method,
                      "buffer_total": args.buffer},
        "eval": {"every": rpt, "clients": "none"},
        "runtime": {"tiers": TIERS},
    }


def run_one(arm, method, seed, args, out_dir) -> dict:
    from fedray.config import load_config
    from fedray.methods.drod.continual.metrics import summarize
    from fedray.metrics import read_metrics
    from fedray.runtime import run_experiment

    cfg = load_config(None, base=config(arm, method, seed, args))
    run_dir = os.path.join(out_dir, f"{cfg.name}-arm{list(ARMS).index(arm)}")
    t0 = time.perf_counter()
    summary = run_experiment(cfg, run_dir, progress=False)
    rows = read_metrics(run_dir).to_pylist()
    res = summarize(rows, [t["name"] for t in TIERS], args.tasks, args.rounds_per_task)
    members = {t["name"]: sum(cfg.tier_of(c) == t["name"] for c in range(cfg.clients.num_clients))
               for t in TIERS}
    up = {t: float(np.mean([r[f"tier/{t}/upload_bytes"] for r in rows])) / n
          for t, n in members.items()}
    return {"arm": arm, "method": method, "seed": seed, "seconds": time.perf_counter() - t0,
            "metrics": res, "upload_bytes_per_client_round": up,
            "total_bytes": summary["total_upload_bytes"] + summary["total_download_bytes"],
            "run_dir": run_dir}


def mean_sd(values):
    v = np.asarray(values, float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def table(results: list[dict], method: str) -> tuple[str, list[str]]:
    arms = [a for a in ARMS if any(r["arm"] == a and r["method"] == method for r in results)]
    lines = ["| arm | fleet class-IL ACC | forgetting | task-IL ACC | t100 | t025 | t006 | "
             "upload per client-round t100 / t025 / t006 (kB) | n |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for arm in arms:
        rs = [r for r in results if r["arm"] == arm and r["method"] == method]
        f = [r["metrics"]["fleet"] for r in rs]
        acc, sd = mean_sd([x["class_il_acc"] for x in f])
        fg, fsd = mean_sd([x["class_il_forgetting"] for x in f])
        til, tsd = mean_sd([x["task_il_acc"] for x in f])
        tiers = [np.mean([r["metrics"][t["name"]]["class_il_acc"] for r in rs]) for t in TIERS]
        per = [np.mean([r["upload_bytes_per_client_round"][t["name"]] for r in rs])
               for t in TIERS]
        kb = " / ".join(f"{v / 1e3:,.0f}" for v in per)
        rows.append((acc, f"| {arm} | {acc:.4f} ± {sd:.4f} | {fg:.3f} ± {fsd:.3f} | "
                          f"{til:.4f} ± {tsd:.4f} | " + " | ".join(f"{v:.4f}" for v in tiers)
                     + f" | {kb} | {len(rs)} |"))
    rows.sort(key=lambda r: -r[0])
    return "\n".join(lines + [r[1] for r in rows]), [a for _, a in sorted(
        ((acc, line.split(" | ")[0][2:]) for acc, line in rows), reverse=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--rounds-per-task", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--buffer", type=int, default=200, help="fleet-wide replay exemplars")
    ap.add_argument("--width", type=int, default=16, help="ResNet base width (64 = full)")
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--arms", nargs="*", default=None, help="subset of arms (default all)")
    ap.add_argument("--methods", nargs="*", default=["derpp", "bic", "ewc"],
                    help="continual objectives for the top three ER arms")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/drod_study.json")
    ap.add_argument("--run-root", default="/tmp/fedray-drod-study")
    args = ap.parse_args()

    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text())["runs"] if out.exists() else []
    done = {(r["arm"], r["method"], r["seed"]) for r in results}

    def run(arm, method):
        for seed in args.seeds:
            if (arm, method, seed) in done:
                continue
            r = run_one(arm, method, seed, args, args.run_root)
            results.append(r)
            done.add((arm, method, seed))
            out.write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))
            print(f"{arm:28s} {method:5s} seed {seed}: fleet class-IL "
                  f"{r['metrics']['fleet']['class_il_acc']:.4f} ({r['seconds']:.0f}s)",
                  flush=True)

    for arm in args.arms or ARMS:
        run(arm, "er")
    md, ranking = table(results, "er")
    sections = [f"### Under ER (buffer {args.buffer})\n\n{md}"]
    for method in args.methods:
        for arm in ranking[:args.top]:
            run(arm, method)
        sections.append(f"### Under {method}\n\n{table(results, method)[0]}")
    ray.shutdown()
    text = "\n\n".join(sections)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    if any(math.isnan(r["metrics"]["fleet"].get("class_il_acc", math.nan)) for r in results):
        sys.exit("some runs produced no accuracy")


if __name__ == "__main__":
    main()
