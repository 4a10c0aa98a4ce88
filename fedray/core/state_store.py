"""ClientStateStore: each virtual client's persistent state between rounds.

States are versioned by the round that wrote them and stored as data
(:meth:`Storage.write_state`, never a pickle) under
``client_state/{client_id // 1000}/{client_id}/{round}.npz`` in the run's :class:`Storage`
(sharded: no directory holds more than 1,000 clients, whatever the population; runs written
by earlier versions, with ``client_state/{client_id}/...``, are still read). The driver
keeps the manifest (client -> latest committed version) inside its checkpoints, so a
resumed run reads exactly the versions of its checkpoint even if a killed round had
already written newer ones. Each executor keeps an in-memory cache of the states it wrote
last; a cached entry is used only when its version equals the manifest's, so a client that
moves to another executor never sees a stale copy.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from fedray.core.storage import Storage


class ClientStateStore:
    def __init__(self, storage: Storage, cache_size: int = 256):
        self.storage = storage
        self.cache: OrderedDict[int, tuple[int, Any]] = OrderedDict()
        self.cache_size = cache_size
        self.reads = 0

    @staticmethod
    def folder(client_id: int) -> str:
        return f"client_state/{client_id // 1000:05d}/{client_id:08d}"

    def _rel(self, client_id: int, version: int) -> str:
        return f"{self.folder(client_id)}/{version:06d}.npz"

    def _path_of(self, client_id: int, version: int) -> str:
        rel = self._rel(client_id, version)
        legacy = f"client_state/{client_id:06d}/{version:06d}.npz"
        if not self.storage.exists(rel) and self.storage.exists(legacy):
            return legacy
        return rel

    def load(self, client_id: int, version: int | None) -> Any:
        """The state written by round ``version`` (``None``: the client has no state yet)."""
        if version is None:
            return None
        hit = self.cache.get(client_id)
        if hit is not None and hit[0] == version:
            self.cache.move_to_end(client_id)
            return hit[1]
        self.reads += 1
        state = self.storage.read_state(self._path_of(client_id, version))
        self._remember(client_id, version, state)
        return state

    def save(self, client_id: int, version: int, state: Any) -> int:
        """Write-through: persist, cache, return the bytes written."""
        nbytes = self.storage.write_state(self._rel(client_id, version), state)
        self._remember(client_id, version, state)
        return nbytes

    def _remember(self, client_id: int, version: int, state: Any) -> None:
        self.cache[client_id] = (version, state)
        self.cache.move_to_end(client_id)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    def prune(self, clients: set[int] | list[int], *manifests: dict[int, int]) -> None:
        """Delete the versions of ``clients`` (those that ran since the last checkpoint: no
        other client wrote anything) that none of ``manifests`` names — after a checkpoint
        commit; the manifests of every kept checkpoint, so a resume may fall back to an
        older one. Only those clients' directories are listed, not the population's."""
        for cid in sorted(clients):
            keep = {m[cid] for m in manifests if cid in m}
            folder = self.folder(cid)
            for f in self.storage.listdir(folder):
                if not re.fullmatch(r"\d+\.npz", f) or int(f[:-4]) not in keep:
                    self.storage.delete(f"{folder}/{f}")
