"""fedray's robust rules against Flower 1.42's own ``aggregate_krum`` (Krum and
Multi-Krum), ``aggregate_bulyan``, ``aggregate_median`` and ``aggregate_trimmed_avg`` on
identical float64 updates (issue #30, deliverable 4), run in ``.venv-flower``
(``tests/flower_robust_run.py``). Agreement is ≤ 1e-12 under the conventions both share:
Krum's neighbour count max(1, n − f − 2), Bulyan's iterated Krum on the updates left,
the trimmed count int(βn). One convention differs and is shown: Flower's Multi-Krum
averages the chosen updates weighted by their sample counts, fedray's (Blanchard et
al.'s) unweighted — equal here only because every client reports the same count; with
unequal counts the two differ by exactly the weighting. Continuous random updates (no
ties: Flower's tie order is numpy's argsort/argpartition)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import flower_process

from fedray.methods.robust import rules

SHAPES = [(4, 3), (5,)]
N, F, M, TRIM = 11, 2, 6, 0.2


def inputs(counts):
    g = np.random.default_rng(30)
    data = {f"u/{c}/{i}": g.normal(size=s) * (10.0 if c >= N - F else 1.0)  # 2 outliers
            for c in range(N) for i, s in enumerate(SHAPES)}
    return {**data, "n": np.asarray(counts), "f": F, "m": M, "trim": TRIM}


def rows(data):
    return np.stack([np.concatenate([data[f"u/{c}/{i}"].ravel() for i in range(len(SHAPES))])
                     for c in range(N)])


def flower_run(flower_python, tmp_path, data) -> dict:
    np.savez(tmp_path / "in.npz", **data)
    proc = flower_process(flower_python, "flower_robust_run.py", str(tmp_path / "in.npz"),
                          str(tmp_path / "out.npz"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = np.load(tmp_path / "out.npz")
    return {rule: np.concatenate([out[f"{rule}/{i}"].ravel() for i in range(len(SHAPES))])
            for rule in ("krum", "multi_krum", "bulyan", "median", "trimmed_mean")}


@pytest.mark.flower
@pytest.mark.timeout(3600)
def test_robust_rules_agree_with_flower(flower_python, tmp_path):
    data = inputs([20] * N)
    x = rows(data)
    flower = flower_run(flower_python, tmp_path, data)
    ours = {"krum": rules.krum(x, F), "multi_krum": rules.multi_krum(x, F, M),
            "bulyan": rules.bulyan(x, F), "median": rules.median(x),
            "trimmed_mean": rules.trimmed_mean(x, TRIM)}
    for rule, got in ours.items():
        assert np.max(np.abs(got.aggregate - flower[rule])) <= 1e-12, rule
    assert ours["krum"].kept[N - F:].sum() == 0 and ours["bulyan"].kept[N - F:].sum() == 0
    # the one convention apart: with unequal counts Flower's Multi-Krum is sample-weighted
    counts = np.arange(1, N + 1) * 5
    weighted = flower_run(flower_python, tmp_path, inputs(counts.tolist()))["multi_krum"]
    chosen = np.flatnonzero(ours["multi_krum"].kept)
    w = counts[chosen] / counts[chosen].sum()
    assert np.max(np.abs(weighted - w @ x[chosen])) <= 1e-12
    assert np.max(np.abs(weighted - ours["multi_krum"].aggregate)) > 1e-3
