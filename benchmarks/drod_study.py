"""DROD study on Split-digits: DROD θ ∈ {0, .25, .5, .75, 1} against every heterogeneous-model
arm of the paper's Table 1 under experience replay, then the paper's three leading geometries
(DROD θ = 0.5, Width × FjORD, Shortcut × FjORD) under DER++, BiC and EWC; the FLOP-matched
grid (``--match flops``: arms whose parameter-ladder sub-models already meet the FLOP budget
are the same runs, as in the paper — :func:`on_both_ladders`) and the replay-buffer sweep
(``--buffers``) of the three leading geometries.

Ten clients in three capacity tiers (ρ = 1 / 0.251 / 0.064, round-robin 4/3/3), a narrow
sliceable ResNet-18-GN from scratch on digits upsampled to 16x16, five 2-class tasks
(class-incremental, one head, Dirichlet(0.5) redrawn per task). Every run executes on local
Ray; results are appended to a JSON file as they finish (re-running skips finished runs)
and rendered as a Markdown table (fleet = unweighted mean over tiers, mean ± sample sd over
seeds).

    .venv/bin/python benchmarks/drod_study.py --seeds 0 1 2
    .venv/bin/python benchmarks/drod_study.py --seeds 0 1 2 --match flops --methods
    .venv/bin/python benchmarks/drod_study.py --seeds 0 1 2 --buffers 100 400 --methods
    .venv/bin/python benchmarks/drod_study.py --verify "DROD θ=0.50" --seeds 0

``--verify ARM`` re-runs finished runs and checks them bit for bit against the stored
metrics (adding the accuracy matrices runs from before they were recorded lack);
``--order seed`` runs seed by seed across arms, so a partial study has every arm.
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
    "Width × FjORD w/ KD": {"name": "fjord", "kd": True},
    "Shortcut × FjORD w/ KD": {"name": "shortcut_fjord", "kd": True},
    "Depth × FjORD": {"name": "depth_fjord"},
    "Depth × FjORD w/ KD": {"name": "depth_fjord", "kd": True},
    "Shortcut × FedAvg": {"name": "shortcut_fedavg"},
    "Width × FIARSE": {"name": "fiarse", "axis": "width"},
    "Shortcut × FIARSE": {"name": "fiarse", "axis": "shortcut"},
    "Depth × FIARSE": {"name": "fiarse", "axis": "depth"},
    "ScaleFL ‡": {"name": "scalefl"},
}
EXITS = ("depth_fedavg", "depth_fjord", "scalefl")
LEADING = ("DROD θ=0.50", "Width × FjORD (DROD θ=0)", "Shortcut × FjORD")


def config(arm: str, method: str, seed: int, args, match: str = "params",
           buffer: int | None = None) -> dict:
    algorithm = dict(ARMS[arm], match=match)
    model = {"name": "sliceable_resnet18", "width": args.width}
    if algorithm["name"] in EXITS or algorithm.get("axis") == "depth":
        model["exits"] = True
    rpt = args.rounds_per_task
    return {
        "name": f"{algorithm['name']}-{method}-s{seed}", "seed": seed,
        "rounds": args.tasks * rpt,
        "data": {"dataset": "digits", "image_size": args.image_size, "partition": "dirichlet",
                 "alpha": 0.5, "local_test_fraction": 0.1},
        "clients": {"num_clients": 10},
        "model": model, "algorithm": algorithm,
        "local": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        "continual": {"tasks": args.tasks, "rounds_per_task": rpt, "method": method,
                      "buffer_total": args.buffer if buffer is None else buffer},
        "eval": {"every": rpt, "clients": "none"},
        "runtime": {"tiers": TIERS},
    }


def rungs(arm: str, args, match: str) -> dict:
    """Each tier's sub-model under ``match``: geometry, FIARSE's keep fraction, and the
    parameter and FLOP ratios it spends (a mask cuts parameters, not FLOPs)."""
    from fedray.core.config import load_config
    from fedray.core.registry import build_method
    from fedray.methods.drod.method import data_shape

    cfg = load_config(None, base=config(arm, "er", 0, args, match))
    lad = build_method(cfg).build_resident(*data_shape(cfg), "cpu").ladder
    return {t: {"geometry": r.geometry.to_dict(), "depths": list(lad.depths[t]),
                "keep": lad.keep.get(t, 1.0), "param_ratio": lad.param_ratio(t),
                "flop_ratio": r.flop_ratio} for t, r in lad.tiers.items()}


def geometry_key(arm: str, args, match: str) -> str:
    """Arms whose tiers are the same on both ladders are one run in both grids."""
    return json.dumps({t: [v["geometry"], v["depths"], v["keep"]]
                       for t, v in rungs(arm, args, match).items()}, sort_keys=True)


def on_both_ladders(arm: str, args, tol: float = 0.02) -> bool:
    """The paper's † rule, measured: an arm is one run on both ladders when its
    parameter-ladder sub-models are the FLOP-ladder ones, or already spend each tier's budget
    in FLOPs within ``tol`` (relative) — narrowing channels cuts both in step."""
    if geometry_key(arm, args, "params") == geometry_key(arm, args, "flops"):
        return True
    caps = {t["name"]: t["capacity"] for t in TIERS}
    return all(abs(v["flop_ratio"] / caps[t] - 1) <= tol
               for t, v in rungs(arm, args, "params").items())


def matrices(rows: list[dict], args) -> dict:
    """R[t][i] per tier, class-IL and task-IL (NaN as None)."""
    from fedray.methods.drod.continual.metrics import accuracy_matrix

    return {t["name"]: {kind: [[None if math.isnan(v) else v for v in row] for row in
                               accuracy_matrix(rows, t["name"], kind, args.tasks,
                                               args.rounds_per_task).tolist()]
                        for kind in ("class_il", "task_il")} for t in TIERS}


def run_one(arm, method, seed, args, out_dir, match="params", buffer=None) -> dict:
    from fedray.core.config import load_config
    from fedray.methods.drod.continual.metrics import summarize
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment

    cfg = load_config(None, base=config(arm, method, seed, args, match, buffer))
    buf = args.buffer if buffer is None else buffer
    run_dir = os.path.join(out_dir, f"{cfg.name}-arm{list(ARMS).index(arm)}-{match}-b{buf}")
    t0 = time.perf_counter()
    # a run killed before it was recorded is replaced (a fedray run only: check_replaceable)
    summary = run_experiment(cfg, run_dir, progress=False, overwrite=True)
    rows = read_metrics(run_dir).to_pylist()
    res = summarize(rows, [t["name"] for t in TIERS], args.tasks, args.rounds_per_task)
    members = {t["name"]: sum(cfg.tier_of(c) == t["name"] for c in range(cfg.clients.num_clients))
               for t in TIERS}
    up = {t: float(np.mean([r[f"tier/{t}/upload_bytes"] for r in rows])) / n
          for t, n in members.items()}
    return {"arm": arm, "method": method, "seed": seed, "match": match, "buffer": buf,
            "seconds": time.perf_counter() - t0, "metrics": res, "matrices": matrices(rows, args),
            "rungs": rungs(arm, args, match),
            "upload_bytes_per_client_round": up,
            "total_bytes": summary["total_upload_bytes"] + summary["total_download_bytes"],
            "run_dir": run_dir}


def mean_sd(values):
    v = np.asarray(values, float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def select(results: list[dict], method: str, match: str = "params", buffer: int = 200,
           same: dict | None = None) -> list[dict]:
    """Runs of one grid cell: ``same`` maps an arm whose sub-models do not change between the
    ladders to the ladder its runs were made on."""
    def ok(r, arm):
        rm, rb = r.get("match", "params"), r.get("buffer", 200)
        want = (same or {}).get(arm, match)
        return r["method"] == method and rm == want and rb == buffer
    return [r for r in results if ok(r, r["arm"])]


def table(results: list[dict], method: str, match: str = "params", buffer: int = 200,
          same: dict | None = None) -> tuple[str, list[str]]:
    cell = select(results, method, match, buffer, same)
    arms = [a for a in ARMS if any(r["arm"] == a for r in cell)]
    lines = ["| arm | fleet class-IL ACC | forgetting | task-IL ACC | t100 | t025 | t006 | "
             "task-IL t100 / t025 / t006 | params t025 / t006 | FLOPs t025 / t006 | "
             "upload per client-round t100 / t025 / t006 (kB) | n |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for arm in arms:
        rs = [r for r in cell if r["arm"] == arm]
        f = [r["metrics"]["fleet"] for r in rs]
        acc, sd = mean_sd([x["class_il_acc"] for x in f])
        fg, fsd = mean_sd([x["class_il_forgetting"] for x in f])
        til, tsd = mean_sd([x["task_il_acc"] for x in f])
        tiers = [np.mean([r["metrics"][t["name"]]["class_il_acc"] for r in rs]) for t in TIERS]
        tils = [np.mean([r["metrics"][t["name"]]["task_il_acc"] for r in rs]) for t in TIERS]
        per = [np.mean([r["upload_bytes_per_client_round"][t["name"]] for r in rs])
               for t in TIERS]
        kb = " / ".join(f"{v / 1e3:,.0f}" for v in per)
        rg = next((r["rungs"] for r in rs if "rungs" in r), None)
        pr = " / ".join(f"{rg[t]['param_ratio']:.3f}" for t in ("t025", "t006")) if rg else "–"
        fr = " / ".join(f"{rg[t]['flop_ratio']:.3f}" for t in ("t025", "t006")) if rg else "–"
        rows.append((acc, arm, f"| {arm} | {acc:.4f} ± {sd:.4f} | {fg:.3f} ± {fsd:.3f} | "
                               f"{til:.4f} ± {tsd:.4f} | " + " | ".join(f"{v:.4f}" for v in tiers)
                     + " | " + " / ".join(f"{v:.3f}" for v in tils)
                     + f" | {pr} | {fr} | {kb} | {len(rs)} |"))
    rows.sort(key=lambda r: -r[0])
    return "\n".join(lines + [r[2] for r in rows]), [a for _, a, _ in rows]


def matrix_md(results: list[dict], arms: list[str]) -> str:
    """Per-task class-IL accuracy matrices R[t, i] (ER, parameter ladder, buffer 200), each
    tier's mean over the seeds that recorded them: one table per arm, a row per (tier, t)."""
    out = []
    for arm in arms:
        rs = [r for r in select(results, "er") if r["arm"] == arm and "matrices" in r]
        if not rs:
            continue
        T = len(rs[0]["matrices"][TIERS[0]["name"]]["class_il"])
        out += [f"**{arm}** (n = {len(rs)})", "",
                "| tier | after task | " + " | ".join(f"task {i}" for i in range(T)) + " |",
                "|---|---|" + "---|" * T]
        for t in TIERS:
            R = np.nanmean([np.array(r["matrices"][t["name"]]["class_il"], float) for r in rs],
                           axis=0)
            for k, row in enumerate(R):
                out.append(f"| {t['name']} | {k} | " + " | ".join(
                    "–" if i > k or np.isnan(v) else f"{v:.2f}" for i, v in enumerate(row))
                    + " |")
        out.append("")
    return "\n".join(out)


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
                    help="continual objectives for the paper's three leading geometries "
                         "(its Table 2: DROD θ = 0.5, Width × FjORD, Shortcut × FjORD)")
    ap.add_argument("--match", choices=["params", "flops"], default="params",
                    help="the ladder the ER grid is matched on")
    ap.add_argument("--buffers", type=int, nargs="*", default=[],
                    help="replay-buffer sweep of the three leading geometries (ER)")
    ap.add_argument("--verify", nargs="*", default=None, metavar="ARM",
                    help="re-run these finished ER runs and check them bit for bit")
    ap.add_argument("--order", choices=["arm", "seed"], default="arm")
    ap.add_argument("--report-only", action="store_true", help="only render the tables")
    ap.add_argument("--out", default="benchmarks/results/drod_study.json")
    ap.add_argument("--run-root", default="/tmp/fedray-drod-study")
    args = ap.parse_args()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stored = json.loads(out.read_text()) if out.exists() else {}
    results = stored.get("runs", [])
    meta = {k: v for k, v in stored.items() if k not in ("args", "runs")}

    def key(r):
        return (r["arm"], r["method"], r["seed"], r.get("match", "params"),
                r.get("buffer", 200))

    done = {key(r) for r in results}

    def save():
        out.write_text(json.dumps({"args": vars(args), **meta, "runs": results}, indent=1))

    def run(cells):
        """cells: (arm, method, match, buffer); runs each seed not done yet."""
        order = [(c, s) for s in args.seeds for c in cells] if args.order == "seed" else \
            [(c, s) for c in cells for s in args.seeds]
        for (arm, method, match, buffer), seed in order:
            if (arm, method, seed, match, buffer) in done or args.report_only:
                continue
            r = run_one(arm, method, seed, args, args.run_root, match, buffer)
            results.append(r)
            done.add(key(r))
            save()
            print(f"{arm:28s} {method:5s} {match:6s} buf {buffer:4d} seed {seed}: fleet "
                  f"class-IL {r['metrics']['fleet']['class_il_acc']:.4f} "
                  f"({r['seconds']:.0f}s)", flush=True)

    import ray

    if not args.report_only:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    for arm in args.verify or []:
        for seed in args.seeds:
            old = next(r for r in results if key(r) == (arm, "er", seed, "params", 200))
            new = run_one(arm, "er", seed, args, args.run_root)
            same = new["metrics"] == old["metrics"]
            print(f"verify {arm} seed {seed}: {'identical' if same else 'DIFFERENT'} "
                  f"(fleet {old['metrics']['fleet']['class_il_acc']:.4f} → "
                  f"{new['metrics']['fleet']['class_il_acc']:.4f})", flush=True)
            old["verified"] = same
            if same:
                old["matrices"], old["rungs"] = new["matrices"], new["rungs"]
            else:
                old["rerun"] = new
            save()
    arms = args.arms or list(ARMS)
    same = {a: "params" for a in ARMS if args.match == "flops" and on_both_ladders(a, args)}
    # Depth × FIARSE has no FLOP-ladder cell in the paper (a mask removes no multiply and the
    # depth cut alone is Depth × FedAvg's); we follow it
    run([(a, "er", args.match, args.buffer) for a in arms if a not in same
         and not (args.match == "flops" and a == "Depth × FIARSE")])
    for b in args.buffers:
        run([(a, "er", "params", b) for a in LEADING])
    known: dict = {}
    for r in results:  # runs from before the ladder ratios were recorded
        if "rungs" not in r:
            k = (r["arm"], r.get("match", "params"))
            r["rungs"] = known[k] = known.get(k) or rungs(r["arm"], args, k[1])
    md, ranking = table(results, "er")
    sections = [f"### Under ER (buffer {args.buffer}, parameter ladder)\n\n{md}"]
    flops = select(results, "er", "flops")
    if flops or args.match == "flops":
        same = same or {a: "params" for a in ARMS if on_both_ladders(a, args)}
        meta["both_ladders"] = sorted(same)
        save()
        sections.append("### Under ER (buffer 200, inference-FLOP ladder; arms whose sub-models"
                        " are the same on both ladders are the same runs)\n\n"
                        + table(results, "er", "flops", same=same)[0])
    for method in args.methods:
        run([(arm, method, "params", args.buffer) for arm in LEADING])
    for method in ("derpp", "bic", "ewc"):
        if select(results, method):
            sections.append(f"### Under {method}\n\n{table(results, method)[0]}")
    buffers = sorted({r.get("buffer", 200) for r in results})
    if len(buffers) > 1:
        lines = ["| arm | " + " | ".join(f"buffer {b}" for b in buffers) + " |",
                 "|---|" + "---|" * len(buffers)]
        for arm in LEADING:
            cells = []
            for b in buffers:
                rs = [r for r in select(results, "er", buffer=b) if r["arm"] == arm]
                m, sd = mean_sd([r["metrics"]["fleet"]["class_il_acc"] for r in rs]) \
                    if rs else (math.nan, 0)
                cells.append(f"{m:.4f} ± {sd:.4f} (n={len(rs)})" if rs else "–")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        sections.append("### Replay-buffer sweep (ER, parameter ladder, fleet class-IL)\n\n"
                        + "\n".join(lines))
    sections.append("### Per-task accuracy matrices\n\n" + matrix_md(results, ranking))
    if not args.report_only:
        ray.shutdown()
    text = "\n\n".join(sections)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    if any(math.isnan(r["metrics"]["fleet"].get("class_il_acc", math.nan)) for r in results):
        sys.exit("some runs produced no accuracy")


if __name__ == "__main__":
    main()
