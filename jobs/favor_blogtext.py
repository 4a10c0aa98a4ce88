"""FAVoR on BlogText: does collaborative LoRA homogenize author style, and does FAVoR keep it?

With no arguments it runs the embedded default end to end on this machine: a synthetic
50-author corpus in BlogText's schema, a tiny Qwen2 LM and the ASCE style encoder trained
here on disjoint authors, then FAVoR, FedAvg, Ditto and local-only (12 clients per round,
6 rounds), each followed by the style evaluation (author accuracy / macro-F1, verification
AUC/EER in ASCE space and with stylometric features, silhouette, centroid distance,
SemSim), then the cold-start transfer to 10 held-out authors at K = 1, 4 and 16 shots
(``--ks``); the tables land in
OUT/RESULTS.md + results.parquet (plot: style_retention.png) and OUT/COLD_START.md +
cold_start.parquet. Measured here: 16 min on 2 cores (`time python jobs/favor_blogtext.py`).

Progress goes to stderr stage by stage (corpus, base LM, ASCE, each method's federation and
evaluation, cold start); the end prints the tables and where the files are, or with
``--json`` one JSON object (nothing else on stdout). ``-v`` also shows the libraries' own
progress bars and warnings.

    python jobs/favor_blogtext.py                               # embedded default
    ray job submit --working-dir . -- python jobs/favor_blogtext.py \\
        --data-root /data/blogtext.csv --model Qwen/Qwen2.5-3B-Instruct \\
        --asce-backbone distilroberta-base --gpus 0.25 --out s3://bucket/favor
    ... --stress                                                # 100 authors, 20/round, 20 rounds

``--smoke`` is a minutes-long CPU version of the same path (CI).

LoRA is the paper's (r 16, α 32 on all seven projections). Roster authors that no round
trained (never sampled) deploy the final global adapter and are scored (``--unsampled
global``, the default) or are left out of the style metrics (``--unsampled exclude``: it
only changes the evaluation, so a finished run is rescored, not retrained; ``-s
algorithm.unsampled=...`` sets the same policy as part of the run's config); the table's
"never sampled" column counts them either way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import _bootstrap  # noqa: F401  (fedray importable from a submitted working dir)

from fedray.observe.console import JobParser, add_output_args, emit, guarded, set_verbosity

VARIANTS = ["favor", "fedavg", "ditto", "local"]
# method -> (algorithm.variant, algorithm.align); None: the variant's default
METHODS = {"favor": ("favor", None), "fedavg": ("fedavg", None), "fedprox": ("fedprox", None),
           "pfedme": ("pfedme", None), "ditto": ("ditto", None), "feddpa": ("feddpa", None),
           "local": ("local", None), "global_asce": ("global_asce", None),
           "ditto_asce": ("ditto", True), "local_asce": ("local", True),
           "favor_no_asce": ("favor", False), "pooled": ("fedavg", None)}


def main(argv: list[str] | None = None) -> dict:
    p = JobParser(description=__doc__)
    p.add_argument("--data-root", help="blogtext.csv (default: the synthetic corpus)")
    p.add_argument("--model", help="base LM hub id or directory (default: the tiny LM)")
    p.add_argument("--asce-backbone", help="ASCE encoder (default: the shipped MiniLM)")
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=list(METHODS),
                   help="methods: the FL variants, the ablations ditto_asce, local_asce, "
                        "favor_no_asce, and pooled (centralized PEFT on all authors' data)")
    p.add_argument("--authors", type=int, default=50)
    p.add_argument("--per-round", type=int, default=12)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--stress", action="store_true", help="100 authors, 20 per round, 20 rounds")
    p.add_argument("--gpus", type=float, default=0.0, help="GPU fraction per executor")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--seed", type=int, default=0,
                   help="the run's seed: post split, roster, word allocation, LoRA init, "
                        "client sampling, generation")
    p.add_argument("--data-seed", type=int, help="seed of the embedded default's corpus, "
                                                  "base LM and ASCE (default: --seed)")
    p.add_argument("--out", default="runs/favor-blogtext",
                   help="output: a local directory or a pyarrow.fs URI (s3://...)")
    p.add_argument("--cache", help="local directory for the corpus, base LM and ASCE "
                                   "(default OUT/cache, or runs/favor-cache for a URI)")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of the same path")
    p.add_argument("--ks", type=int, nargs="*", default=[1, 4, 16],
                   help="cold-start shots K (default 1 4 16; none: skip the cold-start "
                        "transfer; --smoke keeps the first). A held-out author with fewer "
                        "than K train posts is skipped at that K and counted")
    p.add_argument("--unsampled", choices=["global", "exclude"],
                   help="policy for roster authors no round trained, at evaluation only (a "
                        "finished run is rescored, not retrained): global = they deploy the "
                        "final global adapter, exclude = left out of the style metrics "
                        "(default: the config's algorithm.unsampled, global)")
    p.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE")
    add_output_args(p)
    args = p.parse_args(argv)
    set_verbosity(args.verbose)
    if args.stress:
        args.authors, args.per_round, args.rounds = 100, 20, 20

    from fedray.core.config import load_config
    from fedray.core.registry import build_method
    from fedray.core.spec import redact
    from fedray.core.storage import Storage
    from fedray.data import build_data
    from fedray.methods.favor.evaluate import evaluate_style
    from fedray.methods.favor.lm import TinyLM
    from fedray.methods.favor.pooled import train_pooled
    from fedray.methods.favor.prepare import embedded_overrides, prepare_embedded
    from fedray.observe.progress import Progress
    from fedray.runtime import init_ray, resumable, run_experiment
    from fedray.runtime.devices import run_on_device

    t0 = time.time()
    remote = "://" in args.out
    out = args.out if remote else os.path.abspath(args.out)
    cache = os.path.abspath(args.cache or ("runs/favor-cache" if remote
                                           else os.path.join(out, "cache")))
    algo = ["algorithm.name=favor", "algorithm.gini=0.25"]
    data_seed = args.seed if args.data_seed is None else args.data_seed
    cold_start = "favor" in args.variants and bool(args.ks)
    progress = Progress((3 if args.data_root is None else 2) + 2 * len(args.variants)
                        + cold_start, enabled=not args.no_progress)
    if args.data_root is None:  # the embedded default
        if args.smoke:
            args.authors, args.per_round, args.rounds = 6, 3, 2
            args.ks = args.ks[:1]
            lm = TinyLM(vocab_size=400, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, steps=40, batch_size=8, max_length=64,
                        seed=data_seed)
            prep = prepare_embedded(cache, args.authors, data_seed, pretrain_authors=4,
                                    lm=lm, roster_posts=(12, 16), progress=progress)
        else:
            prep = prepare_embedded(cache, args.authors, data_seed, progress=progress)
        algo += embedded_overrides(prep)
        csv = prep["csv"]
        prep_holdout = prep["holdout"]
    else:
        csv = args.data_root
        from transformers import AutoTokenizer

        from fedray.data.blogtext import load_authors
        from fedray.methods.favor.data import split_roles
        from fedray.methods.favor.prepare import train_style_encoder

        prep_holdout = None  # the authors in neither the roster nor the ASCE set
        model = args.model or "Qwen/Qwen2.5-3B-Instruct"
        with progress.stage("corpus"):
            tok = AutoTokenizer.from_pretrained(model)
            authors = load_authors(csv, lambda t: len(tok(t)["input_ids"]), 30_000,
                                   args.seed)
            asce_authors, _ = split_roles(authors, args.authors, 50, args.seed)
        with progress.stage("ASCE", unit="batches") as stage:
            asce = train_style_encoder([t for a in asce_authors for t in a.train],
                                       [a.id for a in asce_authors for _ in a.train],
                                       os.path.join(cache, "asce"),
                                       backbone=args.asce_backbone, epochs=3, max_length=256,
                                       progress=stage.report)
        algo += [f"algorithm.base={model}", f"algorithm.asce={asce}"]
    common = [f"seed={args.seed}", "data.dataset=blogtext", f"data.root={csv}",
              f"clients.num_clients={args.authors}", f"clients.per_round={args.per_round}",
              f"rounds={args.rounds}", "eval.clients=none", "eval.every=0",
              f"runtime.tiers=[{{name: lm, executors: {args.executors}, num_cpus: "
              f"{0.5 if args.gpus == 0 else 1}, num_gpus: {args.gpus}}}]",
              "runtime.placement_timeout_s=300"]
    rows = []
    data = None
    started = False

    def evaluate(variant: str, run_dir: str | None, params, **kw) -> dict:
        """evaluate_style as a Ray task with the executors' GPU share, on the base the
        adapters were trained with (NF4 on CUDA), not the entry's CPU; one stage."""
        with progress.stage(f"evaluation {variant}", sum(len(p) for p in data.prompts),
                            "generations") as stage:
            style = run_on_device(evaluate_style, run_dir, data, params, args.seed,
                                  num_gpus=args.gpus, progress=stage.relay(), **kw)
            stage.report(style["generations"], note=style_note(style))
        return style

    try:
        for variant in args.variants:
            pooled = variant == "pooled"  # centralized reference: one adapter, no federation
            name, align = METHODS[variant]
            cfg = load_config(None, common + algo + [
                f"algorithm.variant={name}", f"name=favor-{variant}"]
                + ([] if align is None else [f"algorithm.align={str(align).lower()}"])
                + args.set)
            data = data or build_data(cfg)  # identical for every method: built once
            started = started or init_ray(cfg)
            params = build_method(cfg).params
            if args.unsampled:  # an evaluation policy: not part of the trained run
                params = dataclasses.replace(params, unsampled=args.unsampled)
            if pooled:  # training too is a Ray task with the executors' GPU share
                with progress.stage("pooled training"):
                    adapter = run_on_device(train_pooled, cfg, data, num_gpus=args.gpus)
                style = evaluate(variant, None, params, adapter=adapter,
                                 archive=f"{out}/pooled")
                extra = {"upload_bytes": 0, "global_next_token_accuracy": None}
            else:
                run_dir = f"{out}/{variant}"
                storage, resume = Storage(run_dir), resumable(run_dir, cfg, data)
                if resume and storage.exists("summary.json"):  # finished: only rescored
                    summary = storage.read_json("summary.json")
                    with progress.stage(cfg.name, unit="rounds") as stage:
                        stage.report(summary["rounds"], cfg.rounds,
                                     note="finished before: evaluated again")
                else:
                    summary = run_experiment(cfg, run_dir, progress=progress, data=data,
                                             resume=resume)
                style = evaluate(variant, run_dir, params, archive=run_dir)
                extra = {"upload_bytes": summary["total_upload_bytes"],
                         "global_next_token_accuracy": summary["final_global_accuracy"]}
            rows.append({"method": variant, **extra, **style})
            write_table(rows, out)  # the table so far: each method's result lands at once
        cold = None
        if cold_start:
            with progress.stage("cold start"):
                cold = run_cold_start(args, out, prep_holdout, csv, args.seed)
    finally:
        if started:
            import ray

            ray.shutdown()
    result = {"out": redact(out), "seconds": round(time.time() - t0, 1), "rows": rows,
              "cold_start": cold}
    emit(result, args.json, results_text(result, out))
    return result


