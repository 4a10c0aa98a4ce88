"""Secure aggregation study (issue #32): what SecAgg and SecAgg+ cost in fedray's simulator —
bytes per client, simulated seconds and the wall-clock price of running the real
cryptography — against the cohort size and the dropout rate, and what the quantization
costs in accuracy.

1. **Cohort** (``--cohorts``): one round of :class:`fedray.services.secure_round.
   SecureAggregator` — the real protocol: X25519, HKDF, AES-GCM, Shamir over GF(2^521 − 1),
   AES-CTR masks — over n clients' random updates of ``--elements`` float coordinates,
   32-bit words, no dropout; per client: bytes up and down (mean), the closed form of
   fedray's message sizes (exact: it must equal the measurement), the simulated seconds of
   the protocol's phases on a stated link (2 Mbit/s up, 10 Mbit/s down, 50 ms latency) and
   the wall seconds the simulator spent per client. SecAgg (complete graph) is run up to
   ``--secagg-max`` clients (its cost is quadratic); above it the closed form alone is given.
2. **Dropout** (``--dropouts``): n = ``--dropout-n`` clients, a share p of them sending no
   masked input (they dropped after sharing keys: their masks are removed through the
   survivors' shares); the unmasking's bytes, the server's extra PRG expansions and wall
   seconds, and whether the round failed (default threshold ⌊d/2⌋ + 1), over seeds.
3. **Bits** (``--bits``): FedAvg on scikit-learn digits (50 clients, Dirichlet 0.5, 10 per
   round, 20 rounds, MLP 64) through SecAgg+ with ``secagg.clip`` 0.5 and the default scale
   at each bit width, against the same run without secure aggregation (weighted float mean)
   and with ``protocol=none`` at 32 bits (the unweighted quantized mean in the clear); final
   global accuracy over seeds.

    .venv/bin/python benchmarks/secagg_study.py            # all three, ~10 min on 2 cores
    .venv/bin/python benchmarks/secagg_study.py --parts cohort dropout
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UP_KBPS, DOWN_KBPS, LATENCY_S = 2000.0, 10000.0, 0.05


def link(ids: np.ndarray, down: np.ndarray, up: np.ndarray) -> np.ndarray:
    return down * 8 / (DOWN_KBPS * 1000) + up * 8 / (UP_KBPS * 1000) + LATENCY_S


def config(n: int, protocol: str, extra: list[str] = ()):
    from fedray.core.config import load_config

    return load_config(None, [f"clients.num_clients={n}", f"clients.per_round={n}",
                              "secagg.enabled=true", f"secagg.protocol={protocol}",
                              "secagg.clip=1.0", *extra])


def formula(d: int, m: int, bits: int) -> tuple[int, int]:
    """fedray's per-client bytes (up, down) of a round without dropout, from its message
    sizes (fedray.services.secagg: key 32 B, id 4 B, field element 66 B, AES-GCM + 28 B):
    advertise 2 keys up, d (id + 2 keys) down; share d sealed (2 ids + 2 elements) each way;
    the masked input ⌈bits m / 8⌉ up; unmasking d (id + element) up, d ids down (which of
    its neighbours sent and which dropped). Bonawitz et al.'s O(n + m) per client with d = n − 1,
    Bell et al.'s O(log n + m) with d = k."""
    sealed = 2 * 4 + 2 * 66 + 28
    up = 2 * 32 + d * sealed + (bits * m + 7) // 8 + d * (4 + 66)
    down = d * (4 + 2 * 32) + d * sealed + 4 * d
    return up, down


