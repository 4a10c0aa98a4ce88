"""The round logger, pure: what one round produced (:class:`RoundRecord`) → its metrics row
and its clients' rows. Every per-client quantity is reduced in client-id order, so the
rows are bitwise the same whatever the executor count or finish order."""

from __future__ import annotations

import math
from collections import Counter
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


_ABSENT = object()  # a client_extra key a row lacks (None is a value there)


def client_columns(rec: RoundRecord, tier_of: Callable[[int], str], per_client: dict
                   ) -> dict[str, list[Any]]:
    """One row per client sampled or evaluated in the round, in client-id order, as
    columns (None where a row has no value): ``round``, ``client_id``, ``tier``,
    ``sampled``; for the sampled ``status``, ``error``, ``attempts``, ``executor``,
    ``num_samples``, ``upload_bytes``, ``download_bytes``, ``seconds``, the client's
    metrics and ``state_bytes``; then the policy's ``per_client`` metrics, the round's
    ``client_extra`` and the local scores (``eval_*``, ``ft_*``). A later group's value
    replaces an earlier one of the same name, as a row dict's update would. Built column
    by column: 10,000 clients a round are the driver's work between two rounds."""
    cids = sorted(set(rec.sampled) | set(rec.evaluation.clients))
    n = len(cids)
    res = [rec.final.get(c) for c in cids]
    cols: dict[str, list[Any]] = {"round": [rec.round] * n, "client_id": list(cids),
                                  "tier": [tier_of(c) for c in cids],
                                  "sampled": [r is not None for r in res]}

    def put(key: str, values: list[Any], absent: Any = None) -> None:  # one per row
        if key not in cols:
            cols[key] = values if absent is None else [None if v is absent else v
                                                       for v in values]
            return
        col = cols[key]  # a later group's value replaces an earlier one's
        for i, v in enumerate(values):
            if v is not absent:
                col[i] = v

    if any(r is not None for r in res):
        names = {s: s.value for s in Status}
        both = list(zip(cids, res, strict=True))
        put("status", [None if r is None else names[r.status] for r in res])
        put("error", [None if r is None else r.error for r in res])
        put("attempts", [None if r is None else rec.attempts[c] for c, r in both])
        put("executor", [None if r is None else r.executor for r in res])
        put("num_samples", [None if r is None else r.num_samples for r in res])
        put("upload_bytes", [None if r is None else r.upload_bytes for r in res])
        put("download_bytes", [None if r is None else rec.download[c] for c, r in both])
        put("seconds", [None if r is None else r.seconds for r in res])
        mets = [None if r is None else r.metrics for r in res]
        for key in dict.fromkeys(k for m in mets if m is not None for k in m):
            put(key, [None if m is None or key not in m else float(m[key]) for m in mets])
        if any(r is not None and r.state_version is not None for r in res):
            put("state_bytes", [None if r is None or r.state_version is None else
                                float(r.state_bytes) for r in res])
    policy = [per_client.get(c) for c in cids]
    for key in dict.fromkeys(k for m in policy if m is not None for k in m):
        put(key, [None if m is None or key not in m else float(m[key]) for m in policy])
    extra = [rec.client_extra.get(c) for c in cids]  # values as they are, None included
    for key in dict.fromkeys(k for m in extra if m is not None for k in m):
        put(key, [_ABSENT if m is None or key not in m else m[key] for m in extra], _ABSENT)
    if rec.evaluation.clients:
        evs = [rec.evaluation.clients.get(c) for c in cids]
        put("eval_loss", [None if e is None else e.loss for e in evs])
        put("eval_accuracy", [None if e is None else e.accuracy for e in evs])
        put("eval_samples", [None if e is None else e.n for e in evs])
        if any(e is not None and e.finetuned is not None for e in evs):
            put("ft_loss", [None if e is None or e.finetuned is None else e.finetuned.loss
                            for e in evs])
            put("ft_accuracy", [None if e is None or e.finetuned is None else
                                e.finetuned.accuracy for e in evs])
    return cols


def tier_bytes(rec: RoundRecord, tier_of: Callable[[int], str]) -> dict[str, float]:
    """Each tier's upload and download bytes in the round (``tier/<name>/upload_bytes``,
    ``.../download_bytes``), tiers in the order their first sampled client (by id) comes;
    from the results themselves, whatever columns of those names a client's row holds."""
    up: dict[str, int] = {}
    down: dict[str, int] = {}
    for c in sorted(rec.final):
        tier = tier_of(c)
        up[tier] = up.get(tier, 0) + rec.final[c].upload_bytes
        down[tier] = down.get(tier, 0) + rec.download[c]
    return {f"tier/{t}/{kind}": v for t in up
            for kind, v in (("upload_bytes", up[t]), ("download_bytes", down[t]))}


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
               ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(the round's row, its clients' rows as columns: :func:`client_columns`); ``totals``
    are the ledger's running totals after the round. ``rec.policy_metrics`` may hold
    ``per_client`` {client: {name: value}}, which goes to the clients' rows."""
    policy_metrics = dict(rec.policy_metrics)
    per_client = policy_metrics.pop("per_client", {})
    clients = client_columns(rec, tier_of, per_client)
    per_tier = tier_bytes(rec, tier_of)
    results = [rec.final[c] for c in rec.sampled]
    ok = [res for res in results if res.ok]
    n_ok = [res.num_samples for res in ok]
    losses = [res.metrics.get("train_loss", math.nan) for res in ok]
    scores = _scores(rec.evaluation, per_tier)
    status = Counter(res.status for res in results)
    row = {
        "round": rec.round, "sampled": len(rec.sampled), "ok": len(ok),
        "failed": status[Status.ERROR], "rejected": status[Status.REJECTED],
        **{s.value: status[s] for s in (Status.DROPPED, Status.LATE, Status.SURPLUS)},
        **rec.extra,
        "train_loss": float(np.average(losses, weights=n_ok)) if ok else math.nan,
        **scores,
        "upload_bytes": sum(res.upload_bytes for res in results),
        "download_bytes": sum(rec.download.values()),
        "cum_upload_bytes": totals["upload_bytes"],
        "cum_download_bytes": totals["download_bytes"],
        "cum_bytes": totals["upload_bytes"] + totals["download_bytes"],
        "executor_restarts": rec.restarts, "seconds": rec.seconds,
        **{f"policy/{k}": float(v) for k, v in policy_metrics.items()},
        **per_tier,
    }
    return row, clients
