"""The synchronous round: sample, broadcast once per tier, train (with retries), time every
client on the fleet clock, accept the uploads that report in time and are free of NaN and
Inf, hand them to a colluding adversary if the run has one, aggregate them in client-id
order (or the executors' partial sums), evaluate, log.

The fleet (:mod:`fedray.services.fleet`) times every client in simulated seconds from the byte
ledger and its device profile, and applies the participation rules: only online clients
are sampled; over-commitment samples ``ceil((1 + o) K)`` and aggregates the first ``K`` to
finish; dropouts, offline clients and clients past the deadline do not report; a round
with fewer than ``fleet.min_reports`` reports is logged as failed and leaves the model
unchanged; fewer than ``runtime.min_accepted`` accepted uploads stop the run
(:class:`~fedray.runtime.jobs.RoundFailedError`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedray.methods.base import ClientResult, State, Status
from fedray.runtime.dispatch import Trained, combine
from fedray.runtime.jobs import Broadcast, RoundFailedError
from fedray.runtime.parts import RoundParts
from fedray.runtime.rows import Evaluation, RoundRecord

LOST = (Status.DROPPED, Status.LATE, Status.SURPLUS)
DROPPED = Status.DROPPED  # a module constant: looked up once per client


class SyncLoop:
    """Drives the parts one synchronous round at a time (stateless: everything it needs
    to continue is in the parts)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def inflight_clients(self) -> dict[int, int]:
        """Nobody is in flight between synchronous rounds."""
        return {}

    def step(self, p: RoundParts) -> dict:
        """Run the next round; return its metrics row."""
        t0 = time.perf_counter()
        r = p.server.round + 1
        draw = p.sampler.draw(r, p.ledger.sim_time)
        sampled = draw.clients
        if not sampled:
            return self.idle(p, r, t0, wait=draw.wait)
        p.clients.touched.update(sampled)
        tiers = p.tiers.many(sampled)
        drop = p.fleet.dropped(r, np.array(sampled, dtype=np.int64))
        params = p.server.params
        bcast = p.dispatcher.broadcasts(lambda tier: p.policy.broadcast(params, r, tier),
                                        set(tiers), f"{r}:train")
        restarts_before = p.dispatcher.restarts
        trained = p.dispatcher.train([c for c, d in zip(sampled, drop, strict=True) if not d],
                                     bcast, r, p.clients.version, p.server.shapes())
        for c, d in zip(sampled, drop, strict=True):
            if d:
                trained.attempts[c] = 1
                trained.final[c] = ClientResult(c, r, Status.DROPPED,
                                                error="dropped out mid-round")
        final, attempts = trained.final, trained.attempts
        if p.secagg is not None:
            secure_begin(p.secagg, r, sampled, final, elements(p, trained),
                         {c for c in final if not trained.upload(c)[1]})
        download = p.ledger.charge_downloads(sampled, attempts,
                                             {c: bcast[t].nbytes for c, t in
                                              zip(sampled, tiers, strict=True)})
        times, duration = time_round(p, sampled, tiers, final, download, draw.reports)
        accepted = accept(p, trained)
        p.ledger.charge_uploads(sampled, final)
        restarts = p.dispatcher.restarts - restarts_before
        start = p.ledger.sim_time
        p.ledger.sim_time += duration
        lost = sum(final[c].status in LOST for c in sampled)
        failed = len(accepted) < p.cfg.fleet.min_reports
        p.server.failed_rounds += failed
        extra = {"sim_seconds": duration, "cum_sim_seconds": p.ledger.sim_time,
                 "round_failed": float(failed)} | p.dp_row()
        accepted = p.attack(accepted, extra)
        client_extra = {c: {"sim_seconds": t} for c, t in times.items()}
        if len(accepted) + lost < p.cfg.runtime.min_accepted:
            p.log(RoundRecord(r, sampled, final, attempts, download, Evaluation(), {},
                              restarts, time.perf_counter() - t0, client_extra, extra))
            raise RoundFailedError(r, len(accepted), p.cfg.runtime.min_accepted,
                                   [(c, str(final[c].status), final[c].error) for c in sampled
                                    if not final[c].ok])
        if p.secagg is not None:  # the protocol runs (and costs) even when it cannot sum
            policy_metrics, broke = secure_aggregate(p, r, sampled, [] if failed else accepted,
                                                     start, final, download, extra,
                                                     client_extra)
            if broke and not failed:
                p.server.failed_rounds += 1
                extra["round_failed"] = 1.0
        elif failed:
            policy_metrics = {}
        else:
            policy_metrics = aggregate(p, trained, accepted, r, extra, bcast)
        p.server.round = r
        return p.log(RoundRecord(r, sampled, final, attempts, download, p.evaluate(r, sampled),
                                 policy_metrics, restarts, time.perf_counter() - t0,
                                 client_extra, extra))

    def idle(self, p: RoundParts, r: int, t0: float, wait: bool = True) -> dict:
        """A round in which no client is online (or a Poisson draw picked none): the clock
        jumps to the next time one comes online (``wait``); the round is logged as failed
        and the model is unchanged (nothing is released: no privacy spent)."""
        later = p.next_online(r) if wait else p.ledger.sim_time
        duration = later - p.ledger.sim_time
        p.ledger.sim_time = later
        p.server.failed_rounds += 1
        extra = {"sim_seconds": duration, "cum_sim_seconds": p.ledger.sim_time,
                 "round_failed": 1.0, **p.dp_row()}
        policy_metrics: dict[str, Any] = {}
        if p.privacy is not None:  # DP releases every round: here the noise alone
            p.server.params, policy_metrics = p.policy.aggregate(
                p.server.params, p.privatize([], r, extra), r)
        p.server.round = r
        return p.log(RoundRecord(r, [], {}, {}, {}, p.evaluate(r, []), policy_metrics, 0,
                                 time.perf_counter() - t0, {}, extra))


