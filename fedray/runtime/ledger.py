"""The byte ledger and the simulated clock of a run.

Every download is charged when it happens (the tier's broadcast once per attempt, plus the
pretrained base the first time a client downloads anything); every completed upload is
charged its exact encoded bytes; secure aggregation's protocol messages are charged to the
same up and down totals (and counted apart in ``protocol_bytes``); failures and rejections
are counted. The simulated clock
only moves forward, by what the fleet model says a round or a dispatch took.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fedray.methods.base import ClientResult, Status

TOTALS = ("upload_bytes", "download_bytes", "failures", "rejected", "protocol_bytes")


class Ledger:
    def __init__(self, base_bytes: int = 0):
        self.base_bytes = base_bytes
        self.totals = dict.fromkeys(TOTALS, 0)
        self.has_base: set[int] = set()
        self.sim_time = 0.0

    def charge(self, client: int, broadcast_bytes: int) -> int:
        """One client's download: the broadcast bytes, plus the pretrained base the first
        time the client downloads anything. Returns what it downloaded."""
        return self.charge_downloads([client], {client: 1}, {client: broadcast_bytes})[client]

    def charge_downloads(self, sampled: list[int], attempts: dict[int, int],
                         broadcast_bytes: dict[int, int]) -> dict[int, int]:
        """Each sampled client's broadcast once per attempt (and its base): {client: bytes}."""
        got = {c: broadcast_bytes[c] * attempts[c] for c in sampled}
        if self.base_bytes:
            for c in got.keys() - self.has_base:
                got[c] += self.base_bytes
            self.has_base.update(got)
        self.totals["download_bytes"] += sum(got.values())
        return got

    def charge_uploads(self, clients: list[int], final: dict[int, ClientResult]) -> None:
        """Every completed upload's exact bytes; failures and rejections counted."""
        res = [final[c] for c in clients]
        status = Counter(r.status for r in res)
        self.totals["upload_bytes"] += sum(r.upload_bytes for r in res)
        self.totals["failures"] += status[Status.ERROR]
        self.totals["rejected"] += status[Status.REJECTED]

    def charge_protocol(self, up: dict[int, int], down: dict[int, int]) -> None:
        """Secure aggregation's messages besides the masked input (which is the upload)."""
        self.totals["upload_bytes"] += sum(up.values())
        self.totals["download_bytes"] += sum(down.values())
        self.totals["protocol_bytes"] += sum(up.values()) + sum(down.values())

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "has_base": sorted(self.has_base),
                "sim_time": self.sim_time}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = {k: int(state["totals"].get(k, 0)) for k in TOTALS}
        self.has_base = {int(c) for c in state["has_base"]}
        self.sim_time = float(state.get("sim_time", 0.0))
