"""The round logger's clients' rows, built column by column (``client_columns``), against
the row-by-row formulation they replace (kept here as the oracle): the same columns,
values, types and round row, for rounds with failed, rejected, dropped and evaluated-only
clients, per-client policy metrics, flags, client states and fine-tuned scores."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from fedray.methods.base import ClientResult, EvalResult, Status
from fedray.observe.metrics import _table, columns_table
from fedray.runtime.rows import Evaluation, RoundRecord, round_rows


def oracle_rows(rec: RoundRecord, tier_of, per_client: dict) -> list[dict]:
    """One dict per client, as the logger built them before 2026-12-06."""
    rows = []
    for c in sorted(set(rec.sampled) | set(rec.evaluation.clients)):
        tier = tier_of(c)
        row = {"round": rec.round, "client_id": c, "tier": tier, "sampled": c in rec.final}
        if c in rec.final:
            res, d = rec.final[c], rec.download[c]
            row.update(status=str(res.status), error=res.error, attempts=rec.attempts[c],
                       executor=res.executor, num_samples=res.num_samples,
                       upload_bytes=res.upload_bytes, download_bytes=d,
                       seconds=res.seconds, **{k: float(v) for k, v in res.metrics.items()})
            if res.state_version is not None:
                row["state_bytes"] = float(res.state_bytes)
        row.update({k: float(v) for k, v in per_client.get(c, {}).items()})
        row.update(rec.client_extra.get(c, {}))
        ev = rec.evaluation.clients.get(c)
        if ev is not None:
            row.update(eval_loss=ev.loss, eval_accuracy=ev.accuracy, eval_samples=ev.n)
            if ev.finetuned is not None:
                row.update(ft_loss=ev.finetuned.loss, ft_accuracy=ev.finetuned.accuracy)
        rows.append(row)
    return rows


def record(seed: int, mixed: bool) -> RoundRecord:
    g = np.random.default_rng(seed)
    sampled = sorted(g.choice(500, 60, replace=False).tolist())
    statuses = [Status.OK, Status.ERROR, Status.REJECTED, Status.DROPPED] if mixed else \
        [Status.OK]
    final = {}
    for c in sampled:
        s = statuses[int(g.integers(len(statuses)))]
        metrics = {"train_loss": float(g.random()), "update_norm": np.float32(g.random())} \
            if s is Status.OK else {}
        if mixed and s is Status.OK and g.random() < 0.3:
            metrics["acc_before"] = float(g.random())  # a metric only some clients have
        final[c] = ClientResult(c, 4, s, int(g.integers(1, 40)), None, metrics,
                                "boom" if s is Status.ERROR else "",
                                int(g.integers(0, 10_000)), float(g.random()),
                                f"default/{c % 2}",
                                4 if mixed and s is Status.OK and c % 3 == 0 else None,
                                int(g.integers(0, 500)))
    evals = {}
    if mixed:
        for c in sorted(g.choice(500, 40, replace=False).tolist()):
            tuned = EvalResult(float(g.random()), float(g.random()), 9.0) if c % 4 == 0 \
                else None
            evals[c] = EvalResult(float(g.random()), float(g.random()), float(c % 7), {},
                                  tuned)
    extra = {c: {"sim_seconds": float(g.random())} for c in sampled}
    if mixed:
        for c in sampled[::5]:
            extra[c]["malicious"] = bool(c % 2)
    per_client = {c: {"robust_kept": float(c % 2), "update_norm": 7.0}
                  for c in sampled[::3]} if mixed else {}
    return RoundRecord(4, sampled, final, {c: 1 + c % 3 for c in sampled},
                       {c: 5_000 + c for c in sampled}, Evaluation(evals, {}),
                       {"per_client": per_client, "ranked": 3} if per_client else {},
                       0, 0.25, extra, {"sim_seconds": 1.5})


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


@pytest.mark.parametrize("seed,mixed", [(0, False), (1, True), (2, True), (3, True)])
def test_client_columns_are_the_rows_they_replace(seed, mixed):
    rec = record(seed, mixed)
    tier_of = {c: ("slow" if c % 5 == 0 else "fast") for c in range(500)}.__getitem__
    row, columns = round_rows(rec, tier_of, {"upload_bytes": 10, "download_bytes": 20})
    per_client = rec.policy_metrics.get("per_client", {})
    want = _table(oracle_rows(rec, tier_of, per_client))
    got = columns_table(columns)
    assert sorted(got.column_names) == sorted(want.column_names)
    if not mixed:  # every row alike: the same order too
        assert got.column_names == want.column_names
    for name in want.column_names:
        assert got.schema.field(name).type == want.schema.field(name).type, name
        assert all(same(a, b) for a, b in zip(got.column(name).to_pylist(),
                                              want.column(name).to_pylist(), strict=True))
    # the round row: each tier's bytes, the status counts, and the same keys in order
    oracle = oracle_rows(rec, tier_of, per_client)
    for tier in ("slow", "fast"):
        ran = [r for r in oracle if r["sampled"] and r["tier"] == tier]
        assert row[f"tier/{tier}/upload_bytes"] == sum(r["upload_bytes"] for r in ran)
        assert row[f"tier/{tier}/download_bytes"] == sum(r["download_bytes"] for r in ran)
    for status, key in ((Status.ERROR, "failed"), (Status.REJECTED, "rejected"),
                        (Status.DROPPED, "dropped")):
        assert row[key] == sum(r.status is status for r in rec.final.values())
    assert row["upload_bytes"] == sum(r.upload_bytes for r in rec.final.values())
    if mixed:  # a policy's per-client value replaces the client's own metric of that name
        kept = [c for c in rec.sampled[::3] if rec.final[c].ok]
        norms = dict(zip(got.column("client_id").to_pylist(),
                         got.column("update_norm").to_pylist(), strict=True))
        assert kept and all(norms[c] == 7.0 for c in rec.sampled[::3])


def test_clashing_names_replace_as_a_row_update_did():
    """Keys of one group named like another's columns (a client's extra ``tier``,
    ``upload_bytes``, ``client_id``, a None replacing a metric, on a sampled and on an
    evaluated-only client) replace that row's value as before, and the tiers' byte totals
    still come from the results."""
    rec = record(5, True)
    first_eval = min(rec.evaluation.clients)
    sampled_ok = next(c for c in rec.sampled if rec.final[c].ok)
    rec.client_extra[sampled_ok] |= {"tier": "zz", "upload_bytes": 5, "train_loss": None}
    rec.client_extra[first_eval] = {"client_id": 7, "upload_bytes": 3}
    tier_of = {c: ("slow" if c % 5 == 0 else "fast") for c in range(500)}.__getitem__
    row, columns = round_rows(rec, tier_of, {"upload_bytes": 0, "download_bytes": 0})
    per_client = rec.policy_metrics.get("per_client", {})
    oracle = oracle_rows(rec, tier_of, per_client)
    want, got = _table(oracle), columns_table(columns)
    assert sorted(got.column_names) == sorted(want.column_names)
    for name in want.column_names:
        assert got.schema.field(name).type == want.schema.field(name).type, name
        assert all(same(a, b) for a, b in zip(got.column(name).to_pylist(),
                                              want.column(name).to_pylist(), strict=True))
    assert "tier/zz/upload_bytes" not in row
    assert row["tier/fast/upload_bytes"] + row["tier/slow/upload_bytes"] == sum(
        r.upload_bytes for r in rec.final.values())


def test_a_round_without_clients_writes_its_row_only(tmp_path):
    from fedray.core.storage import Storage
    from fedray.observe.metrics import MetricsWriter

    rec = RoundRecord(2, [], {}, {}, {}, Evaluation(), {}, 0, 0.1)
    row, columns = round_rows(rec, lambda c: "default", {"upload_bytes": 0,
                                                          "download_bytes": 0})
    writer = MetricsWriter(Storage(str(tmp_path)))
    writer.write_round(2, row, columns)
    assert writer.read("clients") is None
    assert writer.read("rounds").column("round").to_pylist() == [2]
    assert isinstance(columns_table(columns), pa.Table)
