"""Driver: the round loop of one experiment, run as a Ray actor.

Per round: sample clients from (seed, round); ``ray.put`` each tier's broadcast once; hand
the sampled clients to their tier's executors in batches; gather results as they finish;
re-run clients whose update raised (up to ``runtime.max_client_retries``); reject uploads
with NaN/Inf; stop the run when fewer than ``runtime.min_accepted`` uploads were accepted;
give the accepted uploads to the policy in client-id order; evaluate; log Parquet metrics
(every per-client quantity reduced in client-id order, so the metrics are bitwise the same
whatever the executor count or finish order); checkpoint. It knows no model code and no method.

The fleet (:mod:`fedray.fleet`) times every client in simulated seconds from the byte ledger
and its device profile, and applies the participation rules: only online clients are
sampled; over-commitment samples ``ceil((1 + o) K)`` and aggregates the first ``K`` to finish;
dropouts, offline clients and clients past the deadline do not report; a round with fewer
than ``fleet.min_reports`` reports is logged as failed and leaves the model unchanged. An
asynchronous policy (``buffer_size`` set: FedBuff, FedAsync) is driven instead by an event
queue in simulated time (:meth:`Driver.run_async_step`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from fedray.fleet import Fleet
from fedray.methods.base import (
    AsyncUpdate,
    ClientResult,
    EvalResult,
    State,
    Status,
    accumulate,
    finite,
)
from fedray.metrics import MetricsWriter
from fedray.payload import Payload
from fedray.privacy import CentralDP, poisson_sample
from fedray.registry import make_method
from fedray.runtime.pool import DeadJob, ExecutorPool
from fedray.seeding import rng
from fedray.spec import ConfigError
from fedray.state_store import ClientStateStore
from fedray.storage import Storage

KEEP_CHECKPOINTS = 2


def sample_clients(seed: int, round: int, num_clients: int, k: int) -> list[int]:
    """The clients of ``round``: a uniform draw without replacement, from (seed, round)."""
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(int(c) for c in rng(seed, round, -1, "sample").choice(num_clients, k,
                                                                         replace=False))


class RoundFailedError(RuntimeError):
    """A round had fewer accepted uploads than ``runtime.min_accepted``: the global model was
    not updated and the run stops (its metrics up to and including this round are logged;
    ``--resume`` re-runs the round)."""

    def __init__(self, round: int, accepted: int, needed: int,
                 failures: list[tuple[int, str, str | None]]):
        self.round, self.accepted, self.needed, self.failures = round, accepted, needed, failures
        shown = "; ".join(f"client {c} {status}: {err}" for c, status, err in failures[:3])
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"round {round}: {accepted} accepted uploads, runtime.min_accepted "
                         f"is {needed}; {shown}{more}")

    def __reduce__(self):  # survives pickling (raised inside the driver actor)
        return RoundFailedError, (self.round, self.accepted, self.needed, self.failures)


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def even_groups(items: list, groups: int) -> list[list]:
    """``items`` in order, cut into ``groups`` runs whose sizes differ by at most one."""
    q, r = divmod(len(items), groups)
    bounds = [i * q + min(i, r) for i in range(groups + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def summation_groups(items: list, chunk_size: int | None) -> list[list]:
    """``runtime.reduce=executors``'s groups of one tier's sorted clients: 8 near-equal runs
    (so that 1, 2, 4 or 8 executors get equal shares), or runs of ``chunk_size``; never a
    function of the executor count."""
    return even_groups(items, math.ceil(len(items) / chunk_size) if chunk_size else 8)


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


class Driver:
    def __init__(self, cfg: Any, algorithm_cls: type, pool: ExecutorPool, run_uri: str):
        self.cfg = cfg
        self.pool = pool
        self.run_uri = run_uri
        self.storage = Storage(run_uri)
        self.metrics = MetricsWriter(self.storage)
        self.algorithm = make_method(algorithm_cls, cfg)
        self.policy = self.algorithm.make_policy()
        self.chain = self.algorithm.update_chain()  # uploads are decoded before the policy
        self.round = 0
        self.global_state: dict[str, np.ndarray] = {}
        self.versions: dict[int, int] = {}
        self.kept_versions: dict[int, int] = {}  # the manifest of the previous checkpoint
        self.totals = {"upload_bytes": 0, "download_bytes": 0, "failures": 0, "rejected": 0}
        self.base_bytes = self.algorithm.base_bytes()
        self.has_base: set[int] = set()
        self.num_clients = cfg.clients.num_clients
        self._tiers: dict[int, str] = {}
        self.fleet = Fleet.of(cfg, {t.name: self.algorithm.compute_cost(t)
                                    for t in cfg.runtime.tiers})
        self.sim_time = 0.0
        self.touched: set[int] = set()  # clients that ran since the last checkpoint
        self.failed_rounds = 0
        # asynchronous rules: dispatches in flight, and the global states they started from
        self.asynchronous = self.policy.buffer_size is not None
        self.dispatched = 0
        self.inflight: dict[int, dict[str, Any]] = {}
        self.states: dict[int, dict[str, np.ndarray]] = {}
        self.done: dict[int, tuple[ClientResult, float]] = {}
        self.async_bcast: dict[int, dict[str, tuple]] = {}
        self._data: Any = None
        self._refs: dict[str, dict[str, np.ndarray]] = {}  # decoded broadcasts (weights stage)
        self.bounds: dict[int, float] = {}  # dispatch -> earliest finish (derived, not saved)
        self.privacy = (CentralDP(cfg, self.algorithm.to_delta, self.algorithm.from_delta)
                        if cfg.dp.enabled else None)

    def reset(self, cfg: Any, algorithm_cls: type, pool: ExecutorPool, run_uri: str) -> None:
        """Become the driver of a new run (``runtime.keep_warm``): every attribute is rebuilt
        from these arguments as ``__init__`` builds it."""
        self.release()
        self.__init__(cfg, algorithm_cls, pool, run_uri)  # type: ignore[misc]

    def release(self) -> None:
        """Drop everything of the finished run (its executors are the caller's to keep)."""
        from fedray.runtime.devices import free_device_memory

        self.__dict__.clear()
        free_device_memory()

    def tier_of(self, client: int) -> str:
        """A client's tier (:meth:`ExperimentConfig.tier_of`), remembered for the clients seen:
        no list over the population."""
        t = self._tiers.get(client)
        if t is None:
            self._remember_tiers([client])
            t = self._tiers[client]
        return t

    def _remember_tiers(self, clients: list[int]) -> None:
        """Look up the tiers of clients not seen yet, at once (vectorised); the cache is
        bounded whatever the population."""
        new = [c for c in clients if c not in self._tiers]
        if new:
            if len(self._tiers) + len(new) > 1_000_000:
                self._tiers.clear()
            self._tiers.update(zip(new, self.cfg.tiers_of(new), strict=True))

    # ------------------------------------------------------------------ setup / resume

    def setup(self, resume: bool = False) -> dict:
        """Wait for the executors, then load the latest checkpoint or initialise the model."""
        self.pool.wait_placed()
        ck = self.storage.read_checkpoint() if resume else None
        if ck is not None:
            self.round, self.global_state = ck["round"], ck["global_state"]
            self.versions, self.totals = ck["versions"], ck["totals"]
            self.kept_versions = dict(self.versions)
            self.has_base = set(ck["has_base"])
            self.policy.load_state_dict(ck["policy_state"])
            self.pool.restarts = ck["restarts"]
            self.sim_time = float(ck.get("sim_time", 0.0))
            self.failed_rounds = int(ck.get("failed_rounds", 0))
            if self.privacy is not None:
                if "dp" not in ck:
                    raise ConfigError("dp.enabled", True, "the setting the run was started "
                                                          "with (its checkpoint has no DP state)")
                self.privacy.load_state_dict(ck["dp"])
            if "async" in ck:
                a = ck["async"]
                self.dispatched = int(a["dispatched"])
                self.inflight = {int(d): {"client": int(c), "version": int(v), "start": float(t),
                                          "download": int(b)}
                                 for d, c, v, t, b in a["inflight"]}
                self.states = {int(k[1:]): v for k, v in a["states"].items()}
        else:
            first = self.pool.executors[self.cfg.runtime.tiers[0].name][0]
            self.global_state = ray.get(first.init_global_state.remote(self.cfg.seed)).decode()
            self.global_state = {k: np.array(v) for k, v in self.global_state.items()}
        if resume:  # rounds logged after the checkpoint were not committed: re-run them
            self.metrics.truncate_after(self.round)
        return {"round": self.round, "executors": self.pool.info,
                "parameters": int(sum(v.size for v in self.global_state.values()))}

    # ------------------------------------------------------------------ one round

    def _jobs(self, method: str, clients: list[int], bcast: dict[str, tuple], round: int,
              item=lambda c: c, alone: set[int] = frozenset()) -> list[tuple[str, str, tuple]]:
        """Pool jobs running ``method`` over ``clients``: grouped by tier, in batches of
        ``runtime.chunk_size`` or two per executor; the clients in ``alone`` (whose batch
        killed its executor) one per job."""
        jobs = []
        for tier, cids in self._by_tier(clients).items():
            key, ref, _ = bcast[tier]
            batched = [c for c in cids if c not in alone]
            size = self.cfg.runtime.chunk_size or max(1, math.ceil(
                len(batched) / (2 * len(self.pool.executors[tier]))))
            for part in chunks(batched, size) + [[c] for c in cids if c in alone]:
                jobs.append((tier, method, (key, ref, round, [item(c) for c in part])))
        return jobs

    def _by_tier(self, clients: list[int]) -> dict[str, list[int]]:
        by_tier: dict[str, list[int]] = {}
        for c in clients:
            by_tier.setdefault(self.tier_of(c), []).append(c)
        return by_tier

    def _reduce_jobs(self, clients: list[int], bcast: dict[str, tuple], round: int,
                     passes: int, again: dict[tuple[int, ...], tuple[int, int]],
                     alone: set[int], item) -> tuple[list[tuple[str, str, tuple]],
                                                      dict[int, tuple[int, int]]]:
        """``runtime.reduce=executors``: the summation groups of one pass over ``clients``
        (sorted), one executor call each, and each group's key (pass, first client), the
        order its partial sum is added in. A group is 8 near-equal runs of a tier's clients
        (``runtime.chunk_size`` each if set), whatever the executor count; a group whose
        executor died is re-run once whole under its old key (``again``); after a second
        death its clients run alone (``alone``). Returns (jobs, {first client: key})."""
        jobs, keys = [], {}
        for tier, cids in self._by_tier(clients).items():
            left = set(cids)
            groups = []
            for members, key in again.items():
                if left.issuperset(members):
                    groups.append((key, list(members)))
                    left -= set(members)
            single = [c for c in sorted(left) if c in alone]
            rest = [c for c in sorted(left) if c not in alone]
            if rest:
                groups += [((passes, g[0]), g)
                           for g in summation_groups(rest, self.cfg.runtime.chunk_size)]
            groups += [((passes, c), [c]) for c in single]
            key_b, ref, _ = bcast[tier]
            for key, members in groups:
                keys[members[0]] = key
                jobs.append((tier, "run_clients",
                             (key_b, ref, round, [item(c) for c in members], True)))
        return jobs, keys

    def _broadcasts(self, round: int, tiers: set[str], kind: str) -> dict[str, tuple]:
        """One encoded broadcast per tier, each ``ray.put`` once."""
        out, seen = {}, {}
        for tier in sorted(tiers):
            tensors = self.policy.broadcast(self.global_state, round, tier)
            if id(tensors) not in seen:
                payload = Payload.encode(tensors, self.cfg.payload.download)
                seen[id(tensors)] = (f"{round}:{kind}:{tier}", ray.put(payload), payload.nbytes)
            out[tier] = seen[id(tensors)]
        return out

    def _reference(self, bcast: tuple) -> dict[str, np.ndarray] | None:
        """The tensors a client trained from, decoded from the very broadcast ``(key, ref,
        nbytes)`` it received, for a transform chain that needs them (``weights``); else
        None. Decoded once per broadcast."""
        if not self.chain.needs_reference:
            return None
        key, ref, _ = bcast
        if key not in self._refs:
            if len(self._refs) >= 8:
                self._refs.clear()
            self._refs[key] = ray.get(ref).decode()
        return self._refs[key]

    def run_round(self) -> dict:
        """Run the next round (or, for an asynchronous rule, the next server step) and
        return its metrics row."""
        if self.asynchronous:
            return self.run_async_step()
        t0 = time.perf_counter()
        r = self.round + 1
        cfg, fl = self.cfg, self.cfg.fleet
        k = cfg.clients.sampled_count()
        want = min(self.num_clients, math.ceil((1 + fl.overcommit) * k)) if fl.overcommit else k
        if self.privacy is not None and self.privacy.sampling == "poisson":
            sampled = poisson_sample(cfg.seed, r, self.num_clients, k / self.num_clients)
            if not sampled:
                return self._idle_round(r, t0, wait=False)
        elif self.fleet.availability is None:
            sampled = sample_clients(cfg.seed, r, self.num_clients, want)
        else:
            sampled = self.fleet.sample(r, want, self.sim_time)
            if not sampled:
                return self._idle_round(r, t0)
        self.touched.update(sampled)
        self._remember_tiers(sampled)
        drop = self.fleet.dropped(r, np.array(sampled, dtype=np.int64))
        dropped = [c for c, d in zip(sampled, drop, strict=True) if d]
        bcast = self._broadcasts(r, {self.tier_of(c) for c in sampled}, "train")
        attempts = dict.fromkeys(sampled, 0)
        final: dict[int, ClientResult] = {}
        todo = [c for c, d in zip(sampled, drop, strict=True) if not d]
        for c in dropped:
            attempts[c] = 1
            final[c] = ClientResult(c, r, Status.DROPPED, error="dropped out mid-round")
        restarts_before = self.pool.restarts
        shapes = {k: v.shape for k, v in self.global_state.items()}
        decoded: dict[int, tuple[dict[str, np.ndarray], bool]] = {}
        reduce = cfg.runtime.reduce == "executors"
        partials: list[tuple[tuple[int, int], State, float]] = []
        nonfinite: set[int] = set()
        alone: set[int] = set()  # clients of a batch whose executor died: isolated
        again: dict[tuple[int, ...], tuple[int, int]] = {}  # reduce: group -> its sum's key
        keys: dict[int, tuple[int, int]] = {}
        passes = 0
        while todo:
            passes += 1
            for c in todo:
                attempts[c] += 1
            item = lambda c: (c, self.versions.get(c))  # noqa: E731
            if reduce:
                jobs, keys = self._reduce_jobs(sorted(todo), bcast, r, passes, again, alone,
                                               item)
                again = {}
            else:
                jobs = self._jobs("run_clients", todo, bcast, r, item=item, alone=alone)
            todo = []
            for batch in self.pool.run(jobs, requeue_dead=False):
                if isinstance(batch, DeadJob):  # counts as a failed attempt of each client
                    cids = [c for c, _ in batch.args[3]]
                    if reduce and not alone & set(cids) and keys[cids[0]][0] == passes:
                        # re-run whole once, under its key: the same sum as without the death
                        again[tuple(cids)] = keys[cids[0]]
                    else:
                        alone.update(cids)
                    batch = [ClientResult(c, r, Status.ERROR, executor=batch.executor,
                                          error=f"its executor {batch.reason} while running "
                                                f"it (with {len(cids)} client(s) in the "
                                                f"batch)")
                             for c in cids]
                elif reduce:
                    batch, (total, weight, bad) = batch
                    partials.append((keys[batch[0].client_id], total, weight))
                    nonfinite.update(bad)
                for res in batch:
                    if res.status is Status.ERROR and attempts[res.client_id] <= \
                            cfg.runtime.max_client_retries:
                        todo.append(res.client_id)
                    else:
                        final[res.client_id] = res
                        if res.ok and not reduce:  # decoded while the others still train
                            decoded[res.client_id] = self._decode(
                                res, bcast[self.tier_of(res.client_id)], shapes)
        download = self._charge_download(sampled, attempts, bcast)
        poisson = self.privacy is not None and self.privacy.sampling == "poisson"
        times, duration = self._time_round(sampled, final, download,
                                           len(sampled) if poisson else k)
        accepted = []
        for cid in sorted(final):
            res = final[cid]
            upload, clean = decoded.get(cid, (None, cid not in nonfinite))
            if res.ok and not clean:
                res.status, res.error = Status.REJECTED, "upload contains NaN or Inf"
            if res.ok:
                accepted.append((cid, res.num_samples, upload))
                if res.state_version is not None:
                    self.versions[cid] = res.state_version
        self._charge_upload(sampled, final)
        restarts = self.pool.restarts - restarts_before
        self.sim_time += duration
        lost = sum(final[c].status in (Status.DROPPED, Status.LATE, Status.SURPLUS)
                   for c in sampled)
        failed = len(accepted) < fl.min_reports
        self.failed_rounds += failed
        extra = {"sim_seconds": duration, "cum_sim_seconds": self.sim_time,
                 "round_failed": float(failed)}
        extra |= self._dp_row()
        client_extra = {c: {"sim_seconds": t} for c, t in times.items()}
        if len(accepted) + lost < cfg.runtime.min_accepted:
            self._log(RoundRecord(r, sampled, final, attempts, download, Evaluation(), {},
                                  restarts, time.perf_counter() - t0, client_extra, extra))
            raise RoundFailedError(r, len(accepted), cfg.runtime.min_accepted,
                                   [(c, str(final[c].status), final[c].error) for c in sampled
                                    if not final[c].ok])
        policy_metrics: dict[str, Any] = {}
        if reduce and accepted and not failed:
            total, weight = self._combine(partials)
            if weight > 0:
                self.global_state, policy_metrics = self.policy.aggregate_sum(
                    self.global_state, total, weight, r)
        elif (accepted or self.privacy is not None) and not failed:  # DP releases every round
            accepted = self._privatize(accepted, r, extra)
            self.global_state, policy_metrics = self.policy.aggregate(
                self.global_state, accepted, r)
        self.round = r
        evaluation = self._evaluate(r, sampled)
        row = self._log(RoundRecord(r, sampled, final, attempts, download, evaluation,
                                    policy_metrics, restarts, time.perf_counter() - t0,
                                    client_extra, extra))
        self._checkpoint_if_due(r)
        return row

    @staticmethod
    def _combine(partials: list[tuple[tuple[int, int], State, float]]) -> tuple[State, float]:
        """The executors' partial sums added in the order of their groups (retry pass, first
        client id): Σ_i w_i Δ_i and Σ_i w_i, whatever executor reduced which group."""
        total: State = {}
        weight = 0.0
        for _, part, w in sorted(partials, key=lambda p: p[0]):
            accumulate(total, part, 1.0)
            weight += w
        return total, weight

    def _decode(self, res: ClientResult, bcast: tuple, shapes: dict[str, tuple]
                ) -> tuple[dict[str, np.ndarray], bool]:
        """A client's upload as the policy sees it (codec and transform chain undone, against
        the broadcast ``(key, ref, nbytes)`` it trained from) and whether it is free of NaN
        and Inf — checked after decoding, where a NaN can no longer hide in integer codes
        (bf16 bits, int8)."""
        upload = self.chain.server(res.payload.decode(), shapes, self._reference(bcast))
        return upload, finite(upload)

    def _dp_row(self) -> dict[str, float]:
        """ε so far, in every round row of a DP run (a release updates it)."""
        return {} if self.privacy is None else {"dp_epsilon": self.privacy.epsilon()}

    def _privatize(self, accepted: list[tuple[int, int, dict]], r: int, extra: dict
                   ) -> list[tuple[int, int, dict]]:
        """With central DP (:mod:`fedray.privacy`): every accepted update replaced by the
        round's privatized mean, with unit weight (nobody accepted: the noise alone, as the
        update of pseudo-client -1); the DP metrics go to ``extra``."""
        if self.privacy is None:
            return accepted
        mean, metrics = self.privacy.privatize(self.global_state, [u for _, _, u in accepted],
                                               r)
        extra.update(metrics)
        return [(c, 1, mean) for c, _, _ in accepted] or [(-1, 1, mean)]

    def _checkpoint_if_due(self, r: int) -> None:
        if r % self.cfg.runtime.checkpoint_every == 0 or r == self.cfg.rounds:
            self.checkpoint()

    def _next_online(self, r: int) -> float:
        """When the clock jumps to while no client is online: the next session start (not
        one ulp before it); a :class:`RoundFailedError` when no one ever comes online."""
        later = self.fleet.next_online(self.sim_time)
        if math.isinf(later):
            raise RoundFailedError(r, 0, max(1, self.cfg.fleet.min_reports), [
                (-1, "offline", f"no client is online at {self.sim_time:.1f} s of simulated "
                                f"time and none comes online later (fleet.availability)")])
        return float(np.nextafter(later, math.inf))

    def _idle_round(self, r: int, t0: float, wait: bool = True) -> dict:
        """A round in which no client is online (or a Poisson draw picked none): the clock
        jumps to the next time one comes online (``wait``); the round is logged as failed
        and the model is unchanged (nothing is released: no privacy spent)."""
        later = self._next_online(r) if wait else self.sim_time
        duration = later - self.sim_time
        self.sim_time = later
        self.failed_rounds += 1
        extra = {"sim_seconds": duration, "cum_sim_seconds": self.sim_time,
                 "round_failed": 1.0, **self._dp_row()}
        policy_metrics: dict[str, Any] = {}
        if self.privacy is not None:  # DP releases every round: here the noise alone
            self.global_state, policy_metrics = self.policy.aggregate(
                self.global_state, self._privatize([], r, extra), r)
        self.round = r
        row = self._log(RoundRecord(r, [], {}, {}, {}, self._evaluate(r, []), policy_metrics,
                                    0, time.perf_counter() - t0, {}, extra))
        self._checkpoint_if_due(r)
        return row

    def _samples_seen(self, num_samples: int) -> int:
        """Samples a client's local training processes: epochs over its data, capped by
        ``local.max_steps`` batches."""
        loc = self.cfg.local
        seen = num_samples * loc.epochs
        return min(seen, loc.max_steps * loc.batch_size) if loc.max_steps else seen

    def _time_round(self, sampled: list[int], final: dict[int, ClientResult],
                    download: dict[int, int], k: int) -> tuple[dict[int, float], float]:
        """Simulated seconds of each sampled client, and of the round; marks clients that go
        offline before finishing (dropped), miss the deadline (late) or finish after the
        first ``k`` reports (surplus). Their uploads never complete, so they are not
        charged; a dropout's time is its download."""
        fl = self.cfg.fleet
        ids = np.array(sampled, dtype=np.int64)
        ran = np.array([final[c].status is not Status.DROPPED for c in sampled])
        up = np.array([final[c].upload_bytes if final[c].ok else 0 for c in sampled])
        seen = np.array([self._samples_seen(final[c].num_samples) for c in sampled])
        parts = self.fleet.seconds(ids, [self.tier_of(c) for c in sampled],
                                   np.array([download[c] for c in sampled]), up, seen)
        total = np.where(ran, parts["total"], parts["down"])
        offline = self.fleet.online_until(ids, self.sim_time) - self.sim_time
        reporting = []
        for i, c in enumerate(sampled):
            res = final[c]
            if not res.ok:
                continue
            if total[i] > offline[i]:
                res.status, res.error = Status.DROPPED, (
                    f"went offline {offline[i]:.1f} s into the round, before finishing")
            elif fl.deadline_s is not None and total[i] > fl.deadline_s:
                res.status, res.error = Status.LATE, (
                    f"needed {total[i]:.1f} s, the deadline is {fl.deadline_s:g} s")
            else:
                reporting.append((float(total[i]), c))
        reporting.sort()
        for _, c in reporting[k:]:
            final[c].status, final[c].error = Status.SURPLUS, "the round closed on K reports"
        for c in sampled:
            if final[c].status in (Status.DROPPED, Status.LATE, Status.SURPLUS):
                final[c].upload_bytes = 0
        if len(reporting) >= k:
            duration = reporting[k - 1][0] if reporting else 0.0
        elif fl.deadline_s is not None:
            duration = float(fl.deadline_s)
        else:
            duration = max((t for t, _ in reporting), default=float(np.max(total,
                                                                          initial=0.0)))
        return {c: float(total[i]) for i, c in enumerate(sampled)}, duration

    # ------------------------------------------------------------------ asynchronous

    def _async_broadcast(self, version: int, tier: str) -> tuple:
        per = self.async_bcast.setdefault(version, {})
        if tier not in per:
            tensors = self.policy.broadcast(self.states[version], version, tier)
            payload = Payload.encode(tensors, self.cfg.payload.download)
            per[tier] = (f"{version}:async:{tier}", ray.put(payload), payload.nbytes)
        return per[tier]

    def _dispatch(self, exclude: set[int]) -> None:
        """Keep ``policy.concurrency`` clients in flight: each new one is an online client
        not in flight, drawn from (seed, dispatch number) at the current simulated time,
        starting from the current global state."""
        self.states.setdefault(self.round, self.global_state)
        waits = 0
        while len(self.inflight) < self.policy.concurrency:
            d = self.dispatched + 1
            busy = exclude | {f["client"] for f in self.inflight.values()}
            picked = self.fleet.sample(d, 1, self.sim_time, exclude=busy)
            if not picked:
                if not self.inflight:  # no one online: wait for the next one
                    waits += 1
                    if waits > 100_000:
                        raise RoundFailedError(self.round + 1, 0, 1, [
                            (-1, "offline", "no client not already in this step comes "
                                            "online (fleet.availability)")])
                    self.sim_time = self._next_online(self.round + 1)
                    continue
                return
            self.dispatched = d
            c = picked[0]
            self.touched.add(c)
            nbytes = self._charge(c, self._async_broadcast(self.round, self.tier_of(c))[2])
            self.inflight[d] = {"client": c, "version": self.round, "start": self.sim_time,
                                "download": nbytes}

    def _lower_bound(self, d: int) -> float:
        """The earliest a dispatch can finish before it is computed: its download, latency
        and (when the client data knows its size) its compute; only the upload is unknown.
        The tighter this is, the more dispatches are computed together."""
        bound = self.bounds.get(d)
        if bound is None:
            f = self.inflight[d]
            c = f["client"]
            t = self.fleet.seconds(np.array([c]), [self.tier_of(c)], np.array([f["download"]]),
                                   np.zeros(1), np.array([self._samples_seen(self._size(c))]))
            bound = self.bounds[d] = f["start"] + float(t["down"][0] + t["compute"][0])
        return bound

    def _size(self, client: int) -> int:
        """A client's train-sample count from the client data (0 when it does not say)."""
        if self._data is None:
            self._data = ray.get(self.pool.data_ref)
        sizes = getattr(self._data, "num_samples", None)
        return int(sizes(client)) if sizes is not None else 0

    def _compute(self, pending: list[int]) -> None:
        """Run the in-flight dispatches not computed yet (in parallel on the pool) and
        record each one's result and simulated finish time."""
        jobs = []
        for d in pending:
            f = self.inflight[d]
            c = f["client"]
            if self.fleet.dropped(d, np.array([c]))[0]:
                res = ClientResult(c, d, Status.DROPPED, error="dropped out mid-round")
                self.done[d] = (res, self._lower_bound(d))
                continue
            key, ref, _ = self._async_broadcast(f["version"], self.tier_of(c))
            jobs.append((self.tier_of(c), "run_clients",
                         (key, ref, d, [(c, self.versions.get(c))])))
        for batch in self.pool.run(jobs, requeue_dead=False):
            if isinstance(batch, DeadJob):
                c = batch.args[3][0][0]
                batch = [ClientResult(c, batch.args[2], Status.ERROR, executor=batch.executor,
                                      error=f"its executor {batch.reason} while running it")]
            for res in batch:
                d = res.round
                f = self.inflight[d]
                up = res.upload_bytes if res.ok else 0
                t = self.fleet.seconds(np.array([res.client_id]), [self.tier_of(res.client_id)],
                                       np.array([f["download"]]), np.array([up]),
                                       np.array([self._samples_seen(res.num_samples)]))
                finish = f["start"] + float(t["total"][0])
                if res.ok and finish > float(self.fleet.online_until(
                        np.array([res.client_id]), f["start"])[0]):
                    res.status, res.error = Status.DROPPED, "went offline before finishing"
                    res.upload_bytes = 0
                self.done[d] = (res, finish)

    def _next_event(self) -> int:
        """The dispatch that finishes first in simulated time (ties: lower dispatch number).
        A dispatch is known to be first once every uncomputed one cannot finish before it
        (its download alone takes longer), so results never depend on wall-clock order."""
        while True:
            ready = [(self.done[d][1], d) for d in self.inflight if d in self.done]
            pending = [d for d in self.inflight if d not in self.done]
            if ready:
                t, best = min(ready)
                if all((self._lower_bound(p), p) > (t, best) for p in pending):
                    return best
            if not pending:
                raise RuntimeError("no client in flight (is any client online?)")
            self._compute(pending)

    def run_async_step(self) -> dict:
        """One server step of an asynchronous rule: pop finished clients in simulated-time
        order (dispatching a new one for each) until ``buffer_size`` uploads are buffered,
        then apply them. Checkpoints fall on these steps, when the buffer is empty."""
        t0 = time.perf_counter()
        r = self.round + 1
        start_time = self.sim_time
        popped: list[int] = []
        final: dict[int, ClientResult] = {}
        download: dict[int, int] = {}
        client_extra: dict[int, dict[str, float]] = {}
        buffer: list[AsyncUpdate] = []
        shapes = {k: v.shape for k, v in self.global_state.items()}
        restarts_before = self.pool.restarts
        misses = 0  # uploads in a row that were not buffered
        while len(buffer) < self.policy.buffer_size:
            self._dispatch(set(popped))
            d = self._next_event()
            res, finish = self.done.pop(d)
            f = self.inflight.pop(d)
            self.bounds.pop(d, None)
            c = f["client"]
            self.sim_time = max(self.sim_time, finish)
            self.touched.add(c)
            popped.append(c)
            final[c], download[c] = res, f["download"]
            staleness = self.round - f["version"]
            client_extra[c] = {"sim_seconds": finish - f["start"], "staleness": staleness}
            if res.ok:
                upload, clean = self._decode(
                    res, self._async_broadcast(f["version"], self.tier_of(c)), shapes)
                if not clean:
                    res.status, res.error = Status.REJECTED, "upload contains NaN or Inf"
                else:
                    buffer.append(AsyncUpdate(c, res.num_samples, upload, staleness,
                                              self.states[f["version"]]))
                    if res.state_version is not None:
                        self.versions[c] = res.state_version
            misses = 0 if final[c].ok else misses + 1
            if misses > 10 * max(self.policy.concurrency, self.policy.buffer_size):
                raise RoundFailedError(r, len(buffer), self.policy.buffer_size, [
                    (c2, str(final[c2].status), final[c2].error) for c2 in popped[-3:]])
        self._charge_upload(popped, final)
        extra: dict[str, float] = {}
        if self.privacy is not None:
            mean = self._privatize([(u.client_id, u.num_samples, u.upload) for u in buffer],
                                   r, extra)[0][2]
            buffer = [dataclasses.replace(u, upload=mean, num_samples=1) for u in buffer]
        self.global_state, policy_metrics = self.policy.aggregate_async(
            self.global_state, buffer, r)
        self.round = r
        live = {f["version"] for f in self.inflight.values()}
        self.states = {v: s for v, s in self.states.items() if v in live}
        self.async_bcast = {v: b for v, b in self.async_bcast.items() if v in live}
        policy_metrics["mean_staleness"] = float(np.mean([u.staleness for u in buffer]))
        extra |= {"sim_seconds": self.sim_time - start_time, "cum_sim_seconds": self.sim_time,
                  "round_failed": 0.0}
        evaluation = self._evaluate(r, sorted(popped))
        row = self._log(RoundRecord(r, sorted(popped), final, dict.fromkeys(popped, 1),
                                    download, evaluation, policy_metrics,
                                    self.pool.restarts - restarts_before,
                                    time.perf_counter() - t0, client_extra, extra))
        self._checkpoint_if_due(r)
        return row

    def _charge_download(self, sampled: list[int], attempts: dict[int, int],
                         bcast: dict[str, tuple]) -> dict[int, int]:
        """The download side of the byte ledger: each sampled client's tier broadcast once
        per attempt, plus the pretrained base at its first round, added to the totals."""
        return {c: self._charge(c, bcast[self.tier_of(c)][2] * attempts[c]) for c in sampled}

    def _charge(self, client: int, broadcast_bytes: int) -> int:
        """One client's download, charged when it happens: the broadcast bytes, plus the
        pretrained base the first time the client downloads anything."""
        nbytes = broadcast_bytes
        if self.base_bytes and client not in self.has_base:
            nbytes += self.base_bytes
            self.has_base.add(client)
        self.totals["download_bytes"] += nbytes
        return nbytes

    def _charge_upload(self, sampled: list[int], final: dict[int, ClientResult]) -> None:
        """The upload side: every completed upload's exact bytes; failures and rejections
        counted."""
        for c in sampled:
            self.totals["upload_bytes"] += final[c].upload_bytes
            self.totals["failures"] += final[c].status is Status.ERROR
            self.totals["rejected"] += final[c].status is Status.REJECTED

    # ------------------------------------------------------------------ evaluation

    def _evaluate(self, r: int, sampled: list[int]) -> Evaluation:
        ev = self.cfg.eval
        due = (ev.every and r % ev.every == 0) or r == self.cfg.rounds
        if not due:
            return Evaluation()
        who = (list(range(self.num_clients)) if ev.clients == "all"
               else sampled if ev.clients == "sampled" else [])
        names = [t.name for t in self.cfg.runtime.tiers]
        tiers = {self.tier_of(c) for c in who} | (set(names) if ev.global_test else set())
        bcast = self._broadcasts(r, tiers, "eval")
        jobs = self._jobs("evaluate_clients", who, bcast, r)
        scored: dict[str, str] = {}  # broadcast key -> tier whose executor scores it
        if ev.global_test:
            for tier in names:
                if bcast[tier][0] not in scored:
                    scored[bcast[tier][0]] = tier
                    jobs.append((tier, "evaluate_global", bcast[tier][:2]))
        out = Evaluation()
        for res in self.pool.run(jobs):
            if isinstance(res, tuple):  # (broadcast key, EvalResult) of a global test
                out.tiers[scored[res[0]]] = res[1]
            else:
                out.clients.update(dict(res))
        if ev.global_test:
            out.tiers = {t: out.tiers[scored[bcast[t][0]]] for t in names}
        out.clients = dict(sorted(out.clients.items()))  # reduced in client-id order
        return out

    # ------------------------------------------------------------------ logging

    def _log(self, rec: RoundRecord) -> dict:
        """Write the round's row and its clients' rows (every per-client quantity reduced in
        client-id order); return the round row."""
        per_client = rec.policy_metrics.pop("per_client", {})
        evaluated = rec.evaluation
        client_rows = []
        per_tier: dict[str, float] = {}
        for c in sorted(set(rec.sampled) | set(evaluated.clients)):
            tier = self.tier_of(c)
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
            ev = evaluated.clients.get(c)
            if ev is not None:
                row.update(eval_loss=ev.loss, eval_accuracy=ev.accuracy, eval_samples=ev.n)
                if ev.finetuned is not None:
                    row.update(ft_loss=ev.finetuned.loss, ft_accuracy=ev.finetuned.accuracy)
            client_rows.append(row)
        ok = [rec.final[c] for c in rec.sampled if rec.final[c].ok]
        accs = np.array([e.accuracy for e in evaluated.clients.values()])
        ft = np.array([e.finetuned.accuracy for e in evaluated.clients.values()
                       if e.finetuned is not None])
        n_ok = [res.num_samples for res in ok]
        losses = [res.metrics.get("train_loss", math.nan) for res in ok]
        scores = evaluated.tiers
        g = {}
        if scores:  # the fleet: unweighted mean over tiers of each tier's own model
            g = {"accuracy": float(np.mean([v.accuracy for v in scores.values()])),
                 "loss": float(np.mean([v.loss for v in scores.values()]))}
        per_tier |= {f"tier/{t}/{k}": float(v) for t, res in scores.items()
                     for k, v in {"loss": res.loss, "accuracy": res.accuracy,
                                  **res.extra}.items()}
        up = sum(rec.final[c].upload_bytes for c in rec.sampled)
        down = sum(rec.download.values())
        row = {
            "round": rec.round, "sampled": len(rec.sampled), "ok": len(ok),
            "failed": sum(rec.final[c].status is Status.ERROR for c in rec.sampled),
            "rejected": sum(rec.final[c].status is Status.REJECTED for c in rec.sampled),
            **{s.value: sum(rec.final[c].status is s for c in rec.sampled)
               for s in (Status.DROPPED, Status.LATE, Status.SURPLUS)},
            **rec.extra,
            "train_loss": float(np.average(losses, weights=n_ok)) if ok else math.nan,
            "personalized_accuracy": float(accs.mean()) if accs.size else math.nan,
            "personalized_accuracy_std": float(accs.std()) if accs.size else math.nan,
            "personalized_accuracy_ft": float(ft.mean()) if ft.size else math.nan,
            "global_accuracy": float(g.get("accuracy", math.nan)),
            "global_loss": float(g.get("loss", math.nan)),
            "upload_bytes": up, "download_bytes": down,
            "cum_upload_bytes": self.totals["upload_bytes"],
            "cum_download_bytes": self.totals["download_bytes"],
            "cum_bytes": self.totals["upload_bytes"] + self.totals["download_bytes"],
            "executor_restarts": rec.restarts, "seconds": rec.seconds,
            **{f"policy/{k}": float(v) for k, v in rec.policy_metrics.items()},
            **per_tier,
        }
        self.metrics.write_round(rec.round, row, client_rows)
        return row

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> None:
        """Round-boundary checkpoint: global and policy state, client-state manifest,
        byte totals. The sampling position is the round itself (sampling is a function
        of (seed, round))."""
        ck = {"round": self.round, "global_state": self.global_state,
              "policy_state": self.policy.state_dict(), "versions": dict(self.versions),
              "totals": dict(self.totals), "restarts": self.pool.restarts,
              "has_base": sorted(self.has_base), "sim_time": self.sim_time,
              "failed_rounds": self.failed_rounds}
        if self.privacy is not None:
            ck["dp"] = self.privacy.state_dict()
        if self.asynchronous:  # the buffer is empty here; what is in flight is recomputed
            ck["async"] = {"dispatched": self.dispatched,
                           "inflight": [[d, f["client"], f["version"], f["start"],
                                         f["download"]] for d, f in self.inflight.items()],
                           "states": {f"v{v}": s for v, s in self.states.items()}}
        self.storage.write_checkpoint(self.round, ck, keep=KEEP_CHECKPOINTS)
        if self.algorithm.uses_client_state or self.chain.stateful:
            inflight = {f["client"]: d for d, f in self.inflight.items()}  # computed early
            ClientStateStore(self.storage).prune(self.touched, self.versions,
                                                 self.kept_versions, inflight)
        self.kept_versions = dict(self.versions)
        self.touched = set()

    # ------------------------------------------------------------------ queries

    def get_global_state(self) -> dict[str, np.ndarray]:
        return self.global_state

    def get_round(self) -> int:
        return self.round

    def executor_handles(self) -> dict[str, list[Any]]:
        return self.pool.handles()

    def finish(self) -> dict:
        self.metrics.consolidate()
        return {"round": self.round, "totals": dict(self.totals),
                "executor_restarts": self.pool.restarts, "sim_seconds": self.sim_time,
                "failed_rounds": self.failed_rounds,
                "privacy": self.privacy.summary() if self.privacy is not None else None}

    def shutdown(self) -> None:
        self.pool.shutdown()
