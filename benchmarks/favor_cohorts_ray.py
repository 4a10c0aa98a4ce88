"""FAVoR's authors as cohorts through Ray (issue #28, deliverable 6): round time and peak
summed RSS of a FAVoR federation with ``runtime.vectorize`` off and on, end to end.

Workload: the embedded default's shape (``fedray.methods.favor.prepare.prepare_embedded``:
a synthetic BlogText-schema corpus, the tiny Qwen2 LM — hidden 128, 3 layers, vocabulary
2,048 — and the ASCE style encoder; the LM is pretrained for ``--lm-steps`` steps only,
which changes its weights, not the work of a round), the paper's adapter (LoRA r 16, α 32 on
all seven projections), ``--authors`` on the roster, ``--per-round`` (12) authors per round,
``--rounds`` rounds, no evaluation. Configurations (each a fresh process with its own local
Ray, run by ``benchmarks/scale.py``'s measured child, every process of it sampled):

* ``off ×E``: authors one at a time on E executors (today's default, E = 2; and E = 1);
* ``on ×1``: one cohort of all the round's authors through one executor and one base;
* ``on ×2``: two cohorts of half the round each, one per executor.

Reported per configuration: the median s/round of rounds 2..R (round 1 pays the executors'
start), the peak summed RSS of all its processes (driver, executors, the entry, Ray's own),
and the largest single process' peak (an executor: the one holding the base and the
authors' activations). The issue's targets: round time ≤ 0.5× today's (``off ×2``), peak
summed RSS ≤ 1.2× one executor's — read here as the vectorized run's summed RSS against the
sequential one-executor run's, and the vectorized executor's own peak against a sequential
executor's.

    .venv/bin/python benchmarks/favor_cohorts_ray.py [--rounds 4] [--per-round 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import scale  # noqa: E402  (run_measured, its tree sampler and its fedray child)

CONFIGS = [("off", 2), ("off", 1), ("on", 1), ("on", 2)]


def overrides(prep: dict, mode: str, executors: int, args: argparse.Namespace) -> list[str]:
    from fedray.methods.favor.prepare import embedded_overrides

    cohort = -(-args.per_round // executors)
    return embedded_overrides(prep) + [
        "algorithm.variant=favor", f"seed={args.seed}", f"name=favor-{mode}-{executors}",
        f"clients.num_clients={args.authors}", f"clients.per_round={args.per_round}",
        f"rounds={args.rounds}", "eval.clients=none", "eval.every=0",
        "eval.global_test=false", "runtime.placement_timeout_s=300",
        "runtime.include_dashboard=false",
        f"runtime.tiers=[{{name: lm, executors: {executors}, num_cpus: {2 / executors:g}}}]",
        f"runtime.vectorize={mode}", f"runtime.cohort_size={cohort}"]


SYSTEM = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def executor_peak(meas: dict) -> float | None:
    """The largest Ray worker process' peak: an executor holding the base (the sampler
    may first see a worker under its idle title, ``ray::IDLE``, so titles cannot tell an
    executor from the driver; the driver holds no LM and is the smaller)."""
    peaks = [gb for title, gb in meas.get("process_peaks", [])
             if title.startswith("ray::") and not title.startswith(SYSTEM)]
    return max(peaks) if peaks else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--authors", type=int, default=24)
    p.add_argument("--per-round", type=int, default=12)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lm-steps", type=int, default=30)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "favor_ray"))
    args = p.parse_args()

    from fedray.methods.favor.lm import TinyLM
    from fedray.methods.favor.prepare import prepare_embedded

    os.makedirs(os.path.join(args.out, "work"), exist_ok=True)
    prep = prepare_embedded(os.path.join(args.out, "cache"), args.authors, args.seed,
                            lm=TinyLM(steps=args.lm_steps, seed=args.seed))
    ns = argparse.Namespace(out=args.out, min_free_gb=1.0, max_rss_gb=None)
    rows = []
    for mode, executors in CONFIGS:
        tag = f"favor-{mode}-x{executors}"
        spec = {"overrides": overrides(prep, mode, executors, args),
                "run_dir": os.path.join(args.out, "runs", tag)}
        result, meas = scale.run_child("fedray", spec, os.path.join(args.out, "work"), tag,
                                       args.timeout, ns)
        rounds = result.get("round_seconds") or []
        row = {"mode": mode, "executors": executors,
               "cohort": -(-args.per_round // executors) if mode == "on" else None,
               "round_seconds": rounds,
               "round_s": statistics.median(rounds[1:]) if len(rounds) > 1 else None,
               "setup_s": result.get("setup_seconds"), "error": result.get("error"),
               "peak_summed_rss_gb": meas["peak_rss_gb"],
               "executor_peak_rss_gb": executor_peak(meas),
               "process_peaks": meas.get("process_peaks")}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    with open(os.path.join(args.out, "favor_cohorts_ray.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(markdown(rows, args))


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    def f(v, fmt="{:.3f}"):
        return "–" if v is None else fmt.format(v)

    today = next(r for r in rows if r["mode"] == "off" and r["executors"] == 2)
    one = next(r for r in rows if r["mode"] == "off" and r["executors"] == 1)
    lines = [f"FAVoR, {args.per_round} of {args.authors} authors per round, "
             f"{args.rounds} rounds (s/round: median of rounds 2..R):", "",
             "| vectorize | executors | cohort | s/round | ÷ off ×2 (≤ 0.5) | "
             "peak summed RSS GB | ÷ off ×1 (≤ 1.2) | largest executor GB | "
             "÷ off ×1's |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = None if r["round_s"] is None or today["round_s"] is None else \
            r["round_s"] / today["round_s"]
        m = r["peak_summed_rss_gb"] / one["peak_summed_rss_gb"]
        e = (None if r["executor_peak_rss_gb"] is None or one["executor_peak_rss_gb"] is None
             else r["executor_peak_rss_gb"] / one["executor_peak_rss_gb"])
        lines.append(f"| {r['mode']} | {r['executors']} | {r['cohort'] or '–'} | "
                     f"{f(r['round_s'])} | {f(t, '{:.2f}×')} | "
                     f"{f(r['peak_summed_rss_gb'], '{:.2f}')} | {f(m, '{:.2f}×')} | "
                     f"{f(r['executor_peak_rss_gb'], '{:.2f}')} | {f(e, '{:.2f}×')} |"
                     + (f" {r['error']}" if r["error"] else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
