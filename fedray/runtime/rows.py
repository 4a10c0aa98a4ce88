"""The round logger, pure: what one round produced (:class:`RoundRecord`) → its metrics row
and its clients' rows. Every per-client quantity is reduced in client-id order, so the
rows are bitwise the same whatever the executor count or finish order."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.methods.base import ClientResult, EvalResult, Status


@dataclass
class Evaluation:
    """One round's scores: per client (its local test split) and per tier (global test)."""

    clients: dict[int, EvalResult] = field(default_factory=dict)
    tiers: dict[str, EvalResult] = field(default_factory=dict)


@dataclass
class RoundRecord:
    """What one round produced, as the metrics tables log it."""

    round: int
    sampled: list[int]
    final: dict[int, ClientResult]
    attempts: dict[int, int]
    download: dict[int, int]  # bytes each sampled client downloaded (all attempts, base)
    evaluation: Evaluation
    policy_metrics: dict[str, Any]
    restarts: int
    seconds: float
    client_extra: dict[int, dict[str, float]] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)


def client_rows(rec: RoundRecord, tier_of: Callable[[int], str], per_client: dict,
                per_tier: dict[str, float]) -> list[dict[str, Any]]:
    """One row per client sampled or evaluated in the round; each tier's bytes are added
    to ``per_tier`` on the way."""
    rows = []
    for c in sorted(set(rec.sampled) | set(rec.evaluation.clients)):
        tier = tier_of(c)
        row: dict[str, Any] = {"round": rec.round, "client_id": c, "tier": tier,
                               "sampled": c in rec.final}
        if c in rec.final:
            res, d = rec.final[c], rec.download[c]
            for kind, nbytes in (("upload_bytes", res.upload_bytes), ("download_bytes", d)):
                key = f"tier/{tier}/{kind}"
                per_tier[key] = per_tier.get(key, 0) + nbytes
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


# evaluate's task scores, as global_*
GLOBAL_EXTRAS = ("perplexity", "macro_ap", "macro_ap_present", "micro_ap")


def _scores(evaluation: Evaluation, per_tier: dict[str, float]) -> dict[str, float]:
    """Personalized and global scores of the round; each tier's scores go to
    ``per_tier``. The global score of a fleet is the unweighted mean over tiers of each
    tier's own model."""
    # a client without local test samples (all cut, fedray.models.pretrain) is not scored
    scored = [e for e in evaluation.clients.values() if e.n > 0]
    accs = np.array([e.accuracy for e in scored])
    ft = np.array([e.finetuned.accuracy for e in scored
                   if e.finetuned is not None and e.finetuned.n > 0])
    scores = evaluation.tiers
    g = {}
    if scores:
        g = {"accuracy": float(np.mean([v.accuracy for v in scores.values()])),
             "loss": float(np.mean([v.loss for v in scores.values()]))}
    per_tier |= {f"tier/{t}/{k}": float(v) for t, res in scores.items()
                 for k, v in {"loss": res.loss, "accuracy": res.accuracy,
                              **res.extra}.items()}
    asr = [v.extra["attack_success_rate"] for v in scores.values()
           if "attack_success_rate" in v.extra]  # a backdoor's, on the global test set
    # task scores beyond accuracy (next-token, multi-label), the mean over tiers as above
    extra = {f"global_{k}": float(np.mean(vals)) for k in GLOBAL_EXTRAS
             if (vals := [v.extra[k] for v in scores.values() if k in v.extra])}
    return {**({"attack_success_rate": float(np.mean(asr))} if asr else {}), **extra,
            "personalized_accuracy": float(accs.mean()) if accs.size else math.nan,
            "personalized_accuracy_std": float(accs.std()) if accs.size else math.nan,
            "personalized_accuracy_ft": float(ft.mean()) if ft.size else math.nan,
            "global_accuracy": float(g.get("accuracy", math.nan)),
            "global_loss": float(g.get("loss", math.nan)),
            # rows (tokens for next-token tasks) scored: the sample or the whole partition
            "global_n": float(np.mean([v.n for v in scores.values()])) if scores else math.nan}


def round_rows(rec: RoundRecord, tier_of: Callable[[int], str], totals: dict[str, int]
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the round's row, its clients' rows); ``totals`` are the ledger's running totals
    after the round. ``rec.policy_metrics`` may hold ``per_client`` {client: {name:
    value}}, which goes to the clients' rows."""
    policy_metrics = dict(rec.policy_metrics)
    per_client = policy_metrics.pop("per_client", {})
    per_tier: dict[str, float] = {}
    clients = client_rows(rec, tier_of, per_client, per_tier)
    final = rec.final
    ok = [final[c] for c in rec.sampled if final[c].ok]
    n_ok = [res.num_samples for res in ok]
    losses = [res.metrics.get("train_loss", math.nan) for res in ok]
    scores = _scores(rec.evaluation, per_tier)
    row = {
        "round": rec.round, "sampled": len(rec.sampled), "ok": len(ok),
        "failed": sum(final[c].status is Status.ERROR for c in rec.sampled),
        "rejected": sum(final[c].status is Status.REJECTED for c in rec.sampled),
        **{s.value: sum(final[c].status is s for c in rec.sampled)
           for s in (Status.DROPPED, Status.LATE, Status.SURPLUS)},
        **rec.extra,
        "train_loss": float(np.average(losses, weights=n_ok)) if ok else math.nan,
        **scores,
        "upload_bytes": sum(final[c].upload_bytes for c in rec.sampled),
        "download_bytes": sum(rec.download.values()),
        "cum_upload_bytes": totals["upload_bytes"],
        "cum_download_bytes": totals["download_bytes"],
        "cum_bytes": totals["upload_bytes"] + totals["download_bytes"],
        "executor_restarts": rec.restarts, "seconds": rec.seconds,
        **{f"policy/{k}": float(v) for k, v in policy_metrics.items()},
        **per_tier,
    }
    return row, clients
