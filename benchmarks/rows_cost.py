"""What the round logger costs the driver between two rounds: ``round_rows`` (the round's
row and its clients' rows) and ``MetricsWriter.write_round`` (the two Parquet part files)
for one round of ``--clients`` clients, each OK with two metrics and a simulated time, as
the FedAvg rounds of ``benchmarks/scale.py`` log them. Best of ``--repeats`` (each the mean
of five calls), in milliseconds::

    .venv/bin/python benchmarks/rows_cost.py --clients 10000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import timeit

import numpy as np

from fedray.core.storage import Storage
from fedray.methods.base import ClientResult, Status
from fedray.observe.metrics import MetricsWriter
from fedray.runtime.rows import Evaluation, RoundRecord, round_rows


def record(k: int, seed: int = 0) -> RoundRecord:
    g = np.random.default_rng(seed)
    sampled = sorted(g.choice(10 * k, k, replace=False).tolist())
    final = {c: ClientResult(c, 3, Status.OK, 16, None,
                             {"train_loss": float(g.random()), "update_norm": float(g.random())},
                             "", 1418 * 4 + 64, 0.001, "default/0") for c in sampled}
    return RoundRecord(3, sampled, final, {c: 1 for c in sampled}, {c: 5700 for c in sampled},
                       Evaluation(), {}, 0, 0.3, {c: {"sim_seconds": 1.0} for c in sampled},
                       {"sim_seconds": 1.0})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    rec = record(a.clients)
    tier = lambda c: "default"  # noqa: E731
    totals = {"upload_bytes": 1, "download_bytes": 2}
    writer = MetricsWriter(Storage(tempfile.mkdtemp(prefix="fedray-rows-")))
    row, clients = round_rows(rec, tier, totals)
    writer.write_round(1, row, clients)  # warm: pyarrow's first Parquet write
    best = {
        "round_rows_ms": min(timeit.repeat(lambda: round_rows(rec, tier, totals), number=5,
                                           repeat=a.repeats)) / 5 * 1e3,
        "write_round_ms": min(timeit.repeat(lambda: writer.write_round(2, row, clients),
                                            number=5, repeat=a.repeats)) / 5 * 1e3}
    print(json.dumps({"clients": a.clients, **{k: round(v, 2) for k, v in best.items()}}))


if __name__ == "__main__":
    main()