def one_round(n: int, protocol: str, m: int, seed: int = 0, late: set[int] = frozenset(),
              extra: list[str] = ()) -> dict:
    """One secure round over n clients; ``late`` send no masked input."""
    from fedray.core.seeding import rng
    from fedray.methods.base import ClientResult, Status
    from fedray.runtime.sync_loop import secure_begin
    from fedray.services.secure_round import SecureAggregator

    cfg = config(n, protocol, [f"seed={seed}", *extra])
    agg = SecureAggregator(cfg)
    g = rng(seed, purpose="secagg-study")
    ups = {c: {"w": g.uniform(-0.5, 0.5, m).astype(np.float32)} for c in range(n)}
    sampled = list(range(n))
    final = {c: ClientResult(c, 1, Status.OK, 1) for c in sampled}
    secure_begin(agg, 1, sampled, final, m, set())
    for c in late:
        final[c].status = Status.LATE
    accepted = [(c, 1, ups[c]) for c in sampled if final[c].ok]
    t = time.perf_counter()
    res = agg.run(1, {}, sampled, accepted, link, dict.fromkeys(sampled, math.inf), 0.0)
    wall = time.perf_counter() - t
    up = {c: sum(res.up[ph][c] for ph in res.up) for c in sampled}
    down = {c: sum(res.down[ph][c] for ph in res.down) for c in sampled}
    k = agg.s.graph_degree(n)
    return {"n": n, "protocol": protocol, "elements": m, "seed": seed,
            "degree": k if k is not None else n - 1, "failed": res.failed,
            "reason": res.reason, "wall_s": wall, "wall_s_per_client": wall / n,
            "up_bytes_per_client": float(np.mean(list(up.values()))),
            "down_bytes_per_client": float(np.mean(list(down.values()))),
            "unmask_up_bytes_per_client": float(np.mean(list(res.up["unmask"].values()))),
            "masked_input_bytes": agg.masked_bytes(m),
            "phase_seconds": res.seconds, "protocol_seconds": sum(res.seconds.values())}


def prg_part(args) -> dict:
    """AES-256-CTR keystream as 32-bit words (fedray.services.secagg.prg): ns per word,
    median of 7 expansions of 10^6 words — what ``secagg.prg_ns`` charges the clock."""
    from fedray.services.secagg import prg

    times = []
    for i in range(7):
        t = time.perf_counter()
        prg(bytes([i]) * 32, 1_000_000, 32)
        times.append(time.perf_counter() - t)
    return {"ns_per_word": float(np.median(times)) * 1e3, "words": 1_000_000}


