"""Flower's own robust aggregators on updates fedray wrote; run in .venv-flower by
tests/test_flower_robust.py:

    .venv-flower/bin/python tests/flower_robust_run.py IN.npz OUT.npz

IN.npz holds ``u/<c>/<i>`` (client c's layer i, float64), ``n`` (the clients' sample
counts), ``f`` (malicious count), ``m`` (Multi-Krum's to_keep) and ``trim``; OUT.npz gets
``<rule>/<i>`` for krum, multi_krum, bulyan, median and trimmed_mean. Standalone: it
imports numpy and flwr only.
"""

from __future__ import annotations

import sys

import numpy as np
from flwr.server.strategy.aggregate import (
    aggregate_bulyan,
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)


def main(src: str, dst: str) -> None:
    data = np.load(src)
    n = data["n"]
    layers = len([k for k in data.files if k.startswith("u/0/")])
    results = [([data[f"u/{c}/{i}"] for i in range(layers)], int(n[c])) for c in range(len(n))]
    f, m, trim = int(data["f"]), int(data["m"]), float(data["trim"])
    out = {"krum": aggregate_krum(list(results), f, 0),
           "multi_krum": aggregate_krum(list(results), f, m),
           "bulyan": aggregate_bulyan(list(results), f, aggregate_krum, to_keep=0),
           "median": aggregate_median(list(results)),
           "trimmed_mean": aggregate_trimmed_avg(list(results), trim)}
    np.savez(dst, **{f"{rule}/{i}": np.asarray(a, np.float64) for rule, arrays in out.items()
                     for i, a in enumerate(arrays)})


if __name__ == "__main__":
    main(*sys.argv[1:])
