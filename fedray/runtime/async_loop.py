"""The asynchronous loop of a buffered rule (``buffer_size`` set: FedBuff, FedAsync): an
event queue in simulated time. ``concurrency`` clients are kept in flight, each drawn from
(seed, dispatch number) among the clients online at the current simulated time and
starting from the current global state; they finish by the fleet clock, and a server step
applies ``buffer_size`` uploads in the order they finished. Which dispatch finishes first
never depends on wall-clock order, so results stay bitwise the same.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from fedray.methods.base import AsyncUpdate, ClientResult, State, Status
from fedray.runtime.jobs import Broadcast, ClientSlot, RoundFailedError, TrainJob
from fedray.runtime.parts import RoundParts
from fedray.runtime.rows import RoundRecord


@dataclass
class Dispatch:
    """One client in flight: who, from which global version, since when, what it
    downloaded."""

    client: int
    version: int
    start: float
    download: int


class AsyncLoop:
    """In-flight dispatches and the global states they started from are its checkpointed
    state (the buffer is empty at a checkpoint); results computed early, broadcasts and
    lower bounds are derived again after a resume."""

    def __init__(self) -> None:
        self.dispatched = 0
        self.inflight: dict[int, Dispatch] = {}
        self.states: dict[int, State] = {}
        self.done: dict[int, tuple[ClientResult, float]] = {}
        self.bcast: dict[int, dict[str, Broadcast]] = {}
        self.bounds: dict[int, float] = {}  # dispatch -> earliest finish
        self._data: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"dispatched": self.dispatched,
                "inflight": [[d, f.client, f.version, f.start, f.download]
                             for d, f in self.inflight.items()],
                "states": {f"v{v}": s for v, s in self.states.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dispatched = int(state.get("dispatched", 0))
        self.inflight = {int(d): Dispatch(int(c), int(v), float(t), int(b))
                         for d, c, v, t, b in state.get("inflight", [])}
        self.states = {int(k[1:]): v for k, v in state.get("states", {}).items()}

    def inflight_clients(self) -> dict[int, int]:
        """{client: dispatch} of the clients in flight (their states may be written)."""
        return {f.client: d for d, f in self.inflight.items()}

    def broadcast(self, p: RoundParts, version: int, tier: str) -> Broadcast:
        per = self.bcast.setdefault(version, {})
        if tier not in per:
            tensors = p.policy.broadcast(self.states[version], version, tier)
            per[tier] = p.dispatcher.put(f"{version}:async:{tier}", tensors,
                                         p.cfg.payload.download)
        return per[tier]

    def dispatch(self, p: RoundParts, exclude: set[int]) -> None:
        """Keep ``policy.concurrency`` clients in flight: each new one is an online client
        not in flight, drawn from (seed, dispatch number) at the current simulated time,
        starting from the current global state."""
        self.states.setdefault(p.server.round, p.server.params)
        waits = 0
        while len(self.inflight) < p.policy.concurrency:
            d = self.dispatched + 1
            busy = exclude | {f.client for f in self.inflight.values()}
            picked = p.fleet.sample(d, 1, p.ledger.sim_time, exclude=busy)
            if not picked:
                if not self.inflight:  # no one online: wait for the next one
                    waits += 1
                    if waits > 100_000:
                        raise RoundFailedError(p.server.round + 1, 0, 1, [
                            (-1, "offline", "no client not already in this step comes "
                                            "online (fleet.availability)")])
                    p.ledger.sim_time = p.next_online(p.server.round + 1)
                    continue
                return
            self.dispatched = d
            c = picked[0]
            p.clients.touched.add(c)
            nbytes = p.ledger.charge(c, self.broadcast(p, p.server.round, p.tiers.of(c)).nbytes)
            self.inflight[d] = Dispatch(c, p.server.round, p.ledger.sim_time, nbytes)

    def lower_bound(self, p: RoundParts, d: int) -> float:
        """The earliest a dispatch can finish before it is computed: its download, latency
        and (when the client data knows its size) its compute; only the upload is unknown.
        The tighter this is, the more dispatches are computed together."""
        bound = self.bounds.get(d)
        if bound is None:
            f = self.inflight[d]
            t = p.fleet.seconds(np.array([f.client]), [p.tiers.of(f.client)],
                                np.array([f.download]), np.zeros(1),
                                p.samples_seen(np.array([self._size(p, f.client)])))
            bound = self.bounds[d] = f.start + float(t["down"][0] + t["compute"][0])
        return bound

    def _size(self, p: RoundParts, client: int) -> int:
        """A client's train-sample count from the client data (0 when it does not say)."""
        if self._data is None:
            self._data = ray.get(p.dispatcher.pool.data_ref)
        sizes = getattr(self._data, "num_samples", None)
        return int(sizes(client)) if sizes is not None else 0

    def compute(self, p: RoundParts, pending: list[int]) -> None:
        """Run the in-flight dispatches not computed yet (in parallel on the pool) and
        record each one's result and simulated finish time."""
        jobs = []
        for d in pending:
            f = self.inflight[d]
            if p.fleet.dropped(d, np.array([f.client]))[0]:
                res = ClientResult(f.client, d, Status.DROPPED, error="dropped out mid-round")
                self.done[d] = (res, self.lower_bound(p, d))
                continue
            tier = p.tiers.of(f.client)
            jobs.append(TrainJob(tier, self.broadcast(p, f.version, tier), d,
                                 [ClientSlot(f.client, p.clients.version(f.client))]))
        for res in p.dispatcher.run_each(jobs):
            d = res.round
            f = self.inflight[d]
            up = res.upload_bytes if res.ok else 0
            t = p.fleet.seconds(np.array([res.client_id]), [p.tiers.of(res.client_id)],
                                np.array([f.download]), np.array([up]),
                                p.samples_seen(np.array([res.num_samples])))
            finish = f.start + float(t["total"][0])
            if res.ok and finish > float(p.fleet.online_until(np.array([res.client_id]),
                                                              f.start)[0]):
                res.status, res.error = Status.DROPPED, "went offline before finishing"
                res.upload_bytes = 0
            self.done[d] = (res, finish)

    def next_event(self, p: RoundParts) -> int:
        """The dispatch that finishes first in simulated time (ties: lower dispatch number).
        A dispatch is known to be first once every uncomputed one cannot finish before it
        (its download alone takes longer), so results never depend on wall-clock order."""
        while True:
            ready = [(self.done[d][1], d) for d in self.inflight if d in self.done]
            pending = [d for d in self.inflight if d not in self.done]
            if ready:
                t, best = min(ready)
                if all((self.lower_bound(p, q), q) > (t, best) for q in pending):
                    return best
            if not pending:
                raise RuntimeError("no client in flight (is any client online?)")
            self.compute(p, pending)

    def step(self, p: RoundParts) -> dict:
        """One server step: pop finished clients in simulated-time order (dispatching a new
        one for each) until ``buffer_size`` uploads are buffered, then apply them."""
        t0 = time.perf_counter()
        r = p.server.round + 1
        start_time = p.ledger.sim_time
        popped: list[int] = []
        final: dict[int, ClientResult] = {}
        download: dict[int, int] = {}
        client_extra: dict[int, dict[str, float]] = {}
        buffer: list[AsyncUpdate] = []
        shapes = p.server.shapes()
        restarts_before = p.dispatcher.restarts
        misses = 0  # uploads in a row that were not buffered
        while len(buffer) < p.policy.buffer_size:
            self.dispatch(p, set(popped))
            d = self.next_event(p)
            res, finish = self.done.pop(d)
            f = self.inflight.pop(d)
            self.bounds.pop(d, None)
            c = f.client
            p.ledger.sim_time = max(p.ledger.sim_time, finish)
            p.clients.touched.add(c)
            popped.append(c)
            final[c], download[c] = res, f.download
            staleness = p.server.round - f.version
            client_extra[c] = {"sim_seconds": finish - f.start, "staleness": staleness}
            if res.ok:
                upload, clean = p.dispatcher.decode(
                    res, self.broadcast(p, f.version, p.tiers.of(c)), shapes)
                if not clean:
                    res.status, res.error = Status.REJECTED, "upload contains NaN or Inf"
                else:
                    buffer.append(AsyncUpdate(c, res.num_samples, upload, staleness,
                                              self.states[f.version]))
                    p.clients.record(c, res.state_version)
            misses = 0 if final[c].ok else misses + 1
            if misses > 10 * max(p.policy.concurrency, p.policy.buffer_size):
                raise RoundFailedError(r, len(buffer), p.policy.buffer_size, [
                    (c2, str(final[c2].status), final[c2].error) for c2 in popped[-3:]])
        p.ledger.charge_uploads(popped, final)
        extra: dict[str, float] = {}
        if p.privacy is not None:
            mean = p.privatize([(u.client_id, u.num_samples, u.upload) for u in buffer],
                               r, extra)[0][2]
            buffer = [dataclasses.replace(u, upload=mean, num_samples=1) for u in buffer]
        p.server.params, policy_metrics = p.policy.aggregate_async(p.server.params, buffer, r)
        p.server.round = r
        live = {f.version for f in self.inflight.values()}
        self.states = {v: s for v, s in self.states.items() if v in live}
        self.bcast = {v: b for v, b in self.bcast.items() if v in live}
        policy_metrics["mean_staleness"] = float(np.mean([u.staleness for u in buffer]))
        extra |= {"sim_seconds": p.ledger.sim_time - start_time,
                  "cum_sim_seconds": p.ledger.sim_time, "round_failed": 0.0}
        evaluation = p.evaluate(r, sorted(popped))
        return p.log(RoundRecord(r, sorted(popped), final, dict.fromkeys(popped, 1), download,
                                 evaluation, policy_metrics,
                                 p.dispatcher.restarts - restarts_before,
                                 time.perf_counter() - t0, client_extra, extra))
