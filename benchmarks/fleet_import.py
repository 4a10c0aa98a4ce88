"""How long ``fedray fleet import-fedscale`` takes on a long FedScale behaviour trace.

Issue #34: the importer searched each active interval's end by scanning the client's
``inactive`` list from the start, quadratic in the intervals of one client (40,000 took
35 s). It now does one binary search per interval (:func:`fedray.services.fleet.
fedscale_sessions`). This script writes real pickles — by default one client with 400,000
active intervals (10x the issue's largest case, all in one client: the worst case for the
old scan) plus ``--clients - 1`` small ones — and times :func:`import_fedscale` end to end
(unpickling, checking every number, writing the CSV files), best of ``--repeat`` runs.
``--reference N`` also times the old scan on the first N intervals of that client, for the
comparison (keep N small: it is quadratic).

    PYTHONPATH=. python benchmarks/fleet_import.py [--intervals 400000] [--clients 1000]
        [--repeat 3] [--reference 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import tempfile
import time

import numpy as np

from fedray.services.fleet import fedscale_sessions, import_fedscale


def traces(intervals: int, clients: int, seed: int = 0) -> tuple[dict, dict]:
    """FedScale-shaped pickles: client 0 alternates ``intervals`` online sessions with
    offline gaps (sorted floats, like FedScale's traces); the others have 4 sessions each."""
    gen = np.random.default_rng(seed)
    steps = gen.uniform(1.0, 60.0, size=2 * intervals).cumsum()
    cap = {c: {"computation": float(gen.uniform(5, 200)),
               "communication": float(gen.uniform(100, 50_000))} for c in range(clients)}
    beh = {0: {"active": steps[0::2].tolist(), "inactive": steps[1::2].tolist(),
               "finish_time": float(steps[-1]) + 1.0}}
    for c in range(1, clients):
        t = gen.uniform(1.0, 600.0, size=8).cumsum().tolist()
        beh[c] = {"active": t[0::2], "inactive": t[1::2], "finish_time": t[-1] + 1.0}
    return cap, beh


def old_sessions(active: list, inactive: list, finish: float) -> list:
    """The importer's former per-interval scan (quadratic)."""
    out = []
    for j, a in enumerate(active):
        end = next((o for o in inactive if o > a), finish)
        if j + 1 < len(active):
            end = min(end, active[j + 1])
        if end > a:
            out.append((a, end))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", type=int, default=400_000)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reference", type=int, default=0,
                    help="also time the old scan on this many intervals (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    cap, beh = traces(args.intervals, args.clients)
    total = sum(len(b["active"]) for b in beh.values())
    with tempfile.TemporaryDirectory() as tmp:
        cap_path, beh_path = os.path.join(tmp, "cap.pkl"), os.path.join(tmp, "beh.pkl")
        with open(cap_path, "wb") as f:
            pickle.dump(cap, f)
        with open(beh_path, "wb") as f:
            pickle.dump(beh, f)
        times = []
        for r in range(args.repeat):
            out = os.path.join(tmp, f"out{r}")
            t0 = time.perf_counter()
            written = import_fedscale(cap_path, out, beh_path)
            times.append(time.perf_counter() - t0)
        with open(written[2]) as f:
            rows = sum(1 for _ in f) - 1
    best = min(times)
    result = {"intervals": total, "clients": args.clients, "rows_written": rows,
              "seconds": round(best, 3), "intervals_per_s": round(total / best)}
    if args.reference:
        b = beh[0]
        n = min(args.reference, len(b["active"]))
        a, i = b["active"][:n], b["inactive"][:n]
        t0 = time.perf_counter()
        want = old_sessions(a, i, b["finish_time"])
        old = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = fedscale_sessions(a, i, b["finish_time"])
        new = time.perf_counter() - t0
        assert got == want
        result["reference"] = {"intervals": n, "old_scan_s": round(old, 3),
                               "new_search_s": round(new, 4)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"import-fedscale: {total:,} intervals ({args.clients:,} clients, "
              f"{rows:,} rows written) in {best:.2f} s = {total / best:,.0f} intervals/s "
              f"(best of {args.repeat})")
        if args.reference:
            ref = result["reference"]
            print(f"sessions of {ref['intervals']:,} intervals of one client: old scan "
                  f"{ref['old_scan_s']:.2f} s, binary search {ref['new_search_s']:.4f} s")


if __name__ == "__main__":
    main()