def cohort_part(args) -> list[dict]:
    from tqdm import tqdm

    rows = []
    todo = [(p, n) for n in args.cohorts for p in ("secagg_plus", "secagg")]
    for protocol, n in tqdm(todo, desc="cohort"):
        s = config(n, protocol).secagg
        d = s.neighbours(n)
        up, down = formula(d, args.elements, s.bits)
        row = {"n": n, "protocol": protocol, "degree": d, "formula_up": up,
               "formula_down": down, "plain_upload": (s.bits * args.elements + 7) // 8}
        if protocol == "secagg" and n > args.secagg_max:
            row["measured"] = False
        else:
            row |= one_round(n, protocol, args.elements) | {"measured": True}
        rows.append(row)
    return rows


def dropout_part(args) -> list[dict]:
    from tqdm import tqdm

    rows = []
    todo = [(p, q, s) for q in args.dropouts for p in ("secagg_plus", "secagg")
            for s in args.seeds]
    for protocol, q, seed in tqdm(todo, desc="dropout"):
        n = args.dropout_n
        g = np.random.default_rng(seed)
        late = set(g.choice(n, int(round(q * n)), replace=False).tolist())
        row = one_round(n, protocol, args.elements, seed, late)
        rows.append(row | {"dropout": q, "dropped": len(late)})
    return rows


def bits_part(args) -> list[dict]:
    import ray
    from tqdm import tqdm

    from fedray.core.config import load_config
    from fedray.observe.metrics import read_metrics
    from fedray.runtime import run_experiment
    from fedray.runtime.warm import release_warm

    base = ["rounds=20", "clients.num_clients=50", "clients.per_round=10", "local.epochs=1",
            "local.batch_size=16", "local.lr=0.05", "model.hidden=[64]", "eval.every=20",
            "eval.clients=none", "data.dataset=digits", "data.partition=dirichlet",
            "data.alpha=0.5", "runtime.keep_warm=true",
            "runtime.tiers=[{name: default, executors: 2, num_cpus: 1}]"]
    arms = {"no secagg (weighted float mean)": [],
            "clear quantized sum, 32 bits": ["secagg.enabled=true", "secagg.protocol=none",
                                             "secagg.bits=32", "secagg.clip=0.5"]}
    arms |= {f"secagg_plus, {b} bits": ["secagg.enabled=true", f"secagg.bits={b}",
                                        "secagg.clip=0.5"] for b in args.bits}
    rows = []
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory() as work:
            for (arm, extra), seed in tqdm([(a, s) for a in arms.items() for s in args.seeds],
                                           desc="bits"):
                run_dir = os.path.join(work, f"{len(rows)}")
                cfg = load_config(None, base + extra + [f"seed={seed}"])
                t = time.perf_counter()
                summary = run_experiment(cfg, run_dir, progress=False)
                r = read_metrics(run_dir, "rounds").to_pandas()
                sec = summary.get("secagg", {})
                rows.append({"arm": arm, "seed": seed, "wall_s": time.perf_counter() - t,
                             "accuracy": summary["final_global_accuracy"],
                             "bits": sec.get("bits"), "scale": sec.get("scale"),
                             "sim_seconds": float(r["sim_seconds"].sum()),
                             "bytes": summary["total_upload_bytes"]
                             + summary["total_download_bytes"],
                             "protocol_bytes": sec.get("protocol_bytes", 0)})
    finally:
        release_warm()
        ray.shutdown()
    return rows


def tables(rows: dict, out: str) -> str:
    parts = []
    if rows.get("prg"):
        parts += [f"PRG (AES-256-CTR, 32-bit words): {rows['prg']['ns_per_word']:.1f} ns per "
                  f"word on one core here (median of 7 × 10^6 words); `secagg.prg_ns` "
                  f"defaults to 20.", ""]
    if rows.get("cohort"):
        parts += ["#### Per-client cost against the cohort (one round, no dropout, "
                  f"{rows['cohort'][0].get('elements', '?')} coordinates, 32-bit words)", "",
                  "| protocol | n | d | up B/client (measured / formula) | down B/client "
                  "(measured / formula) | × plain upload | protocol s (simulated) | "
                  "wall s per client |", "|---|---|---|---|---|---|---|---|"]
        for r in rows["cohort"]:
            meas = r.get("measured")
            up = f"{r['up_bytes_per_client']:,.0f} / {r['formula_up']:,}" if meas else \
                f"– / {r['formula_up']:,}"
            down = f"{r['down_bytes_per_client']:,.0f} / {r['formula_down']:,}" if meas else \
                f"– / {r['formula_down']:,}"
            ratio = ((r["formula_up"] + r["formula_down"]) / r["plain_upload"])
            sim = f"{r['protocol_seconds']:.3f}" if meas else "–"
            wall = f"{r['wall_s_per_client'] * 1e3:.2f} ms" if meas else "–"
            parts.append(f"| {r['protocol']} | {r['n']:,} | {r['degree']} | {up} | {down} | "
                         f"{ratio:.2f} | {sim} | {wall} |")
        parts.append("")
    if rows.get("dropout"):
        import pandas as pd

        df = pd.DataFrame(rows["dropout"])
        g = df.groupby(["protocol", "dropout"]).agg(
            failed=("failed", "mean"), unmask=("unmask_up_bytes_per_client", "mean"),
            seconds=("protocol_seconds", "mean"), wall=("wall_s", "mean")).reset_index()
        parts += [f"#### Against the dropout rate (n = {int(df['n'].iloc[0])}, dropped after "
                  f"sharing keys, {df['seed'].nunique()} seeds)", "",
                  "| protocol | dropout | rounds failed | unmask B/client | protocol s "
                  "(simulated) | wall s |", "|---|---|---|---|---|---|"]
        for _, r in g.iterrows():
            parts.append(f"| {r['protocol']} | {r['dropout']:.0%} | {r['failed']:.0%} | "
                         f"{r['unmask']:,.0f} | {r['seconds']:.3f} | {r['wall']:.2f} |")
        parts.append("")
    if rows.get("bits"):
        import pandas as pd

        df = pd.DataFrame(rows["bits"])
        g = df.groupby("arm", sort=False).agg(acc=("accuracy", "mean"),
                                              sd=("accuracy", "std"),
                                              scale=("scale", "first"),
                                              pb=("protocol_bytes", "mean"),
                                              b=("bytes", "mean")).reset_index()
        parts += [f"#### Accuracy against the bit width (digits, 20 rounds, "
                  f"{df['seed'].nunique()} seeds)", "",
                  "| arm | scale | final global accuracy | protocol bytes / all bytes |",
                  "|---|---|---|---|"]
        for _, r in g.iterrows():
            scale = "–" if r["scale"] is None or pd.isna(r["scale"]) else f"{r['scale']:.4g}"
            parts.append(f"| {r['arm']} | {scale} | {r['acc']:.3f} ± {r['sd']:.3f} | "
                         f"{r['pb'] / r['b']:.3f} |")
        parts.append("")
    text = "\n".join(parts)
    with open(os.path.join(out, "TABLES.md"), "w") as f:
        f.write(text + "\n")
    plot(rows, out)
    return text


def plot(rows: dict, out: str) -> None:
    from fedray.observe.plots import axis_label, save
    from fedray.observe.plots import pyplot as plt

    if not rows.get("cohort"):
        return
    fig, ax = plt().subplots(figsize=(6.4, 4.4))
    for protocol in ("secagg", "secagg_plus"):
        rs = [r for r in rows["cohort"] if r["protocol"] == protocol]
        ax.plot([r["n"] for r in rs], [r["formula_up"] + r["formula_down"] for r in rs],
                marker="o", label=f"{protocol} (formula)")
        meas = [r for r in rs if r.get("measured")]
        ax.scatter([r["n"] for r in meas],
                   [r["up_bytes_per_client"] + r["down_bytes_per_client"] for r in meas],
                   marker="x", s=60, color="black", zorder=3)
    ax.scatter([], [], marker="x", color="black", label="measured (real protocol)")
    ax.set(xscale="log", yscale="log", xlabel="clients per round",
           ylabel=axis_label("bytes per client per round", "B", "↓ better"),
           title="SecAgg vs SecAgg+: per-client bytes")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, out, "secagg_bytes_vs_cohort.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["prg", "cohort", "dropout", "bits"],
                    choices=["prg", "cohort", "dropout", "bits"])
    ap.add_argument("--cohorts", type=int, nargs="+",
                    default=[10, 30, 100, 300, 1000, 3000, 5000])
    ap.add_argument("--secagg-max", type=int, default=300)
    ap.add_argument("--elements", type=int, default=10_000)
    ap.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    ap.add_argument("--dropout-n", type=int, default=100)
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 10, 12, 16, 24])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "secagg_study"))
    ap.add_argument("--table", action="store_true", help="only redraw from rows.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "rows.json")
    rows = json.load(open(path)) if os.path.exists(path) else {}
    if not args.table:
        for part in args.parts:
            rows[part] = {"prg": prg_part, "cohort": cohort_part, "dropout": dropout_part,
                          "bits": bits_part}[part](args)
            with open(path, "w") as f:
                json.dump(rows, f, indent=1, default=float)
    print(tables(rows, args.out))


if __name__ == "__main__":
    main()
