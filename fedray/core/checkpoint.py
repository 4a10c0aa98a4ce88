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

from collections.abc import Mapping
from typing import Any, Protocol

from fedray.core.spec import ConfigError
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
    """``{part: state}`` of the newest intact checkpoint (None when there is none)."""
    ck = storage.read_checkpoint()
    return None if ck is None else upgrade(ck)


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
