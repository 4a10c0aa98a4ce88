"""The typed jobs the driver hands to executors, the typed results they hand back, and the
error a round that cannot go on raises.

One job type per executor call and one result type per job type, whatever the mode
(``runtime.reduce``): nothing positional, no return shape that depends on a flag. A job
carries its broadcast as a :class:`Broadcast` (its key, its object ref, its exact bytes):
the executor fetches the payload only when it has not decoded that key already.

A job's clients and a batch's results cross the object store as columns (plain lists):
pickling a list of dataclasses costs the pickler a Python-level lookup per object, most
of the transport of a 10,000-client round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np

from fedray.methods.base import (
    ClientResult,
    EvalResult,
    StackRow,
    State,
    Status,
    finite_rows,
)

_RESULT_FIELDS = [f.name for f in fields(ClientResult)]
if not all(f.init and not f.kw_only for f in fields(ClientResult)):
    raise TypeError("ClientResult's fields must all be positional: results are rebuilt "
                    "from columns")
_STATUS = {s.value: s for s in Status}


def _result_columns(results: list[ClientResult]) -> dict[str, list]:
    cols = {name: [getattr(r, name) for r in results] for name in _RESULT_FIELDS
            if name != "status"}
    cols["status"] = [r.status.value for r in results]
    return cols


def _results(cols: dict[str, list]) -> list[ClientResult]:
    cols = dict(cols, status=[_STATUS[v] for v in cols["status"]])
    return [ClientResult(*row) for row in zip(*(cols[n] for n in _RESULT_FIELDS),
                                              strict=True)]


def even_groups(items: list, groups: int) -> list[list]:
    """``items`` in order, cut into ``groups`` runs whose sizes differ by at most one."""
    q, r = divmod(len(items), groups)
    bounds = [i * q + min(i, r) for i in range(groups + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def cohort_runs(items: list, cohort: int) -> list[list]:
    """An executor call's clients (in order) as its cohorts: ``⌈n / cohort⌉`` near-equal
    runs of at most ``cohort`` each, so the last is never a short tail that pays a whole
    batched step for a few clients."""
    return even_groups(items, math.ceil(len(items) / cohort)) if items else []


@dataclass(frozen=True)
class Broadcast:
    """One encoded broadcast, ``ray.put`` once: ``key`` names it uniquely within the run,
    ``nbytes`` is what each client that receives it downloads."""

    key: str
    ref: Any
    nbytes: int


class ClientSlot(NamedTuple):
    """A client to run and the client-state version it must start from (None: none). A
    named tuple: a round builds one per client, and it is cheaper to make than a frozen
    dataclass (0.24 against 0.33 µs)."""

    client: int
    version: int | None = None


@dataclass
class TrainJob:
    """Run the local updates of ``clients`` from ``broadcast`` for ``round`` (an
    asynchronous dispatch uses its dispatch number as the round). ``reduce``
    (``runtime.reduce=executors``): the uploads are summed on the executor and come back
    as a :class:`Partial` instead of payloads. ``cohort`` (``runtime.vectorize``): the
    clients train in near-equal runs of at most this many (:func:`cohort_runs`), in the
    job's order, each run as one batched computation (None: one after another)."""

    method: ClassVar[str] = "run_clients"
    tier: str
    broadcast: Broadcast
    round: int
    clients: list[ClientSlot]
    reduce: bool = False
    cohort: int | None = None

    @property
    def client_ids(self) -> list[int]:
        return [s.client for s in self.clients]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "clients": ([s.client for s in self.clients],
                                             [s.version for s in self.clients])}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ids, versions = state["clients"]
        self.__dict__.update(state, clients=[ClientSlot(c, v) for c, v in
                                             zip(ids, versions, strict=True)])


@dataclass
class Partial:
    """A group's uploads summed where they were computed: Σ_i w_i Δ_i (float64), Σ_i w_i,
    and the clients whose upload held NaN or Inf (left out of the sum)."""

    total: State
    weight: float
    nonfinite: list[int] = field(default_factory=list)


@dataclass
class StackedUploads:
    """A cohort's uploads as one payload of stacked tensors (leading axis: ``clients``, in
    order), encoded with an elementwise codec and no update transforms; each client's
    :class:`ClientResult` carries no payload but its own exact ``upload_bytes``."""

    clients: list[int]
    payload: Any

    def checked(self) -> tuple[State, np.ndarray]:
        """Decoded once: the stacked tensors, and for each row whether it is free of NaN
        and Inf (:func:`~fedray.methods.base.finite_rows`, on the stack)."""
        tensors = self.payload.decode()
        return tensors, finite_rows(tensors, len(self.clients))

    def unstacked(self) -> dict[int, tuple[State, bool]]:
        """:meth:`checked` per client: its upload (a :class:`~fedray.methods.base.StackRow`
        of the stack) and whether it is clean."""
        tensors, clean = self.checked()
        return {c: (StackRow(tensors, i), ok)
                for i, (c, ok) in enumerate(zip(self.clients, clean.tolist(), strict=True))}


@dataclass
class TrainBatch:
    """What a :class:`TrainJob` returns: one :class:`ClientResult` per client in the job's
    order (payloads left out when reduced or stacked), for a reduced job its
    :class:`Partial`, and the cohorts' :class:`StackedUploads`."""

    results: list[ClientResult]
    partial: Partial | None = None
    stacks: list[StackedUploads] = field(default_factory=list)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "results": _result_columns(self.results)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, results=_results(state["results"]))


@dataclass
class EvalJob:
    """Score the broadcast model on each client's local test split."""

    method: ClassVar[str] = "evaluate_clients"
    tier: str
    broadcast: Broadcast
    round: int
    clients: list[int]


@dataclass
class EvalBatch:
    """Scores of an :class:`EvalJob`'s clients."""

    scores: dict[int, EvalResult]


@dataclass
class GlobalEvalJob:
    """Score the broadcast model on the global test set."""

    method: ClassVar[str] = "evaluate_global"
    tier: str
    broadcast: Broadcast


@dataclass
class GlobalScore:
    """The global-test score of the broadcast named ``key``."""

    key: str
    result: EvalResult


@dataclass
class RootJob:
    """Train the server's own update of ``round`` from ``broadcast`` on its root dataset of
    ``samples`` samples (a rule that needs one: FLTrust)."""

    method: ClassVar[str] = "root_update"
    tier: str
    broadcast: Broadcast
    round: int
    samples: int


@dataclass
class RootUpdate:
    """The server's root-dataset update (float32, losslessly encoded)."""

    payload: Any


Job = TrainJob | EvalJob | GlobalEvalJob | RootJob


@dataclass
class DeadJob:
    """A job whose executor died while running it (yielded by ``run(requeue_dead=False)``):
    the executor was replaced, the job is the caller's to retry or to give up on."""

    job: Job
    executor: str
    reason: str = "died"


class RoundFailedError(RuntimeError):
    """A round had fewer accepted uploads than ``runtime.min_accepted``: the global model was
    not updated and the run stops (its metrics up to and including this round are logged;
    ``--resume`` re-runs the round)."""

    def __init__(self, round: int, accepted: int, needed: int,
                 failures: list[tuple[int, str, str | None]]):
        self.round, self.accepted, self.needed, self.failures = round, accepted, needed, failures
        shown = "; ".join(f"client {c} {status}: {err}" for c, status, err in failures[:3])
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"round {round}: {accepted} accepted uploads, runtime.min_accepted "
                         f"is {needed}; {shown}{more}")

    def __reduce__(self):  # survives pickling (raised inside the driver actor)
        return RoundFailedError, (self.round, self.accepted, self.needed, self.failures)