def accept(p: RoundParts, trained: Trained) -> list[tuple[int, int, State | None]]:
    """The reporting uploads free of NaN and Inf, in client-id order, as (client, samples,
    decoded upload or None when summed on its executor); the others marked rejected. The
    accepted clients' state versions become current."""
    accepted = []
    for cid in sorted(trained.final):
        res = trained.final[cid]
        upload, clean = trained.upload(cid)
        if res.ok and not clean:
            res.status, res.error = Status.REJECTED, "upload contains NaN or Inf"
        if res.ok:
            accepted.append((cid, res.num_samples, upload))
            p.clients.record(cid, res.state_version)
    return accepted


def aggregate(p: RoundParts, trained: Trained, accepted: list, r: int, extra: dict,
              bcast: dict[str, Broadcast]) -> dict[str, Any]:
    """The policy's step from the accepted uploads (or the executors' partial sums); with
    central DP it releases every round, even with nobody accepted. A rule that needs the
    server's own update on a root dataset (FLTrust) gets it first, trained from the
    round's broadcast. Returns its metrics."""
    if p.cfg.runtime.reduce == "executors" and accepted:
        total, weight = combine(trained.partials)
        if weight > 0:
            p.server.params, metrics = p.policy.aggregate_sum(p.server.params, total, weight,
                                                              r)
            return metrics
        return {}
    if accepted and p.policy.root_samples:  # the server's own update first (FLTrust)
        p.policy.set_reference(p.dispatcher.root_update(bcast, r,
                                                        p.policy.root_samples))
    if accepted or p.privacy is not None:
        p.server.params, metrics = p.policy.aggregate(p.server.params,
                                                      p.privatize(accepted, r, extra), r)
        return metrics
    return {}


def elements(p: RoundParts, trained: Trained) -> int:
    """Words in one client's secure-aggregation input this round (from the first upload
    that reported; 0 when none did)."""
    for c in sorted(trained.final):
        upload, _ = trained.upload(c)
        if trained.final[c].ok and upload is not None:
            return int(p.secagg.vector(p.server.params, upload).flat.size)
    return 0


def secure_begin(secagg: Any, r: int, sampled: list[int], final: dict[int, ClientResult],
                 elements: int, unclean: set[int]) -> None:
    """Before the clock times the round: the clients that leave secure aggregation before
    sharing keys are dropped (their training wasted, no upload); a client whose update
    holds NaN or Inf sends nothing (it checks before masking: the server could not); every
    other upload is a masked input of ``elements`` words."""
    left = secagg.leave_before_sharing(r, sampled)
    for c in sampled:
        res = final[c]
        if c in left and res.ok:
            res.status, res.error = Status.DROPPED, "left SecAgg before sharing keys"
            res.upload_bytes = 0
        elif res.ok:
            res.upload_bytes = 0 if c in unclean else secagg.masked_bytes(elements)


