"""What the driver remembers about clients: their tiers (a bounded cache, no list over the
population) and their client-state manifest (which round's state each one must start
from, pruned at checkpoints)."""

from __future__ import annotations

from typing import Any

from fedray.core.state_store import ClientStateStore

TIER_CACHE = 1_000_000


class Tiers:
    """A client's tier (:meth:`ExperimentConfig.tier_of`), remembered for the clients seen;
    with one tier and no per-client mapping, every client's without a lookup."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self._tiers: dict[int, str] = {}
        tiers = cfg.runtime.tiers
        self._only = tiers[0].name if len(tiers) == 1 and cfg.clients.tiers is None else None

    def of(self, client: int) -> str:
        if self._only is not None:
            return self._only
        t = self._tiers.get(client)
        if t is None:
            self.remember([client])
            t = self._tiers[client]
        return t

    def remember(self, clients: list[int]) -> None:
        """Look up the tiers of clients not seen yet, at once (vectorised); the cache is
        bounded whatever the population."""
        if self._only is not None:
            return
        new = [c for c in clients if c not in self._tiers]
        if new:
            if len(self._tiers) + len(new) > TIER_CACHE:
                self._tiers.clear()
            self._tiers.update(zip(new, self.cfg.tiers_of(new), strict=True))

    def many(self, clients: list[int]) -> list[str]:
        """The tiers of ``clients``, in order (:meth:`of` for each, looked up at once)."""
        if self._only is not None:
            return [self._only] * len(clients)
        self.remember(clients)
        known = self._tiers.get
        return [known(c) or self.of(c) for c in clients]

    def group(self, clients: list[int]) -> dict[str, list[int]]:
        """``clients`` by tier, each in the given order."""
        if self._only is not None:
            return {self._only: list(clients)} if clients else {}
        by_tier: dict[str, list[int]] = {}
        for c, t in zip(clients, self.many(clients), strict=True):
            by_tier.setdefault(t, []).append(c)
        return by_tier


class ClientStates:
    """The client-state manifest: the round whose state each client wrote last
    (``versions``), the manifest of the previous checkpoint, and the clients that ran
    since it. Only the manifest is checkpointed; the states are files of the
    :class:`ClientStateStore`."""

    def __init__(self, enabled: bool):
        self.enabled = enabled  # the method or the transform chain keeps client state
        self.versions: dict[int, int] = {}
        self.kept: dict[int, int] = {}
        self.touched: set[int] = set()

    def version(self, client: int) -> int | None:
        return self.versions.get(client)

    def record(self, client: int, version: int | None) -> None:
        if version is not None:
            self.versions[client] = version

    def prune(self, storage: Any, inflight: dict[int, int]) -> None:
        """After a checkpoint: drop state files no checkpoint can need any more (the
        ``inflight`` clients' states, computed early by an asynchronous rule, stay)."""
        if self.enabled:
            ClientStateStore(storage).prune(self.touched, self.versions, self.kept, inflight)
        self.kept = dict(self.versions)
        self.touched = set()

    def state_dict(self) -> dict[str, Any]:
        return {"versions": dict(self.versions)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.versions = dict(state["versions"])
        self.kept = dict(self.versions)