def style_note(style: dict) -> str:
    """A method's headline style scores, for its evaluation's progress line."""
    def num(key: str) -> str:
        v = style.get(key)
        return f"{v:.3f}" if isinstance(v, float) and v == v else "–"  # None, NaN: –

    return (f"author accuracy {num('author_accuracy')}, gen-gen AUC {num('gen_gen_auc')}, "
            f"SemSim {num('semsim')}, kept {style.get('kept')}/{style.get('generations')}, "
            f"never sampled {style.get('never_sampled')} ({style.get('unsampled')})")


def results_text(result: dict, out: str) -> str:
    """The end of the job for people: the RESULTS.md (and COLD_START.md) tables as written,
    and where the files are."""
    from fedray.core.storage import Storage

    storage = Storage(out)
    where = result["out"]
    parts = [f"Style retention ({where}/RESULTS.md):",
             storage.read_bytes("RESULTS.md").decode().rstrip()]
    files = ["  RESULTS.md, results.parquet  the table above (all metrics in the Parquet)",
             "  style_retention.png          its plot"]
    if result["cold_start"]:
        parts += ["", f"Cold start ({where}/COLD_START.md):",
                  storage.read_bytes("COLD_START.md").decode().rstrip()]
        files.append("  COLD_START.md, cold_start.parquet  the cold-start table")
    files.append("  METHOD/  each method's run (generations.parquet: every generation with "
                 "its prompt and reference)")
    minutes, seconds = divmod(int(result["seconds"]), 60)
    return "\n".join(parts + ["", f"files in {where}:", *files,
                              f"finished in {minutes} min {seconds} s"])