def secure_aggregate(p: RoundParts, r: int, sampled: list[int], accepted: list, start: float,
                     final: dict[int, ClientResult], download: dict[int, int], extra: dict,
                     client_extra: dict) -> tuple[dict[str, Any], bool]:
    """The round through secure aggregation (:mod:`fedray.services.secure_round`): its
    protocol bytes on the ledger and in each client's up and down bytes (the masked input
    already is its upload), its phases on the clock, a failed protocol a failed round
    (model unchanged, nothing released); else the method's linear step from the unmasked
    sum with unit weights, or central DP's release from it (noise calibrated to the
    quantized update's bound). Returns (the policy's metrics, whether the protocol
    failed). The key phases are charged after training although they run before it: a
    fraction of a second that the deadline and availability checks leave out."""
    tiers = {c: p.tiers.of(c) for c in sampled}

    def link(ids: np.ndarray, down: np.ndarray, up: np.ndarray) -> np.ndarray:
        return p.fleet.seconds(ids, [tiers[int(c)] for c in ids], down, up,
                               np.zeros(len(ids)))["total"]

    ids = np.array(sampled, dtype=np.int64)
    until = dict(zip(sampled, p.fleet.online_until(ids, start).tolist(), strict=True))
    res = p.secagg.run(r, p.server.params, sampled, accepted, link, until, p.ledger.sim_time)
    up, down = res.extra_bytes()
    p.ledger.charge_protocol(up, down)
    for c in sampled:
        final[c].upload_bytes += up.get(c, 0)
        download[c] += down.get(c, 0)
    spent = sum(res.seconds.values())
    p.ledger.sim_time += spent
    extra["sim_seconds"] += spent
    extra["cum_sim_seconds"] = p.ledger.sim_time
    extra.update(res.row())
    for c in sampled:
        client_extra.setdefault(c, {}).update(res.client_row(c))
    if res.failed:
        return {}, True
    if p.privacy is not None:
        mean, metrics = p.privacy.release(p.server.params, res.total, res.within,
                                          len(res.included), r,
                                          p.secagg.sensitivity_slack(res.elements))
        extra.update(metrics)
        p.server.params, out = p.policy.aggregate(p.server.params,
                                                  [(c, 1, mean) for c in res.included], r)
        return out, False
    p.server.params, out = p.policy.aggregate_sum(p.server.params, res.total,
                                                  float(len(res.included)), r)
    return out, False


def time_round(p: RoundParts, sampled: list[int], tiers: list[str],
               final: dict[int, ClientResult], download: dict[int, int], k: int
               ) -> tuple[dict[int, float], float]:
    """Simulated seconds of each sampled client, and of the round; marks clients that go
    offline before finishing (dropped), miss the deadline (late) or finish after the first
    ``k`` reports (surplus; the reports ordered by time, then client id). Their uploads
    never complete, so they are not charged; a dropout's time is its download."""
    fl = p.cfg.fleet
    ids = np.array(sampled, dtype=np.int64)
    res = [final[c] for c in sampled]
    ok = np.array([r.ok for r in res], dtype=bool)
    ran = np.array([r.status is not DROPPED for r in res], dtype=bool)
    up = np.where(ok, np.array([r.upload_bytes for r in res], dtype=np.int64), 0)
    seen = p.samples_seen(np.array([r.num_samples for r in res], dtype=np.int64))
    parts = p.fleet.seconds(ids, tiers, np.array([download[c] for c in sampled]), up, seen)
    total = np.where(ran, parts["total"], parts["down"])
    offline = p.fleet.online_until(ids, p.ledger.sim_time) - p.ledger.sim_time
    dropped = ok & (total > offline)
    late = ok & ~dropped & (total > fl.deadline_s) if fl.deadline_s is not None else \
        np.zeros(len(res), dtype=bool)
    for i in np.flatnonzero(dropped):
        res[i].status, res[i].error = Status.DROPPED, (
            f"went offline {offline[i]:.1f} s into the round, before finishing")
    for i in np.flatnonzero(late):
        res[i].status, res[i].error = Status.LATE, (
            f"needed {total[i]:.1f} s, the deadline is {fl.deadline_s:g} s")
    reporting = np.flatnonzero(ok & ~dropped & ~late)
    reporting = reporting[np.lexsort((ids[reporting], total[reporting]))]
    lost = ~ran | dropped | late
    for i in reporting[k:]:
        res[i].status, res[i].error = Status.SURPLUS, "the round closed on K reports"
        lost[i] = True
    for i in np.flatnonzero(lost):
        res[i].upload_bytes = 0
    if len(reporting) >= k:
        duration = float(total[reporting[k - 1]]) if len(reporting) else 0.0
    elif fl.deadline_s is not None:
        duration = float(fl.deadline_s)
    else:
        duration = float(np.max(total[reporting])) if len(reporting) else \
            float(np.max(total, initial=0.0))
    return dict(zip(sampled, total.tolist(), strict=True)), duration
