"""What summing a cohort's uploads costs, client by client against as one stack, for MLPs
of a few sizes (random float32 updates, weights 1..300): an executor's partial sum of a
cohort (``accumulate`` per client against ``accumulate_rows``), the driver's mean of
``--mean-clients`` clients in cohorts of ``--cohort`` (``weighted_mean`` over per-client
dicts against over ``StackRow``s) and a cohort's batch schedule (written batch by batch
against ``cohort.schedules``), and the driver's mean of large uploads with each float64 term
formed whole against in ``add_weighted``'s cache-sized blocks (``TERM_BLOCK``; the MLP
784-256-10 and LEAF's FEMNIST CNN). Each pair is checked bit for bit. Best of ``--repeats``, in
milliseconds::

    .venv/bin/python benchmarks/reduce_cost.py
"""

from __future__ import annotations

import argparse
import json
import timeit

import numpy as np

from fedray.methods import base
from fedray.methods.base import StackRow, accumulate, accumulate_rows
from fedray.methods.fedavg.policy import weighted_mean
from fedray.models.cohort import schedules
from fedray.models.training import cohort_batches

# LEAF's FEMNIST CNN (benchmarks/femnist_workload.py's), 6,603,710 numbers an upload
FEMNIST_CNN = {"c1.weight": (32, 1, 5, 5), "c1.bias": (32,), "c2.weight": (64, 32, 5, 5),
               "c2.bias": (64,), "f1.weight": (2048, 3136), "f1.bias": (2048,),
               "f2.weight": (62, 2048), "f2.bias": (62,)}
SHAPES = {"32-32-10": (32, 32, 10), "128-64-10": (128, 64, 10), "784-64-62": (784, 64, 62),
          "784-256-10": (784, 256, 10)}


def stack(sizes: tuple[int, int, int], k: int, gen: np.random.Generator) -> dict:
    """``k`` uploads of an MLP ``sizes[0]``-``sizes[1]``-``sizes[2]``, stacked."""
    i, h, o = sizes
    return {name: gen.standard_normal((k, *shape)).astype(np.float32)
            for name, shape in (("0.weight", (h, i)), ("0.bias", (h,)),
                                ("2.weight", (o, h)), ("2.bias", (o,)))}


def best(fn, repeats: int) -> float:
    return min(timeit.repeat(fn, number=1, repeat=repeats)) * 1e3


def cohort_sum(sizes, k: int, repeats: int, gen) -> dict:
    up = stack(sizes, k, gen)
    w = gen.integers(1, 300, k).astype(float).tolist()

    def one_by_one():
        acc: dict = {}
        for i in range(k):
            accumulate(acc, {n: v[i] for n, v in up.items()}, w[i])
        return acc

    def stacked():
        acc: dict = {}
        accumulate_rows(acc, up, w)
        return acc

    a, b = one_by_one(), stacked()
    assert all(a[n].tobytes() == b[n].tobytes() for n in a)
    return {"numbers": sum(v[0].size for v in up.values()), "clients": k,
            "client_by_client_ms": best(one_by_one, repeats),
            "stacked_ms": best(stacked, repeats)}


def driver_mean(sizes, clients: int, cohort: int, repeats: int, gen) -> dict:
    rows = []
    for first in range(0, clients, cohort):
        part = stack(sizes, min(cohort, clients - first), gen)
        rows += [StackRow(part, r) for r in range(len(part["0.bias"]))]
    n = gen.integers(1, 300, clients).tolist()
    as_rows = [(c, n[c], u) for c, u in enumerate(rows)]
    as_dicts = [(c, s, {k: u[k] for k in u}) for c, s, u in as_rows]
    a, b = weighted_mean(as_dicts), weighted_mean(as_rows)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    return {"numbers": sum(np.size(v) for v in rows[0].values()), "clients": clients,
            "per_client_dicts_ms": best(lambda: weighted_mean(as_dicts), repeats),
            "stack_rows_ms": best(lambda: weighted_mean(as_rows), repeats)}


def term_blocks(shapes: dict[str, tuple[int, ...]], clients: int, repeats: int, gen
                ) -> dict:
    """``weighted_mean`` of ``clients`` uploads of ``shapes`` with every term formed whole
    (``TERM_BLOCK`` past the largest tensor) and in blocks (the default), per upload."""
    ups = [(c, int(gen.integers(100, 300)), {k: gen.standard_normal(v).astype(np.float32)
                                             for k, v in shapes.items()})
           for c in range(clients)]
    default, times, means = base.TERM_BLOCK, {}, {}
    try:
        for label, block in (("whole_term_ms", 1 << 62), ("blocks_ms", default)):
            base.TERM_BLOCK = block
            means[label] = weighted_mean(ups)
            times[label] = best(lambda: weighted_mean(ups), repeats) / clients
    finally:
        base.TERM_BLOCK = default
    a, b = means.values()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    return {"numbers": sum(int(np.prod(v)) for v in shapes.values()), "clients": clients,
            **times}


def schedule(k: int, samples: int, batch: int, repeats: int) -> dict:
    data = [(np.zeros((samples, 1), np.float32), np.zeros(samples, np.int64))] * k
    kw = dict(epochs=1, batch_size=batch, seed=0, round=1, max_steps=None, purpose="local")

    def batch_by_batch():
        sched = cohort_batches([samples] * k, list(range(k)), batch, 1, 0, 1)
        offsets = np.cumsum([0] + [samples] * k)
        steps = max(len(s) for s in sched)
        width = max(len(b) for s in sched for b in s)
        idx = np.full((steps, k, width), offsets[-1], np.int64)
        mask = np.zeros((steps, k, width), np.float32)
        for i, s in enumerate(sched):
            for t, b in enumerate(s):
                idx[t, i, :len(b)] = offsets[i] + b
                mask[t, i, :len(b)] = 1.0
        return idx, mask

    a, b = batch_by_batch(), schedules(data, list(range(k)), **kw)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
    return {"clients": k, "samples": samples, "batch": batch,
            "batch_by_batch_ms": best(batch_by_batch, repeats),
            "at_once_ms": best(lambda: schedules(data, list(range(k)), **kw), repeats)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--cohort", type=int, default=256)
    p.add_argument("--mean-clients", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    gen = np.random.default_rng(0)
    out = {"cohort_sum": {name: cohort_sum(s, a.cohort, a.repeats, gen)
                          for name, s in SHAPES.items()},
           "driver_mean": {name: driver_mean(s, a.mean_clients if s[0] < 784 else 100,
                                             a.cohort, a.repeats, gen)
                           for name, s in SHAPES.items()},
           "schedule": schedule(2_500, 16, 32, a.repeats),
           "term_blocks": {
               "784-256-10": term_blocks({"0.weight": (256, 784), "0.bias": (256,),
                                          "2.weight": (10, 256), "2.bias": (10,)}, 100,
                                         a.repeats, gen),
               "femnist-cnn": term_blocks(FEMNIST_CNN, 30, a.repeats, gen)}}
    print(json.dumps(out, indent=1, default=lambda v: round(v, 2)))


if __name__ == "__main__":
    main()
