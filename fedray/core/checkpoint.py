"""A run's checkpoint as ``{part: state}``: one function writes it, one reads it back.

Every stateful part of the round (:mod:`fedray.runtime.parts`: the server state, the
policy, the ledger, the client-state manifest, the dispatcher, the sampler, the loop, DP)
has ``state_dict`` / ``load_state_dict``; a checkpoint holds each part's state under the
part's name, so a new piece of state is one edit, in its part. Stored through
:meth:`fedray.core.storage.Storage.write_checkpoint` (data only, digest-checked, never
unpickled). A checkpoint of the flat layout versions before 2026-12 wrote is read as the
same parts, so a run started by an older fedray resumes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from fedray.core.spec import ConfigError, short_repr, shown
from fedray.core.storage import StateFileError, Storage

FORMAT = 2
KEEP = 2  # checkpoints kept (the newest, and the one before in case it is damaged)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def write(storage: Storage, index: int, parts: Mapping[str, Stateful]) -> None:
    """Checkpoint ``index`` (the round): every part's state under its name."""
    storage.write_checkpoint(index, {"format": FORMAT,
                                     "parts": {n: p.state_dict() for n, p in parts.items()}},
                             keep=KEEP)


def read(storage: Storage) -> dict[str, Any] | None:
    """``{part: state}`` of the newest intact checkpoint (None when there is none), its
    common fields checked (:func:`check`)."""
    ck = storage.newest_checkpoint()
    if ck is None:
        return None
    parts = upgrade(ck.state)
    check(parts, ck.index, ck.path)
    return parts


def check(parts: dict[str, Any], index: int, where: str) -> None:
    """The fields every run's checkpoint holds, as fedray writes them: each part a
    mapping; the server's ``round`` the checkpoint's own index (checkpoint ``N`` is written
    after round ``N``) and its ``failed_rounds`` a count no larger; the ledger's totals
    counts and its clock a finite, non-negative number. Checked where the checkpoint is
    read (before Ray starts), so an edited one — even with a matching digest in ``LATEST``
    — is one error naming the field, never a resume that runs round −4 after deleting the
    rows it should keep. A method's own parts are checked by their ``load_state_dict``."""
    def bad(field: str, value: Any, rule: str) -> StateFileError:
        return StateFileError(where, f"{field} is {short_repr(value)}; {rule}")

    for name, state in parts.items():
        if not isinstance(state, dict):
            raise bad(f"part {shown(name)!r}", state, "a mapping of its fields")
    server = parts.get("server")
    if server is None:
        raise StateFileError(where, "no 'server' part")
    rnd, failed = server.get("round"), server.get("failed_rounds", 0)
    if not _count(rnd) or rnd != index:
        raise bad("server.round", rnd, f"checkpoint {index} holds round {index}")
    if not _count(failed) or failed > rnd:
        raise bad("server.failed_rounds", failed, f"a count of at most {rnd}")
    ledger = parts.get("ledger", {})
    totals = ledger.get("totals", {})
    if not isinstance(totals, dict) or not all(_count(v) for v in totals.values()):
        raise bad("ledger.totals", totals, "counts of bytes and clients (integers >= 0)")
    sim = ledger.get("sim_time", 0.0)
    if isinstance(sim, bool) or not isinstance(sim, int | float | np.floating) or \
            not math.isfinite(sim) or sim < 0:
        raise bad("ledger.sim_time", sim, "a finite number of seconds >= 0")


def _count(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 0


def restore(parts: Mapping[str, Stateful], states: Mapping[str, Any], where: str) -> None:
    """Load each part's state; a part the checkpoint lacks (a run resumed with other
    settings than it was started with) is an error naming it, before anything runs."""
    for name in parts:
        if name not in states:
            raise ConfigError("--resume", where, f"the settings the run was started with "
                                                 f"(its checkpoint holds no {name!r} state)")
    for name, part in parts.items():
        part.load_state_dict(states[name])


def upgrade(ck: Any) -> dict[str, Any]:
    """The parts of a stored checkpoint, of this layout or of the flat one before it."""
    if not isinstance(ck, dict):
        raise StateFileError("checkpoint", "not a mapping of parts")
    if "format" in ck:
        if ck["format"] != FORMAT or not isinstance(ck.get("parts"), dict):
            raise StateFileError("checkpoint", f"layout {ck['format']!r}; this fedray reads "
                                               f"layout {FORMAT}")
        return ck["parts"]
    try:  # the flat layout: one key per field
        parts = {
            "server": {"round": ck["round"], "params": ck["global_state"],
                       "failed_rounds": ck.get("failed_rounds", 0)},
            "policy": ck["policy_state"],
            "ledger": {"totals": ck["totals"], "has_base": ck["has_base"],
                       "sim_time": ck.get("sim_time", 0.0)},
            "clients": {"versions": ck["versions"]},
            "dispatcher": {"restarts": ck["restarts"]},
            "sampler": {},
            "loop": ck.get("async", {}),
        }
    except KeyError as e:
        raise StateFileError("checkpoint", f"no {e.args[0]!r} entry") from None
    velocity = ck["policy_state"].get("velocity") if isinstance(ck["policy_state"], dict) \
        else None
    parts["optimizer"] = {"velocity": velocity} if velocity is not None else {}  # FedAvgM's
    if "dp" in ck:
        parts["dp"] = ck["dp"]
    return parts
