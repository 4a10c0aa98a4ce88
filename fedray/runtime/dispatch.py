"""The Dispatcher: typed jobs out to the executors, typed results back.

It puts each broadcast in the object store once, cuts a tier's clients into jobs (batches
of ``runtime.chunk_size``, or two per executor; with ``runtime.reduce=executors`` the
summation groups, never a function of the executor count), re-runs clients whose update
raised (up to ``runtime.max_client_retries``), isolates the clients of a batch whose
executor died, decodes uploads as they arrive (codec and transform chain undone) and
checks them for NaN and Inf. Whatever the mode, a training call returns one
:class:`Trained`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from fedray.methods.base import ClientResult, CohortRule, State, Status, accumulate, finite
from fedray.runtime.jobs import (
    Broadcast,
    ClientSlot,
    DeadJob,
    EvalJob,
    GlobalEvalJob,
    GlobalScore,
    Partial,
    RootJob,
    TrainJob,
    cohort_runs,
    even_groups,
)
from fedray.runtime.rows import Evaluation
from fedray.wire.payload import Payload

GroupKey = tuple[int, int]  # (retry pass, first client id): the order partial sums are added


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def summation_groups(items: list, chunk_size: int | None, cohort: int | None = None
                     ) -> list[list]:
    """``runtime.reduce=executors``'s groups of one tier's sorted clients: 8 near-equal runs
    (so that 1, 2, 4 or 8 executors get equal shares), or runs of ``chunk_size``; never a
    function of the executor count. With cohorts (at most ``cohort`` clients each) and no
    ``chunk_size``, fewer runs where 8 would hold much less than a cohort each:
    ``min(8, ⌈n / cohort⌉)`` runs, each about a cohort or more (a cohort never spans two
    groups, and a half-empty cohort pays a whole batched step)."""
    if chunk_size:
        return even_groups(items, math.ceil(len(items) / chunk_size))
    return even_groups(items, max(1, min(8, math.ceil(len(items) / cohort))) if cohort
                       else 8)


def combine(partials: list[tuple[GroupKey, Partial]]) -> tuple[State, float]:
    """The executors' partial sums added in the order of their groups (retry pass, first
    client id): Σ_i w_i Δ_i and Σ_i w_i, whatever executor reduced which group."""
    total: State = {}
    weight = 0.0
    for _, part in sorted(partials, key=lambda p: p[0]):
        accumulate(total, part.total, 1.0)
        weight += part.weight
    return total, weight


def dead_results(dead: DeadJob, detail: str = "") -> list[ClientResult]:
    """A dead training job as a failed attempt of each of its clients."""
    job = dead.job
    return [ClientResult(c, job.round, Status.ERROR, executor=dead.executor,
                         error=f"its executor {dead.reason} while running it{detail}")
            for c in job.client_ids]


@dataclass
class Trained:
    """What a round's training produced: each client's final result and attempt count, the
    decoded uploads with their finiteness (``runtime.reduce=driver``), or the executors'
    partial sums under their group keys (``runtime.reduce=executors``)."""

    final: dict[int, ClientResult] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    decoded: dict[int, tuple[State, bool]] = field(default_factory=dict)
    partials: list[tuple[GroupKey, Partial]] = field(default_factory=list)
    nonfinite: set[int] = field(default_factory=set)  # left out of the partials' sums

    def upload(self, client: int) -> tuple[State | None, bool]:
        """(decoded upload or None when it was summed on its executor, finite?)."""
        if client in self.decoded:
            return self.decoded[client]
        return None, client not in self.nonfinite


class Decoder:
    """Uploads as the policy sees them: codec and transform chain undone, against the
    broadcast each client trained from (decoded once per broadcast, for a chain that needs
    the reference weights)."""

    def __init__(self, chain: Any):
        self.chain = chain
        self._refs: dict[str, State] = {}

    def reference(self, bcast: Broadcast) -> State | None:
        if not self.chain.needs_reference:
            return None
        if bcast.key not in self._refs:
            if len(self._refs) >= 8:
                self._refs.clear()
            self._refs[bcast.key] = ray.get(bcast.ref).decode()
        return self._refs[bcast.key]

    def __call__(self, res: ClientResult, bcast: Broadcast, shapes: dict[str, tuple]
                 ) -> tuple[State, bool]:
        """The decoded upload and whether it is free of NaN and Inf — checked after
        decoding, where a NaN can no longer hide in integer codes (bf16 bits, int8)."""
        upload = self.chain.server(res.payload.decode(), shapes, self.reference(bcast))
        return upload, finite(upload)


class Dispatcher:
    """Jobs for one run's executor pool (:class:`~fedray.runtime.pool.ExecutorPool`)."""

    def __init__(self, cfg: Any, pool: Any, tiers: Any, chain: Any,
                 cohort: CohortRule | None = None):
        self.cfg, self.pool, self.tiers = cfg, pool, tiers
        self.decode = Decoder(chain)
        self.cohort = cohort  # how clients are cut into cohorts (None: one at a time)

    @property
    def restarts(self) -> int:
        """Executors replaced so far (the ``runtime.max_executor_restarts`` budget spans
        sessions: it is this part's checkpointed state)."""
        return self.pool.restarts

    def state_dict(self) -> dict[str, Any]:
        return {"restarts": self.pool.restarts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.restarts = int(state["restarts"])

    @staticmethod
    def put(key: str, tensors: State, codec: str) -> Broadcast:
        payload = Payload.encode(tensors, codec)
        return Broadcast(key, ray.put(payload), payload.nbytes)

    def broadcasts(self, tensors_of: Callable[[str], State], tiers: set[str], key: str
                   ) -> dict[str, Broadcast]:
        """One encoded broadcast per tier (tiers given the same tensors share one), each
        ``ray.put`` once, named ``key:tier``."""
        out: dict[str, Broadcast] = {}
        seen: dict[int, Broadcast] = {}
        for tier in sorted(tiers):
            tensors = tensors_of(tier)
            if id(tensors) not in seen:
                seen[id(tensors)] = self.put(f"{key}:{tier}", tensors,
                                             self.cfg.payload.download)
            out[tier] = seen[id(tensors)]
        return out

    def _batches(self, clients: list[int], alone: set[int] = frozenset(),
                 rule: CohortRule | None = None
                 ) -> Iterator[tuple[str, list[int], int | None]]:
        """(tier, clients, cohort size) batches of ``runtime.chunk_size`` or two per
        executor — with a cohort ``rule`` (training), one cohort each: the tier's sorted
        clients cut into near-equal runs of at most the rule's size (:func:`cohort_runs`),
        a rule on the sample alone (one cohort a call keeps the driver decoding uploads
        while the other cohorts train); the clients in ``alone`` (whose batch killed its
        executor) one per batch."""
        for tier, cids in self.tiers.group(clients).items():
            batched = [c for c in cids if c not in alone]
            cohort = rule.of(len(batched)) if rule else None
            parts = cohort_runs(batched, cohort) if cohort else chunks(
                batched, self.cfg.runtime.chunk_size or max(1, math.ceil(
                    len(batched) / (2 * len(self.pool.executors[tier])))))
            for part in parts + [[c] for c in cids if c in alone]:
                yield tier, part, cohort

    def _groups(self, clients: list[int], passes: int,
                again: dict[tuple[int, ...], tuple[GroupKey, int | None]], alone: set[int]
                ) -> Iterator[tuple[str, GroupKey, list[int], int | None]]:
        """``runtime.reduce=executors``: the summation groups of one pass over ``clients``
        (sorted), each with its key and cohort size. A group is 8 near-equal runs of a
        tier's clients (``runtime.chunk_size`` each if set), whatever the executor count; a
        group whose executor died is re-run once whole under its old key and cohort size
        (``again``); after a second death its clients run alone (``alone``)."""
        for tier, cids in self.tiers.group(clients).items():
            left = set(cids)
            groups = []
            for members, (key, cohort) in again.items():
                if left.issuperset(members):
                    groups.append((key, list(members), cohort))
                    left -= set(members)
            single = [c for c in sorted(left) if c in alone]
            rest = [c for c in sorted(left) if c not in alone]
            if rest:
                cohort = self.cohort.of(len(rest)) if self.cohort else None
                groups += [((passes, g[0]), g, cohort)
                           for g in summation_groups(rest, self.cfg.runtime.chunk_size,
                                                     cohort)]
            groups += [((passes, c), [c], self.cohort.of(1) if self.cohort else None)
                       for c in single]
            for key, members, cohort in groups:
                yield tier, key, members, cohort

    def train(self, clients: list[int], bcast: dict[str, Broadcast], round: int,
              version: Callable[[int], int | None], shapes: dict[str, tuple]) -> Trained:
        """Run ``clients``' updates for ``round`` until each has a final result: a client
        whose update raised is re-run (``runtime.max_client_retries``); a batch whose
        executor died counts as a failed attempt of each of its clients."""
        reduce = self.cfg.runtime.reduce == "executors"
        out = Trained(attempts=dict.fromkeys(clients, 0))
        alone: set[int] = set()
        again: dict[tuple[int, ...], tuple[GroupKey, int | None]] = {}
        todo, passes = list(clients), 0
        while todo:
            passes += 1
            for c in todo:
                out.attempts[c] += 1
            jobs, keys = [], {}
            if reduce:
                for tier, key, members, cohort in self._groups(sorted(todo), passes, again,
                                                               alone):
                    keys[members[0]] = key
                    jobs.append(TrainJob(tier, bcast[tier], round,
                                         [ClientSlot(c, version(c)) for c in members], True,
                                         cohort))
                again = {}
            else:
                jobs = [TrainJob(tier, bcast[tier], round,
                                 [ClientSlot(c, version(c)) for c in part], cohort=cohort)
                        for tier, part, cohort in self._batches(sorted(todo), alone,
                                                                self.cohort)]
            todo = []
            for batch in self.pool.run(jobs, requeue_dead=False):
                if isinstance(batch, DeadJob):
                    cids = batch.job.client_ids
                    if reduce and not alone & set(cids) and keys[cids[0]][0] == passes:
                        # re-run whole once, under its key and in its cohorts: the same sum
                        # as without the death
                        again[tuple(cids)] = (keys[cids[0]], batch.job.cohort)
                    else:
                        alone.update(cids)
                    results = dead_results(batch, f" (with {len(cids)} client(s) in the "
                                                  f"batch)")
                else:
                    results = batch.results
                    for stack in batch.stacks:
                        out.decoded.update(stack.unstacked())
                    if batch.partial is not None:
                        out.partials.append((keys[results[0].client_id], batch.partial))
                        out.nonfinite.update(batch.partial.nonfinite)
                for res in results:
                    c = res.client_id
                    if res.status is Status.ERROR and out.attempts[c] <= \
                            self.cfg.runtime.max_client_retries:
                        todo.append(c)
                    else:
                        out.final[c] = res
                        if res.ok and not reduce and res.payload is not None:
                            # decoded while the others still train
                            out.decoded[c] = self.decode(res, bcast[self.tiers.of(c)], shapes)
        return out

    def root_update(self, bcast: dict[str, Broadcast], round: int, samples: int) -> State:
        """The server's own update of ``round`` on its root dataset, trained by an executor
        of the first tier the round broadcast to (re-queued if that executor dies)."""
        tier = min(bcast)
        (res,) = list(self.pool.run([RootJob(tier, bcast[tier], round, samples)]))
        return res.payload.decode()

    def run_each(self, jobs: list[TrainJob]) -> Iterator[ClientResult]:
        """Run single-client jobs (asynchronous dispatches) in parallel, yield each result
        as it finishes (a dead executor's job as its client's failure)."""
        for batch in self.pool.run(jobs, requeue_dead=False):
            yield from dead_results(batch) if isinstance(batch, DeadJob) else batch.results

    def evaluate(self, round: int, clients: list[int], bcast: dict[str, Broadcast],
                 global_tiers: list[str]) -> Evaluation:
        """Score each of ``clients`` on its local test split and, for each tier in
        ``global_tiers``, its broadcast on the global test set (once per distinct
        broadcast)."""
        jobs: list[Any] = [EvalJob(tier, bcast[tier], round, part)
                           for tier, part, _ in self._batches(clients)]
        scored: dict[str, str] = {}  # broadcast key -> tier whose executor scores it
        for tier in global_tiers:
            if bcast[tier].key not in scored:
                scored[bcast[tier].key] = tier
                jobs.append(GlobalEvalJob(tier, bcast[tier]))
        out = Evaluation()
        by_key = {}
        for res in self.pool.run(jobs):
            if isinstance(res, GlobalScore):
                by_key[res.key] = res.result
            else:
                out.clients.update(res.scores)
        out.tiers = {t: by_key[bcast[t].key] for t in global_tiers}
        out.clients = dict(sorted(out.clients.items()))  # reduced in client-id order
        return out
