"""Fleet study: what a heterogeneous fleet does to time-to-accuracy (issue #12, 5b).

Part A — 100 digits clients (Dirichlet 0.5) on the shipped example trace
(``configs/traces/example``: phones, tablets and laptops, log-normal spread; online 2-4
windows a day, the trace repeating every 24 h), MLP 64-64-10, 1 local epoch. Arms:

- **FedAvg**: 10 clients per round; a round lasts until its slowest client reports.
- **FedAvg + over-commitment + deadline**: 13 sampled (o = 0.3), the first 10 reports
  aggregated, clients past ``--deadline`` s dropped, rounds with < 5 reports failed.
- **FedBuff**: concurrency 13, buffer 10, staleness weight 1/√(1+τ), η_g = 1.

The MLP and the digits shards are small, so a round lasts seconds of simulated time; the
tables report simulated seconds.

Each arm runs ``--rounds`` server updates, 3 seeds. Reported per arm (mean ± sd over
seeds): simulated hours and total bytes until the global test accuracy first reaches
``--target``, and the final accuracy.

Part B — the DROD fleet of ``configs/drod_split_digits.yaml`` (10 clients, tiers ρ = 1 /
0.251 / 0.064, Split-digits under ER) with device speeds proportional to tier capacity
(``fleet.tier_speed = {t100: 1, t025: 0.251, t006: 0.064}``; compute cost = the tier's
sub-model share), DROD θ = 0.5 against width-only Ordered Dropout (FjORD) and HeteroFL, and the same
devices all training the full model (HeteroFL with ρ = 1 everywhere, i.e. FedAvg):
simulated seconds of the run, bytes, final fleet accuracy.

    .venv/bin/python benchmarks/fleet_study.py --seeds 0 1 2

Results go to ``benchmarks/results/fleet_study/`` (``fleet_study.json`` raw rows,
``fleet_study.md`` the tables); re-running skips finished runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE = ROOT / "fedray" / "configs" / "traces" / "example"

FLEET_ARMS = {
    "FedAvg": {"algorithm": {"name": "fedavg"}, "clients": {"per_round": 10}},
    "FedAvg + over-commit + deadline": {
        "algorithm": {"name": "fedavg"}, "clients": {"per_round": 10},
        "fleet": {"overcommit": 0.3, "min_reports": 5}},
    # FedBuff samples nobody: concurrency clients are always in flight
    "FedBuff": {"algorithm": {"name": "fedbuff", "concurrency": 13, "buffer_size": 10},
                "clients": {}},
}
DROD_ARMS = {"DROD θ=0.5": {"name": "drod", "theta": 0.5},
             "Width × FjORD": {"name": "fjord"},
             "Width × FedAvg (HeteroFL)": {"name": "heterofl"},
             "Full model everywhere (FedAvg, ρ = 1 on every device)": {"name": "heterofl"}}
FULL = "Full model everywhere (FedAvg, ρ = 1 on every device)"


def fleet_config(arm: str, seed: int, args) -> dict:
    spec = FLEET_ARMS[arm]
    fleet = {"trace": str(TRACE / "devices.csv"),
             "availability": str(TRACE / "availability.csv"),
             "availability_period_s": 86400.0, **spec.get("fleet", {})}
    if "overcommit" in fleet:
        fleet["deadline_s"] = args.deadline
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", arm).strip("-")  # a run name is a plain name
    return {"name": f"fleet-{slug}-s{seed}", "seed": seed, "rounds": args.rounds,
            "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.5},
            "clients": {"num_clients": 100, **spec["clients"]},
            "model": {"name": "mlp", "hidden": [64]}, "algorithm": spec["algorithm"],
            "local": {"epochs": 1, "batch_size": 8, "lr": 0.1},
            "eval": {"every": 1, "clients": "none"}, "fleet": fleet,
            "runtime": {"tiers": [{"name": "default", "executors": 2, "num_cpus": 0.5}]}}


def drod_config(arm: str, seed: int) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "fedray" / "configs" / "drod_split_digits.yaml").read_text())
    cfg["name"], cfg["seed"] = f"drod-fleet-{DROD_ARMS[arm]['name']}-s{seed}", seed
    cfg["algorithm"] = {**DROD_ARMS[arm], "match": "params"}
    cfg["fleet"] = {"tier_speed": {"t100": 1.0, "t025": 0.251, "t006": 0.064}}
    if arm == FULL:  # the same devices, each training the whole model
        cfg["name"] = f"drod-fleet-full-s{seed}"
        for tier in cfg["runtime"]["tiers"]:
            tier["capacity"] = 1.0
    return cfg


def run(cfg_dict: dict, out: Path) -> dict:
    from fedray.core.config import load_config
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    run_dir = out / "runs" / cfg_dict["name"].replace(" ", "_")
    cfg = load_config(None, [], base=cfg_dict)
    summary = run_experiment(cfg, str(run_dir), progress=False, overwrite=True)
    rounds = read_metrics(str(run_dir), "rounds").to_pylist()
    return {"summary": summary, "rounds": [
        {k: r[k] for k in ("round", "global_accuracy", "cum_sim_seconds", "cum_bytes",
                           "ok", "round_failed")} for r in rounds]}


def first_reach(rounds: list[dict], target: float) -> tuple[float, float]:
    for r in rounds:
        if r["global_accuracy"] is not None and r["global_accuracy"] >= target:
            return r["cum_sim_seconds"] / 3600, r["cum_bytes"]
    return math.nan, math.nan


def stat(values: list[float], fmt: str = "{:.3f}") -> str:
    v = np.array([x for x in values if not math.isnan(x)])
    if len(v) < len(values):
        return f"not reached in {len(values) - len(v)} of {len(values)} seeds" + (
            f"; {fmt.format(v.mean())}" if len(v) else "")
    sd = v.std(ddof=1) if len(v) > 1 else 0.0
    return f"{fmt.format(v.mean())} ± {fmt.format(sd)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--deadline", type=float, default=1.0)
    p.add_argument("--no-drod", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fleet_study"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw_path = out / "fleet_study.json"
    raw = json.loads(raw_path.read_text()) if raw_path.exists() else {}

    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        jobs = [("fleet", arm, s) for arm in FLEET_ARMS for s in args.seeds]
        if not args.no_drod:
            jobs += [("drod", arm, s) for arm in DROD_ARMS for s in args.seeds]
        for part, arm, seed in jobs:
            key = f"{part}|{arm}|{seed}|{args.rounds}|{args.deadline}"
            if key in raw:
                continue
            cfg = fleet_config(arm, seed, args) if part == "fleet" else drod_config(arm, seed)
            print(f"running {part} · {arm} · seed {seed}", file=sys.stderr, flush=True)
            raw[key] = {"part": part, "arm": arm, "seed": seed, **run(cfg, out)}
            raw_path.write_text(json.dumps(raw, indent=1))
    finally:
        ray.shutdown()

    lines = [f"### A: time to {args.target:.0%} global accuracy under the example trace "
             f"({len(args.seeds)} seeds, {args.rounds} server updates)", "",
             "| arm | simulated s to target | bytes to target (MB) | final accuracy | "
             "simulated s, whole run | failed rounds |", "|---|---|---|---|---|---|"]
    for arm in FLEET_ARMS:
        rows = [v for k, v in raw.items() if v["part"] == "fleet" and v["arm"] == arm
                and k.endswith(f"|{args.rounds}|{args.deadline}")]
        if not rows:
            continue
        reach = [first_reach(r["rounds"], args.target) for r in rows]
        lines.append(
            f"| {arm} | {stat([h * 3600 for h, _ in reach], '{:.1f}')} | "
            f"{stat([b / 1e6 for _, b in reach], '{:.2f}')} | "
            f"{stat([r['summary']['final_global_accuracy'] for r in rows])} | "
            f"{stat([r['summary']['simulated_hours'] * 3600 for r in rows], '{:.1f}')} | "
            f"{sum(r['summary']['failed_rounds'] for r in rows)} |")
    drod = [v for v in raw.values() if v["part"] == "drod"]
    if drod:
        lines += ["", "### B: the DROD fleet, device speed proportional to tier capacity", "",
                  "| arm | simulated s | total bytes (MB) | final fleet accuracy |",
                  "|---|---|---|---|"]
        for arm in DROD_ARMS:
            rows = [v for v in drod if v["arm"] == arm]
            if rows:
                lines.append(
                    f"| {arm} | "
                    f"{stat([r['summary']['simulated_hours'] * 3600 for r in rows], '{:.1f}')} | "
                    f"{stat([(r['summary']['total_upload_bytes'] + r['summary']['total_download_bytes']) / 1e6 for r in rows], '{:.2f}')} | "  # noqa: E501
                    f"{stat([r['summary']['final_global_accuracy'] for r in rows])} |")
    text = "\n".join(lines) + "\n"
    (out / "fleet_study.md").write_text(text)
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    main()
