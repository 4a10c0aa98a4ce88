"""Actors kept warm between the runs of one process (``runtime.keep_warm``).

A run's fixed cost is mostly process start: ``ray.init`` (≈ 4 s here) and a driver and
executors that each import torch (≈ 2.5 s). A process that runs several experiments (a job
comparing methods, a notebook, a benchmark) pays it once when its runs set
``runtime.keep_warm``: Ray stays up after the run, and the driver and executors go back to
this registry instead of being killed. The next run with the same resource shape takes them
and :meth:`reset` rebuilds every attribute from that run's arguments, exactly as a new
actor's ``__init__`` would; :meth:`release` drops them (data, model, state) at the end.

Isolation: nothing of a run survives in an actor but the imported modules and torch's
process settings, which are part of the shape (threads, determinism). Client updates seed
their own generators from (seed, round, client), so a warm run gives the bits a cold run
gives (tested). Only executors this process created go back to the registry (a replacement
created by the driver dies with it); a run that fails or is stopped by a signal returns
nothing, one released between synchronous rounds (``Experiment.release`` after ``step``)
returns them as a finished one does, so resuming it here starts warm. Idle actors whose
shape the next run does not use are killed before it places its own, so they never hold
resources it needs; :func:`release_warm` kills the rest (or the process's exit does).
"""

from __future__ import annotations

import json
from typing import Any

_IDLE: dict[str, list[Any]] = {}
_SESSION: list[str] = []  # the Ray session the idle actors belong to


def shape_key(kind: str, options: dict[str, Any], settings: dict[str, Any]) -> str:
    """The registry key: what the actor is (driver, executor), its Ray resource options and
    the per-process settings a reset cannot undo."""
    return json.dumps([kind, options, settings], sort_keys=True, default=str)


def _session() -> str:
    import ray

    ctx = ray.get_runtime_context()
    return f"{ctx.gcs_address}/{ctx.get_job_id()}"


def _current() -> None:
    """Forget actors of an earlier Ray session (``ray.shutdown`` killed them)."""
    import ray

    if not ray.is_initialized():
        _IDLE.clear()
        _SESSION.clear()
        return
    now = _session()
    if _SESSION != [now]:
        _IDLE.clear()
        _SESSION[:] = [now]


def take(key: str) -> Any | None:
    """An idle actor of ``key``, now the caller's, or None."""
    _current()
    idle = _IDLE.get(key)
    if not idle:
        return None
    actor = idle.pop()
    if not idle:
        del _IDLE[key]
    return actor


def give(key: str, actor: Any) -> None:
    """Return ``actor`` (already released) to the registry."""
    _current()
    _IDLE.setdefault(key, []).append(actor)


def retain(wanted: dict[str, int]) -> None:
    """Kill idle actors beyond ``wanted`` = {key: how many the next run can use}."""
    import ray

    _current()
    for key in list(_IDLE):
        keep = wanted.get(key, 0)
        for actor in _IDLE[key][keep:]:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 — already gone
                pass
        del _IDLE[key][keep:]
        if not _IDLE[key]:
            del _IDLE[key]


def idle() -> dict[str, int]:
    """How many idle actors of each key (for tests and ``--json`` summaries)."""
    _current()
    return {k: len(v) for k, v in _IDLE.items()}


def release_warm() -> None:
    """Kill every idle warm actor of this process (their CPUs and GPUs are free again)."""
    retain({})


__all__ = ["give", "idle", "release_warm", "retain", "shape_key", "take"]
