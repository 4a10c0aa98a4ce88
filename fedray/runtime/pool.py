"""ExecutorPool: the client executors of one run, grouped by capacity tier.

It places the actors (failing clearly when the cluster cannot hold them — Ray itself would
wait forever), hands out jobs to the executors of the right tier with at most
``inflight`` calls queued per executor, yields results as they finish, and replaces an
executor that dies, re-queuing the jobs it had in flight.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from fedray.core.spec import ConfigError
from fedray.runtime.devices import LOCAL_PLACEMENT_TIMEOUT_S
from fedray.runtime.executor import ClientExecutor
from fedray.runtime.jobs import DeadJob, Job
from fedray.runtime.warm import shape_key, take


class PlacementError(RuntimeError):
    """The cluster cannot place the executors the configuration asks for."""


def executor_options(cfg: Any, tier: Any) -> dict[str, Any]:
    """Resource shape of one executor of ``tier``: its GPU share unless ``runtime.device``
    is (or was settled to, :func:`fedray.runtime.devices.settle_runtime`) ``cpu``, its CPU
    share, its GPU type and its custom resources. Asks Ray nothing: the same answer in the
    entry process, the driver and a Tune trial."""
    gpus = 0.0 if cfg.runtime.device == "cpu" else tier.num_gpus
    opts: dict[str, Any] = {"num_cpus": tier.num_cpus, "num_gpus": gpus}
    if tier.resources:
        opts["resources"] = dict(tier.resources)
    if gpus and tier.accelerator_type:
        opts["accelerator_type"] = tier.accelerator_type
    return opts


def executor_bundle(cfg: Any, tier: Any) -> dict[str, float]:
    """The Ray resources one executor of ``tier`` holds (zeros left out; a GPU type is
    Ray's ``accelerator_type:<T>`` resource)."""
    opts = executor_options(cfg, tier)
    b = {"CPU": float(opts["num_cpus"]), "GPU": float(opts["num_gpus"]),
         **opts.get("resources", {})}
    if "accelerator_type" in opts:
        b[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
    return {k: v for k, v in b.items() if v}


def requested_resources(cfg: Any) -> dict[str, float]:
    total = {"CPU": 0.0, "GPU": 0.0}
    for tier in cfg.runtime.tiers:
        for name, amount in executor_bundle(cfg, tier).items():
            total[name] = total.get(name, 0.0) + tier.executors * amount
    return total


class Shortfall(NamedTuple):
    resource: str
    wanted: float
    available: float


def shortfall(cfg: Any, extra_cpu: float = 0.0, have: dict[str, float] | None = None
              ) -> Shortfall | None:
    """The first resource the executors (plus ``extra_cpu``) need more of than this Ray
    cluster has now (or than ``have``); None when everything fits."""
    have = ray.cluster_resources() if have is None else have
    want = requested_resources(cfg)
    want["CPU"] = want.get("CPU", 0.0) + extra_cpu
    for res, amount in want.items():
        if amount > have.get(res, 0.0) + 1e-9:
            return Shortfall(res, amount, have.get(res, 0.0))
    return None


def check_fits(cfg: Any, have: dict[str, float] | None = None) -> None:
    """Fail now, not hang, when the executors cannot all be placed on this cluster at once
    (used where the cluster cannot grow: a local Ray instance): a :class:`PlacementError`.
    ``have``: the resources a local Ray will have, for the check before it starts — then
    the configuration is at fault, a :class:`ConfigError`."""
    short = shortfall(cfg, have=have)
    if short is not None:
        shapes = ", ".join(f"{t.name}: {t.executors} x {executor_options(cfg, t)}"
                           for t in cfg.runtime.tiers)
        where = "this Ray cluster has" if have is None else "the local Ray this run starts " \
                                                            "would have"
        msg = (f"runtime.tiers ask for {short.wanted:g} {short.resource} in total ({shapes}) "
               f"but {where} {short.available:g} {short.resource}; lower "
               f"runtime.tiers[*].executors or num_cpus/num_gpus, or connect to a larger "
               f"cluster (runtime.ray_address)")
        if have is None:
            raise PlacementError(msg)
        raise ConfigError("runtime.tiers", [t.name for t in cfg.runtime.tiers], msg)


class ExecutorPool:
    """Created where the run starts (so the executors boot while the driver actor does) and
    then handed to the driver, which calls :meth:`wait_placed` and :meth:`run`."""

    def __init__(self, cfg: Any, algorithm_cls: type, data_ref: Any, run_uri: str,
                 inflight: int = 2, warm: bool = False):
        self.cfg, self.algorithm_cls, self.data_ref, self.run_uri = (
            cfg, algorithm_cls, data_ref, run_uri)
        self.inflight = inflight
        self.run_id = uuid.uuid4().hex[:8]
        self.restarts = 0
        self.tiers = {t.name: t for t in cfg.runtime.tiers}
        self.executors: dict[str, list[Any]] = {}
        self.generation: dict[tuple[str, int], int] = {}
        self.booting: dict[tuple[str, int], tuple[Any, float]] = {}  # replacement: (ready, since)
        self.info: list[dict] = []
        self.boot: dict[tuple[str, int], Any] = {}  # first placement: ready (or reset) refs
        self.reused: set[tuple[str, int]] = set()  # slots given a warm executor
        for name, tier in self.tiers.items():
            self.executors[name] = [self._place(name, i, warm) for i in range(tier.executors)]

    @staticmethod
    def warm_key_of(cfg: Any, tier: Any) -> str:
        """The :mod:`fedray.runtime.warm` key of ``tier``'s executors: resource shape and the
        process settings a reset cannot undo."""
        rt = cfg.runtime
        return shape_key("executor", executor_options(cfg, tier),
                         {"threads": rt.threads_per_executor, "deterministic": rt.deterministic})

    def warm_key(self, tier: str) -> str:
        return self.warm_key_of(self.cfg, self.tiers[tier])

    def _place(self, tier: str, index: int, warm: bool) -> Any:
        """A warm executor of the tier's shape reset for this run, else a new one; its
        readiness is awaited by :meth:`wait_placed`."""
        actor = take(self.warm_key(tier)) if warm else None
        if actor is None:
            actor = self._spawn(tier, index)
            self.boot[(tier, index)] = actor.ready.remote()
        else:
            self.reused.add((tier, index))
            self.boot[(tier, index)] = actor.reset.remote(
                self.cfg, self.algorithm_cls, self.data_ref, self.run_uri, tier, index)
        return actor

    @property
    def actor_cls(self) -> Any:
        return ray.remote(max_restarts=0, max_task_retries=0)(ClientExecutor)

    @property
    def placement_timeout(self) -> float:
        """Seconds an executor may take to be placed and ready (settled per run)."""
        return self.cfg.runtime.placement_timeout_s or LOCAL_PLACEMENT_TIMEOUT_S

    def name_of(self, tier: str, index: int) -> str:
        return f"fedray-{self.run_id}-{tier}-{index}-g{self.generation.get((tier, index), 0)}"

    def _spawn(self, tier: str, index: int) -> Any:
        opts = executor_options(self.cfg, self.tiers[tier])
        return self.actor_cls.options(name=self.name_of(tier, index), **opts).remote(
            self.cfg, self.algorithm_cls, self.data_ref, self.run_uri, tier, index)

    def wait_placed(self) -> None:
        refs = {ref: slot for slot, ref in self.boot.items()}
        self.boot = {}
        timeout = self.placement_timeout
        ready, missing = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        info = {}
        for ref in ready:
            try:
                info[refs[ref]] = ray.get(ref)
            except (RayActorError, ActorDiedError, ActorUnavailableError):
                if refs[ref] not in self.reused:
                    raise
                tier, index = refs[ref]  # a warm executor that died while idle: a new one
                self.reused.discard((tier, index))
                self.executors[tier][index] = self._spawn(tier, index)
                more = self.executors[tier][index].ready.remote()
                done, _ = ray.wait([more], timeout=timeout)
                if not done:
                    missing.append(more)
                    refs[more] = (tier, index)
                else:
                    info[(tier, index)] = ray.get(more)
        self.info = [info[k] for k in sorted(info, key=lambda s: (list(self.tiers).index(s[0]),
                                                                  s[1]))]
        if missing:
            lost = sorted({refs[r][0] for r in missing})
            self.shutdown()
            raise PlacementError(
                f"{len(missing)} of {len(refs)} executors (tiers {lost}) were not placed "
                f"within runtime.placement_timeout_s={timeout:g}s. Requested "
                f"{requested_resources(self.cfg)}; cluster total {ray.cluster_resources()}, "
                f"available {ray.available_resources()}. Ray waits silently for resources "
                f"that never come: lower the executors' shares or add nodes.")

    def handles(self) -> dict[str, list[Any]]:
        return {t: list(hs) for t, hs in self.executors.items()}

    def _replace(self, tier: str, index: int) -> None:
        """Start a new executor in the slot of a dead one. It gets work only once it is
        ready (:meth:`run` waits for its boot alongside the results), so a slot whose node
        is gone and cannot be re-placed now simply stays empty while the tier's other
        executors carry on; it joins when the cluster has room again (autoscaler)."""
        self.restarts += 1
        if self.restarts > self.cfg.runtime.max_executor_restarts:
            raise RuntimeError(f"executors died {self.restarts} times, more than "
                               f"runtime.max_executor_restarts="
                               f"{self.cfg.runtime.max_executor_restarts}")
        try:
            ray.kill(self.executors[tier][index])
        except Exception:  # noqa: BLE001 — it is already gone
            pass
        self.generation[(tier, index)] = self.generation.get((tier, index), 0) + 1
        self.executors[tier][index] = self._spawn(tier, index)
        self.booting[(tier, index)] = (self.executors[tier][index].ready.remote(),
                                       time.monotonic())

    def _check_booting(self, pending: dict[str, deque]) -> None:
        """Fail a tier that has work but no executor able to take it: every one of its slots
        still booting a replacement after ``placement_timeout``."""
        now = time.monotonic()
        for tier, queue in pending.items():
            slots = [(tier, i) for i in range(len(self.executors[tier]))]
            if queue and all(s in self.booting for s in slots) and all(
                    now - self.booting[s][1] > self.placement_timeout for s in slots):
                raise PlacementError(
                    f"no executor of tier {tier!r} could be re-placed within "
                    f"runtime.placement_timeout_s={self.placement_timeout:g}s after its nodes "
                    f"were lost; cluster total {ray.cluster_resources()}, available "
                    f"{ray.available_resources()}")

    def run(self, jobs: list[Job], requeue_dead: bool = True) -> Iterator[Any]:
        """Run typed ``jobs`` (:mod:`fedray.runtime.jobs`: each names its tier and executor
        method), yield each result as it finishes.

        The executor of a job that died is replaced; the job is re-queued on its tier, or,
        with ``requeue_dead=False``, handed back as a :class:`DeadJob` (a client that kills
        every executor it runs on must not be re-run forever). An executor busy without a
        result for ``runtime.call_timeout_s`` is killed (its jobs die with it).
        """
        calls = _Calls(self, jobs)
        limit = self.cfg.runtime.call_timeout_s
        for tier in calls.pending:
            calls.fill(tier)
        while calls.flight or any(calls.pending.values()):
            boots = {ref: slot for slot, (ref, _) in self.booting.items()}
            waits = [x for x in (limit / 4 if limit else None, 5.0 if boots else None) if x]
            ready, _ = ray.wait(list(calls.flight) + list(boots), num_returns=1,
                                timeout=min(waits) if waits else None)
            if ready and ready[0] in boots:  # a replacement came up: it takes work now
                tier, index = boots[ready[0]]
                del self.booting[(tier, index)]
                try:
                    ray.get(ready[0])
                except (RayActorError, ActorDiedError, ActorUnavailableError):
                    self._replace(tier, index)
                calls.fill(tier)
                continue
            self._check_booting(calls.pending)
            if ready:
                yield from calls.collect(ready[0], requeue_dead, limit)
            elif limit is not None:
                calls.kill_hung(limit)

    def shutdown(self) -> None:
        for hs in self.executors.values():
            for a in hs:
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001
                    pass



class _Calls:
    """The bookkeeping of one :meth:`ExecutorPool.run`: the jobs waiting per tier, the calls
    in flight, how many each executor (tier, slot, generation) has queued, and when a busy
    executor last showed a sign of life."""

    def __init__(self, pool: ExecutorPool, jobs: list[Job]):
        self.pool = pool
        self.pending: dict[str, deque] = {t: deque() for t in pool.executors}
        for job in jobs:
            if job.tier not in self.pending:
                raise KeyError(f"no executors for tier {job.tier!r}")
            self.pending[job.tier].append(job)
        self.busy: dict[tuple[str, int, int], int] = {}
        self.flight: dict[Any, tuple[str, int, int, Job]] = {}
        self.since: dict[tuple[str, int, int], float] = {}
        self.hung: set[tuple[str, int, int]] = set()

    def fill(self, tier: str) -> None:
        """Round-robin over the tier's executors, the least busy first, up to ``inflight``
        calls each."""
        pool, busy = self.pool, self.busy
        # while a slot boots a replacement, one call per executor: a call queued behind a
        # hung one would die with it, and the booting slot takes the next job
        cap = 1 if any((tier, i) in pool.booting
                       for i in range(len(pool.executors[tier]))) else pool.inflight
        room = True
        while self.pending[tier] and room:
            room = False
            keys = {i: (tier, i, pool.generation.get((tier, i), 0))
                    for i in range(len(pool.executors[tier]))}
            for index in sorted(keys, key=lambda i: busy.get(keys[i], 0)):  # idle first
                actor, key = pool.executors[tier][index], keys[index]
                if (tier, index) in pool.booting:
                    continue
                if self.pending[tier] and busy.get(key, 0) < cap:
                    job = self.pending[tier].popleft()
                    self.flight[getattr(actor, job.method).remote(job)] = (*key, job)
                    if not busy.get(key):
                        self.since[key] = time.monotonic()
                    busy[key] = busy.get(key, 0) + 1
                    room = True

    def kill_hung(self, limit: float) -> None:
        """Kill every executor busy without a result for ``limit`` seconds; its calls then
        fail as dead ones."""
        now = time.monotonic()
        for key in [k for k, t in self.since.items() if self.busy.get(k) and now - t > limit]:
            self.hung.add(key)
            self.since.pop(key)
            ray.kill(self.pool.executors[key[0]][key[1]])

    def collect(self, ref: Any, requeue_dead: bool, limit: float | None) -> Iterator[Any]:
        """The finished call ``ref``: its result, or — its executor dead, replaced unless
        already — the job re-queued (nothing yielded) or a :class:`DeadJob`."""
        tier, index, gen, job = self.flight.pop(ref)
        self.busy[(tier, index, gen)] -= 1
        self.since[(tier, index, gen)] = time.monotonic()
        try:
            result = ray.get(ref)
        except (RayActorError, ActorDiedError, ActorUnavailableError):
            if gen == self.pool.generation.get((tier, index), 0):
                self.pool._replace(tier, index)
            if requeue_dead:
                self.pending[tier].appendleft(job)
                self.fill(tier)
                return
            self.fill(tier)
            reason = (f"ran past runtime.call_timeout_s={limit:g}s and was killed"
                      if (tier, index, gen) in self.hung else "died")
            yield DeadJob(job, executor=f"{tier}/{index}", reason=reason)
            return
        self.fill(tier)
        yield result
