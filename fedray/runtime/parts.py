"""The parts a round is made of, bundled for the two loops that drive them
(:mod:`fedray.runtime.sync_loop`, :mod:`fedray.runtime.async_loop`), and the steps both
loops share: evaluation when due, central DP's release, the metrics rows, the clock's jump
to the next client online. Each stateful part has ``state_dict`` / ``load_state_dict``;
:mod:`fedray.runtime.checkpoint` writes them as one ``{part: state}`` checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.methods.base import AggregationPolicy, ClientSampler, State
from fedray.methods.robust.adversary import detection
from fedray.observe.metrics import MetricsWriter
from fedray.runtime.dispatch import Dispatcher
from fedray.runtime.jobs import RoundFailedError
from fedray.runtime.ledger import Ledger
from fedray.runtime.roster import ClientStates, Tiers
from fedray.runtime.rows import Evaluation, RoundRecord, round_rows


class ServerState:
    """The global model, the number of rounds (server steps) taken and how many of them
    failed (too few reports: model unchanged)."""

    def __init__(self) -> None:
        self.round = 0
        self.params: State = {}
        self.failed_rounds = 0

    def shapes(self) -> dict[str, tuple]:
        return {k: v.shape for k, v in self.params.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "params": self.params,
                "failed_rounds": self.failed_rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round, self.params = int(state["round"]), state["params"]
        self.failed_rounds = int(state.get("failed_rounds", 0))


@dataclass
class RoundParts:
    """Everything one round touches (built by the Driver, which only assembles)."""

    cfg: Any
    policy: AggregationPolicy
    server: ServerState
    sampler: ClientSampler
    dispatcher: Dispatcher
    ledger: Ledger
    clients: ClientStates
    tiers: Tiers
    fleet: Any
    privacy: Any
    metrics: MetricsWriter
    adversary: Any = None
    secagg: Any = None
    # the method's Algorithm.samples_seen: the samples each client's local training
    # processes (from an int64 array of the clients' sample counts), for the fleet clock
    samples_seen: Any = None

    def evaluate(self, r: int, sampled: list[int]) -> Evaluation:
        """Scores of round ``r`` when ``eval.every`` (or the last round) says so: the
        ``eval.clients`` (all, the sampled, none) on their local splits and, with
        ``eval.global_test``, every tier's model on the global test set."""
        ev = self.cfg.eval
        due = (ev.every and r % ev.every == 0) or r == self.cfg.rounds
        if not due:
            return Evaluation()
        who = (list(range(self.cfg.clients.num_clients)) if ev.clients == "all"
               else sampled if ev.clients == "sampled" else [])
        names = [t.name for t in self.cfg.runtime.tiers] if ev.global_test else []
        tiers = {self.tiers.of(c) for c in who} | set(names)
        params = self.server.params
        bcast = self.dispatcher.broadcasts(
            lambda tier: self.policy.broadcast(params, r, tier), tiers, f"{r}:eval")
        return self.dispatcher.evaluate(r, who, bcast, names)

    def log(self, rec: RoundRecord) -> dict:
        """Write the round's row and its clients' rows; return the round row. With an
        adversary every client row says whether the client is ``malicious``, and the round
        row how many sampled ones were and — when a robust rule weighed the uploads — the
        round's detection precision and recall (:func:`~fedray.methods.robust.adversary.
        detection`)."""
        if self.adversary is not None:
            bad = {c: float(self.adversary.is_malicious(c))
                   for c in set(rec.sampled) | set(rec.evaluation.clients)}
            for c, flag in bad.items():
                rec.client_extra.setdefault(c, {})["malicious"] = flag
            rec.extra["adversary/malicious_sampled"] = float(sum(bad[c] for c in rec.sampled))
            kept = {c: m["robust_kept"] for c, m in
                    rec.policy_metrics.get("per_client", {}).items() if "robust_kept" in m}
            if kept and not rec.policy_metrics.get("robust_skipped"):  # a skipped round's 0s
                # are no exclusion: the rule did not run
                cids = sorted(kept)
                found = detection(np.array([bad[c] for c in cids]),
                                  np.array([kept[c] for c in cids]))
                rec.extra |= {f"adversary/detection_{k}": math.nan if v is None else v
                              for k, v in found.items()}
        row, clients = round_rows(rec, self.tiers.of, self.ledger.totals)
        self.metrics.write_round(rec.round, row, clients)
        return row

    def dp_row(self) -> dict[str, float]:
        """ε so far, in every round row of a DP run (a release updates it)."""
        return {} if self.privacy is None else {"dp_epsilon": self.privacy.epsilon()}

    def privatize(self, accepted: list[tuple[int, int, State]], r: int, extra: dict
                  ) -> list[tuple[int, int, State]]:
        """With central DP (:mod:`fedray.services.privacy`): every accepted update replaced by the
        round's privatized mean, with unit weight (nobody accepted: the noise alone, as the
        update of pseudo-client -1); the DP metrics go to ``extra``."""
        if self.privacy is None:
            return accepted
        mean, metrics = self.privacy.privatize(self.server.params,
                                               [u for _, _, u in accepted], r)
        extra.update(metrics)
        return [(c, 1, mean) for c, _, _ in accepted] or [(-1, 1, mean)]

    def attack(self, accepted: list[tuple[int, int, State]], extra: dict
               ) -> list[tuple[int, int, State]]:
        """The accepted uploads as the server receives them: a colluding adversary's
        crafted updates in place of its clients' (:meth:`Adversary.collude`); its metrics go
        to ``extra``."""
        if self.adversary is None:
            return accepted
        accepted, metrics = self.adversary.collude(accepted)
        extra.update(metrics)
        return accepted

    def next_online(self, r: int) -> float:
        """When the clock jumps to while no client is online: the next session start (not
        one ulp before it); a :class:`RoundFailedError` when no one ever comes online."""
        now = self.ledger.sim_time
        later = self.fleet.next_online(now)
        if math.isinf(later):
            raise RoundFailedError(r, 0, max(1, self.cfg.fleet.min_reports), [
                (-1, "offline", f"no client is online at {now:.1f} s of simulated "
                                f"time and none comes online later (fleet.availability)")])
        return float(np.nextafter(later, math.inf))
