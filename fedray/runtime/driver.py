"""Driver: one experiment's round loop, run as a Ray actor. It only assembles the parts.

- :class:`~fedray.runtime.parts.ServerState` — the global model and the round;
- the method's :class:`~fedray.methods.base.AggregationPolicy` and the server optimizer
  it hands its pseudo-gradient to (:mod:`fedray.services.server_opt`);
- a :class:`~fedray.methods.base.ClientSampler` (:mod:`fedray.runtime.sampler`, or the
  method's own through :meth:`~fedray.methods.base.Algorithm.make_sampler`);
- the :class:`~fedray.runtime.dispatch.Dispatcher` (typed jobs to the executor pool, typed
  results back, retries, decoding);
- the :class:`~fedray.runtime.ledger.Ledger` (exact bytes, the simulated clock);
- the client-state manifest and the tier cache (:mod:`fedray.runtime.roster`);
- central DP (:class:`fedray.services.privacy.CentralDP`) when enabled;
- the malicious clients (:class:`fedray.methods.robust.adversary.Adversary`) when any;
- secure aggregation (:class:`fedray.services.secure_round.SecureAggregator`) when enabled;
- the loop: :class:`~fedray.runtime.sync_loop.SyncLoop`, or
  :class:`~fedray.runtime.async_loop.AsyncLoop` for a buffered rule (FedBuff, FedAsync).

A checkpoint is ``{part: state}`` (:mod:`fedray.core.checkpoint`), written at round boundaries
and read back by ``--resume``. The driver knows no model code and no method.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from fedray.core import checkpoint
from fedray.core.registry import make_method
from fedray.core.storage import Storage
from fedray.methods.base import CohortRule
from fedray.methods.robust.adversary import adversary_of
from fedray.observe.metrics import MetricsWriter
from fedray.runtime.async_loop import AsyncLoop
from fedray.runtime.devices import settle_heap
from fedray.runtime.dispatch import Dispatcher
from fedray.runtime.jobs import RoundFailedError
from fedray.runtime.ledger import Ledger
from fedray.runtime.parts import RoundParts, ServerState
from fedray.runtime.pool import ExecutorPool
from fedray.runtime.roster import ClientStates, Tiers
from fedray.runtime.sampler import make_sampler
from fedray.runtime.sync_loop import SyncLoop
from fedray.services.fleet import Fleet
from fedray.services.privacy import CentralDP
from fedray.services.secure_round import SecureAggregator

__all__ = ["Driver", "RoundFailedError"]


class Driver:
    def __init__(self, cfg: Any, algorithm_cls: type, pool: ExecutorPool, run_uri: str,
                 cohort: CohortRule | None = None):
        self.cfg, self.pool, self.run_uri = cfg, pool, run_uri
        self.storage = Storage(run_uri)
        algorithm = make_method(algorithm_cls, cfg)
        policy = algorithm.make_policy()
        chain = algorithm.update_chain()  # uploads are decoded before the policy
        fleet = Fleet.of(cfg, {t.name: algorithm.compute_cost(t) for t in cfg.runtime.tiers})
        privacy = (CentralDP(cfg, algorithm.to_delta, algorithm.from_delta)
                   if cfg.dp.enabled else None)
        tiers = Tiers(cfg)
        self.parts = RoundParts(
            cfg=cfg, policy=policy, server=ServerState(),
            sampler=algorithm.make_sampler(make_sampler(cfg, fleet, privacy), fleet),
            dispatcher=Dispatcher(cfg, pool, tiers, chain, cohort),
            ledger=Ledger(algorithm.base_bytes()),
            clients=ClientStates(algorithm.uses_client_state or chain.stateful),
            tiers=tiers, fleet=fleet, privacy=privacy, metrics=MetricsWriter(self.storage),
            adversary=adversary_of(cfg),
            secagg=SecureAggregator(cfg, privacy) if cfg.secagg.enabled else None,
            samples_seen=algorithm.samples_seen)
        self.loop: SyncLoop | AsyncLoop = (AsyncLoop() if policy.buffer_size is not None
                                           else SyncLoop())

    def stateful(self) -> dict[str, checkpoint.Stateful]:
        """The parts a checkpoint holds, by name."""
        p = self.parts
        out = {"server": p.server, "policy": p.policy, "ledger": p.ledger,
               "clients": p.clients, "dispatcher": p.dispatcher,
               "sampler": p.sampler, "loop": self.loop}
        if p.policy.optimizer is not None:
            out["optimizer"] = p.policy.optimizer
        if p.privacy is not None:
            out["dp"] = p.privacy
        return out

    def reset(self, cfg: Any, algorithm_cls: type, pool: ExecutorPool, run_uri: str,
              cohort: CohortRule | None = None) -> None:
        """Become the driver of a new run (``runtime.keep_warm``): every attribute is rebuilt
        from these arguments as ``__init__`` builds it."""
        self.release()
        self.__init__(cfg, algorithm_cls, pool, run_uri, cohort)  # type: ignore[misc]

    def release(self) -> None:
        """Drop everything of the finished run (its executors are the caller's to keep)."""
        from fedray.runtime.devices import free_device_memory

        self.__dict__.clear()
        free_device_memory()

    def setup(self, resume: bool = False) -> dict:
        """Wait for the executors, then load the latest checkpoint or initialise the model."""
        self.pool.wait_placed()
        states = checkpoint.read(self.storage) if resume else None
        server = self.parts.server
        if states is not None:
            checkpoint.restore(self.stateful(), states, self.run_uri)
        else:
            first = self.pool.executors[self.cfg.runtime.tiers[0].name][0]
            params = ray.get(first.init_global_state.remote(self.cfg.seed)).decode()
            server.params = {k: np.array(v) for k, v in params.items()}
        if resume:  # rounds logged after the checkpoint were not committed: re-run them
            self.parts.metrics.truncate_after(server.round)
        settle_heap()
        return {"round": server.round, "executors": self.pool.info,
                "parameters": int(sum(v.size for v in server.params.values()))}

    def run_round(self) -> dict:
        """Run the next round (or, for an asynchronous rule, the next server step), then
        checkpoint when due; return its metrics row."""
        row = self.loop.step(self.parts)
        r = self.parts.server.round
        if r % self.cfg.runtime.checkpoint_every == 0 or r == self.cfg.rounds:
            self.checkpoint()
        return row

    def checkpoint(self) -> None:
        """Round-boundary checkpoint of every part; then client states no checkpoint can
        need any more are pruned. The sampling position is the round itself."""
        checkpoint.write(self.storage, self.parts.server.round, self.stateful())
        self.parts.clients.prune(self.storage, self.loop.inflight_clients())

    def get_global_state(self) -> dict[str, np.ndarray]:
        return self.parts.server.params

    def at_rest(self) -> bool:
        """No client in flight between steps (always so for a synchronous loop)."""
        return not self.loop.inflight_clients()

    def executor_handles(self) -> dict[str, list[Any]]:
        return self.pool.handles()

    def finish(self) -> dict:
        p = self.parts
        p.metrics.consolidate()
        return {"round": p.server.round, "totals": dict(p.ledger.totals),
                "executor_restarts": self.pool.restarts, "sim_seconds": p.ledger.sim_time,
                "failed_rounds": p.server.failed_rounds,
                "privacy": p.privacy.summary() if p.privacy is not None else None}

    def shutdown(self) -> None:
        self.pool.shutdown()
