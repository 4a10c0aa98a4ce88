"""Samplers: who takes part in a synchronous round (the :class:`ClientSampler` contract of
:mod:`fedray.methods.base`).

Every draw is a pure function of (seed, round) and, for a fleet, of the simulated time, so
it is the same whatever the executor count and after ``--resume``; the samplers here keep
no state between rounds. Over-commitment (``fleet.overcommit`` = o) draws
``ceil((1 + o) K)`` clients and closes the round on the first ``K`` reports.
"""

from __future__ import annotations

from typing import Any

from fedray.core.seeding import rng
from fedray.methods.base import ClientSampler, Draw
from fedray.services.fleet import sampled_per_round
from fedray.services.privacy import poisson_sample


def sample_clients(seed: int, round: int, num_clients: int, k: int) -> list[int]:
    """The clients of ``round``: a uniform draw without replacement, from (seed, round)."""
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(int(c) for c in rng(seed, round, -1, "sample").choice(num_clients, k,
                                                                         replace=False))


class _Stateless:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class UniformSampler(_Stateless):
    """``want`` of the N clients uniformly without replacement; the round closes on K."""

    def __init__(self, seed: int, num_clients: int, k: int, want: int):
        self.seed, self.num_clients, self.k, self.want = seed, num_clients, k, want

    def draw(self, round: int, sim_time: float) -> Draw:
        return Draw(sample_clients(self.seed, round, self.num_clients, self.want), self.k)


class PoissonSampler(_Stateless):
    """Every client independently with probability q = K/N (central DP's Poisson
    sampling); the round closes on everyone drawn. An empty draw passes at once."""

    def __init__(self, seed: int, num_clients: int, k: int):
        self.seed, self.num_clients, self.q = seed, num_clients, k / num_clients

    def draw(self, round: int, sim_time: float) -> Draw:
        clients = poisson_sample(self.seed, round, self.num_clients, self.q)
        return Draw(clients, len(clients), wait=False)


class FleetSampler(_Stateless):
    """``want`` clients among those the fleet has online at the round's start
    (:meth:`fedray.services.fleet.Fleet.sample`); the round closes on K. Nobody online: the draw is
    empty and the clock waits for the next one."""

    def __init__(self, fleet: Any, k: int, want: int):
        self.fleet, self.k, self.want = fleet, k, want

    def draw(self, round: int, sim_time: float) -> Draw:
        return Draw(self.fleet.sample(round, self.want, sim_time), self.k)


def make_sampler(cfg: Any, fleet: Any, privacy: Any) -> ClientSampler:
    """The runtime's sampler of a run: Poisson with Poisson-sampled central DP, else among
    the online clients when the fleet has an availability model, else uniform."""
    n, k = cfg.clients.num_clients, cfg.clients.sampled_count()
    want = sampled_per_round(cfg)
    if privacy is not None and privacy.sampling == "poisson":
        return PoissonSampler(cfg.seed, n, k)
    if fleet.availability is None:
        return UniformSampler(cfg.seed, n, k, want)
    return FleetSampler(fleet, k, want)
