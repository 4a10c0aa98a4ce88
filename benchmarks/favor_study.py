"""FAVoR study on the embedded default: FAVoR's Table 2 (collaborative methods) and Table 4
(component ablations) over several seeds, 50 synthetic authors.

Each seed is one run of ``jobs/favor_blogtext.py`` with every method; the seed drives each
author's 80/10/10 post split (hence the evaluation prompts and source prototypes), the
long-tail word allocation, the LoRA init, client sampling and generation. The corpus, the
tiny base LM and the ASCE encoder are prepared once (``--data-seed``) and shared, so the
spread over seeds is the run's and its evaluation split's, not the corpus's or the
models'. Per-seed tables stay in ``RUN_ROOT/seed<N>``; the
seeds are aggregated (mean ± sample sd) into ``OUT.json`` / ``OUT.md`` next to the paper's
BlogText numbers. Re-running continues: finished methods are only re-evaluated.

    .venv/bin/python benchmarks/favor_study.py --seeds 0 1 2

``--lambdas`` runs the λ_align sweep instead (issue #16): the FAVoR method once per
(λ_align, seed), each its own run of the job with ``algorithm.lambda_align=λ`` (λ = 0 is FAVoR
w/o ASCE: no style target reaches the private stage), plus ``--reference`` methods (FedAvg)
once per seed, all at the embedded default's adapter (LoRA r 16 / α 32, the paper's). Runs go
seed by seed, the reference last, so a cut-short sweep has every λ on the first seeds.
Finished (method, λ, seed) rows in ``OUT.json`` are kept and not run again (pass ``--fresh``
to redo them); the aggregate table (mean ± sample sd over seeds) lands in ``OUT.md``.

    .venv/bin/python benchmarks/favor_study.py --lambdas 0 0.1 0.3 1.0 --seeds 0 1 2 \
        --reference fedavg --out benchmarks/results/favor_study/lambda_sweep

BERTScore (roberta-large) and the StyleDistance verifier need models this machine cannot
download; Table 4's StyleDistance column is replaced by gen→source verification with
classical stylometric features (ASCE-independent), and the ASCE gen→source AUC is shown too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "jobs"))

TABLE2 = ["fedavg", "fedprox", "pfedme", "ditto", "feddpa", "favor"]
TABLE4 = ["global_asce", "ditto_asce", "favor_no_asce", "favor"]
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "pfedme": "pFedMe", "ditto": "Ditto",
          "feddpa": "FedDPA", "favor": "FAVoR", "global_asce": "Global ASCE",
          "ditto_asce": "Ditto + ASCE", "favor_no_asce": "FAVoR w/o ASCE",
          "local": "Local-only", "local_asce": "Local-only + ASCE", "pooled": "Pooled PEFT"}
# BlogText rows of the paper's Table 2 (acc, F1, AUC, EER, BERTScore, SemSim) and Table 4
# (acc, F1, BERTScore, StyleDistance gen→source AUC)
PAPER2 = {"fedavg": (0.199, 0.164, 0.680, 0.371, 0.819, 0.359),
          "fedprox": (0.174, 0.161, 0.674, 0.365, 0.817, 0.353),
          "pfedme": (0.271, 0.252, 0.739, 0.321, 0.817, 0.372),
          "ditto": (0.278, 0.255, 0.763, 0.297, 0.815, 0.366),
          "feddpa": (0.294, 0.271, 0.749, 0.313, 0.818, 0.376),
          "favor": (0.403, 0.365, 0.824, 0.245, 0.815, 0.380)}
PAPER4 = {"global_asce": (0.161, 0.140, 0.818, 0.728), "ditto_asce": (0.318, 0.286, 0.816, 0.746),
          "favor_no_asce": (0.377, 0.331, 0.814, 0.767), "favor": (0.403, 0.365, 0.815, 0.771)}


def code_version() -> str:
    """The commit the study runs from, "+dirty" when tracked files differ from it."""
    from provenance import changed, git

    return (git("rev-parse", "HEAD") or "unknown") + ("+dirty" if changed() else "")


def prep_fingerprint(cache: str | Path) -> str:
    """What the rows of a run were computed on: the SHA-256 (first 16 hex) of the prepared
    base LM's and ASCE's weight and tokenizer files under ``cache``. Two preparations of the
    same key are bitwise equal on one machine (1 or 2 threads alike) but not across the
    machines of different sessions (most likely 600 steps of LM training amplifying another
    CPU's kernel rounding), and three preparations gave three LMs (global next-token
    accuracy 0.636 / 0.643, SemSim 0.37 / 0.47), so rows from different preparations must
    not be averaged."""
    import hashlib

    h = hashlib.sha256()
    root = Path(cache)
    for sub in ("base_lm", "asce"):
        for f in sorted((root / sub).glob("*")):
            if f.suffix in (".safetensors", ".pt") or f.name == "tokenizer.json":
                h.update(f"{sub}/{f.name}".encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def one_preparation(rows: list[dict]) -> None:
    """Refuse (one line) to aggregate rows that name different preparations; rows from
    before the fingerprint was recorded (no ``prep``) are taken as they are."""
    preps = sorted({r["prep"] for r in rows if r.get("prep")})
    if len(preps) > 1:
        raise SystemExit(f"rows from {len(preps)} different preparations ({', '.join(preps)})"
                         f": the corpus/base LM/ASCE differ, so their seeds cannot be "
                         f"averaged; re-run every row on one --run-root cache")


def mean_sd(values: list[float]) -> str:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    if not len(v):
        return "–"
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def tables(rows: list[dict], methods: list[str], chance: float) -> str:
    one_preparation(rows)
    by = {m: [r for r in rows if r["method"] == m] for m in methods}

    def col(m, key):
        return mean_sd([r.get(key) for r in by[m]])

    n = {m: sum(np.isfinite(r.get("author_accuracy") or np.nan) for r in by[m])
         for m in methods}
    t2 = ["| method | Author Acc. ↑ | Macro-F1 ↑ | Verif. AUC ↑ | EER ↓ | BERTScore | "
          "SemSim ↑ | kept / generated | seeds | paper Acc. / AUC / SemSim |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for m in [m for m in TABLE2 if n.get(m)] + [m for m in methods
                                                if m not in TABLE2 + TABLE4 and n.get(m)]:
        kept = sum(r["kept"] for r in by[m])
        gen = sum(r["generations"] for r in by[m])
        p = PAPER2.get(m)
        t2.append(f"| {LABELS[m]} | {col(m, 'author_accuracy')} | {col(m, 'macro_f1')} | "
                  f"{col(m, 'gen_gen_auc')} | {col(m, 'gen_gen_eer')} | n/a | "
                  f"{col(m, 'semsim')} | {kept} / {gen} | {n[m]} | "
                  + (f"{p[0]:.3f} / {p[2]:.3f} / {p[5]:.3f} |" if p else "– |"))
    t4 = ["| variant | Author Acc. ↑ | Macro-F1 ↑ | BERTScore | Stylometric gen→source AUC ↑ "
          "| ASCE gen→source AUC ↑ | seeds | paper Acc. / StyleDist. AUC |",
          "|---|---|---|---|---|---|---|---|"]
    for m in [m for m in TABLE4 if n.get(m)]:
        p = PAPER4[m]
        t4.append(f"| {LABELS[m]} | {col(m, 'author_accuracy')} | {col(m, 'macro_f1')} | n/a | "
                  f"{col(m, 'stylo_gen_source_auc')} | {col(m, 'gen_source_auc')} | {n[m]} | "
                  f"{p[0]:.3f} / {p[3]:.3f} |")
    return (f"### Table 2 columns (collaborative methods; chance accuracy {chance:.3f})\n\n"
            + "\n".join(t2) + "\n\n### Table 4 columns (component ablations)\n\n"
            + "\n".join(t4) + "\n")


def lambda_table(rows: list[dict], lambdas: list[float], reference: list[str],
                 chance: float) -> str:
    """The λ_align sweep aggregated over seeds: one row per λ (FAVoR), then the reference
    methods; mean ± sample sd over the seeds that have the row."""
    one_preparation(rows)
    keys = [("author_accuracy", "Author Acc. ↑"), ("macro_f1", "Macro-F1 ↑"),
            ("gen_gen_auc", "Verif. AUC ↑"), ("gen_gen_eer", "EER ↓"),
            ("stylo_gen_source_auc", "Stylometric gen→source AUC ↑"),
            ("gen_source_auc", "ASCE gen→source AUC ↑"), ("semsim", "SemSim ↑"),
            ("global_next_token_accuracy", "global next-token acc.")]
    head = ["| method | λ_align | " + " | ".join(k[1] for k in keys)
            + " | kept / generated | never sampled | seeds |",
            "|---|---|" + "---|" * (len(keys) + 3)]
    groups = [("favor", lam) for lam in lambdas] + [(m, None) for m in reference]
    for method, lam in groups:
        sel = [r for r in rows if r["method"] == method and (lam is None or
                                                             r.get("lambda_align") == lam)]
        if not sel:
            continue
        label = LABELS[method] + (" w/o ASCE" if method == "favor" and lam == 0 else "")
        never = sorted({r.get("never_sampled") for r in sel} - {None})
        head.append(f"| {label} | {'–' if lam is None else f'{lam:g}'} | "
                    + " | ".join(mean_sd([r.get(k) for r in sel]) for k, _ in keys)
                    + f" | {sum(r['kept'] for r in sel)} / {sum(r['generations'] for r in sel)}"
                    f" | {', '.join(map(str, never)) or '–'} | "
                    f"{', '.join(str(r['seed']) for r in sel)} |")
    return (f"### λ_align sweep (FAVoR; chance accuracy {chance:.3f})\n\n"
            + "\n".join(head) + "\n")


def lambda_sweep(args: argparse.Namespace) -> None:
    """Run (or continue) the λ_align sweep: see the module docstring."""
    import favor_blogtext

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    old = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    rows, seconds = old.get("rows", []), old.get("seconds", {})
    plan = [(s, "favor", lam) for s in args.seeds for lam in args.lambdas] + \
        [(s, m, None) for m in args.reference for s in args.seeds]
    for seed, method, lam in plan:
        tag = f"{method}-seed{seed}" if lam is None else f"lambda{lam:g}-seed{seed}"
        if any(r["method"] == method and r["seed"] == seed and r.get("lambda_align") == lam
               for r in rows):
            continue  # finished before
        t0 = time.time()
        argv = ["--variants", method, "--seed", str(seed), "--ks",
                "--data-seed", str(args.data_seed), "--authors", str(args.authors),
                "--out", f"{args.run_root}/{tag}", "--cache", f"{args.run_root}/cache"]
        for s in args.set + ([] if lam is None else [f"algorithm.lambda_align={lam}"]):
            argv += ["--set", s]
        result = favor_blogtext.main(argv)
        seconds[tag] = round(time.time() - t0, 1)
        prep = prep_fingerprint(f"{args.run_root}/cache")
        for r in result["rows"]:
            if method == "favor":  # authors that deploy the global adapter, never trained
                r.setdefault("never_sampled", args.authors - r["personalized_clients"])
            rows.append({**r, "seed": seed, "lambda_align": lam, "prep": prep})
        path.write_text(json.dumps({"args": vars(args), "code": code_version(),
                                    "seconds": seconds, "rows": rows}, indent=1, default=str))
        out.with_suffix(".md").write_text(
            lambda_table(rows, args.lambdas, args.reference, 1 / args.authors))
        print(f"{tag} done in {seconds[tag]:.0f}s", flush=True)
    text = lambda_table(rows, args.lambdas, args.reference, 1 / args.authors)
    out.with_suffix(".md").write_text(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=list(dict.fromkeys(TABLE2 + TABLE4)),
                    choices=list(LABELS), help="default: every method of Tables 2 and 4")
    ap.add_argument("--authors", type=int, default=50)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/favor_study",
                    help="OUT.json and OUT.md are written")
    ap.add_argument("--run-root", default="/tmp/fedray-favor-study")
    ap.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override passed to every run")
    ap.add_argument("--lambdas", type=float, nargs="+",
                    help="run the λ_align sweep of FAVoR instead of Tables 2 and 4 "
                         "(issue #16: 0 0.1 0.3 1.0)")
    ap.add_argument("--reference", nargs="*", default=[], choices=list(LABELS),
                    help="with --lambdas: methods run once per seed as reference rows")
    ap.add_argument("--fresh", action="store_true",
                    help="with --lambdas: redo the (method, λ, seed) rows OUT.json has")
    args = ap.parse_args()
    if args.lambdas:
        lambda_sweep(args)
        return

    import favor_blogtext

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, seconds = [], {}
    for seed in args.seeds:
        t0 = time.time()
        argv = ["--variants", *args.methods, "--seed", str(seed), "--ks",
                "--data-seed", str(args.data_seed), "--authors", str(args.authors),
                "--out", f"{args.run_root}/seed{seed}", "--cache", f"{args.run_root}/cache"]
        for s in args.set:
            argv += ["--set", s]
        result = favor_blogtext.main(argv)
        seconds[seed] = round(time.time() - t0, 1)
        prep = prep_fingerprint(f"{args.run_root}/cache")
        rows += [{**r, "seed": seed, "prep": prep} for r in result["rows"]]
        out.with_suffix(".json").write_text(json.dumps(
            {"args": vars(args), "code": code_version(), "seconds": seconds, "rows": rows},
            indent=1, default=str))
        print(f"seed {seed} done in {seconds[seed]:.0f}s", flush=True)
    text = tables(rows, args.methods, 1 / args.authors)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