def run_cold_start(args, out: str, holdout_csv: str | None, csv: str, seed: int) -> list:
    """K-shot private residuals for 10 held-out authors from the FAVoR run's final shared
    adapter (fedray.methods.favor.cold_start), on the executors' GPU share; the table lands
    in OUT/COLD_START.md + cold_start.parquet."""

    from fedray.core.storage import Storage
    from fedray.methods.favor.cold_start import cold_start_arms
    from fedray.methods.favor.data import holdout_authors
    from fedray.methods.favor.evaluate import final_adapters
    from fedray.runtime import resume_config
    from fedray.runtime.devices import run_on_device

    cfg = resume_config(f"{out}/favor")  # through the config loader's guards and migration
    shared, _ = final_adapters(f"{out}/favor", "fedavg", cfg.clients.num_clients)
    authors = holdout_authors(csv, cfg.clients.num_clients, seed, holdout_csv)
    rows = run_on_device(cold_start_arms, cfg, shared, authors, list(args.ks), seed,
                         num_gpus=args.gpus)
    storage = Storage(out)
    storage.write_parquet("cold_start.parquet", rows)
    storage.write_bytes("COLD_START.md", cold_start_table(rows).encode())
    return rows


def cold_start_table(rows: list[dict]) -> str:
    """COLD_START.md: one line per (K, arm), with the held-out authors scored at that K and
    those skipped for having fewer than K train posts (fedray.methods.favor.cold_start)."""
    def num(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) and math.isfinite(v) else "–"

    lines = ["| K | arm | Sep. Acc | macro-F1 | target sim. | authors (skipped) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['K']} | {r['arm']} | {num(r['sep_accuracy'])} | {num(r['macro_f1'])} | "
              f"{num(r['target_similarity'])} | {r['authors']} ({r['skipped']}) |"
              for r in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict], out: str, authors: int | None = None) -> None:
    """results.parquet, RESULTS.md and style_retention.png under ``out`` (path or URI).
    The plot (fedray.methods.favor.plots) draws the author-attribution chance 1/authors:
    ``authors`` when given, else the roster size of the first stored run's config."""
    import tempfile

    from fedray.core.storage import Storage
    from fedray.methods.favor.plots import style_retention_plot
    from fedray.runtime import resume_config

    storage = Storage(out)
    storage.write_parquet("results.parquet", rows)
    cols = ["author_accuracy", "macro_f1", "gen_gen_auc", "gen_gen_eer", "gen_source_auc",
            "stylo_gen_source_auc", "silhouette", "centroid_distance", "semsim"]
    lines = ["| method | " + " | ".join(cols) + " | kept / generated | never sampled |",
             "|---|" + "---|" * (len(cols) + 2)]
    for r in rows:
        lines.append(f"| {r['method']} | " + " | ".join(
            f"{r[c]:.3f}" if isinstance(r.get(c), float) and math.isfinite(r[c]) else "–"
            for c in cols)
            + f" | {r.get('kept')} / {r.get('generations')} | "
            + (f"{r['never_sampled']}" + (" excluded" if r.get("unsampled") == "exclude"
                                          else "") if "never_sampled" in r else "–") + " |")
    storage.write_bytes("RESULTS.md", ("\n".join(lines) + "\n").encode())
    if authors is None:  # the roster size a run stored (pooled has no run directory)
        for method in dict.fromkeys(r["method"] for r in rows):
            run = Storage(f"{out}/{method}")
            if run.exists("config.yaml"):
                authors = resume_config(f"{out}/{method}").clients.num_clients
                break
    with tempfile.TemporaryDirectory() as tmp:
        path = style_retention_plot(rows, os.path.join(tmp, "style_retention.png"),
                                    authors)["path"]
        with open(path, "rb") as f:
            storage.write_bytes("style_retention.png", f.read())


if __name__ == "__main__":
    raise SystemExit(guarded(main))
