"""The small interfaces every method implements, and the typed contracts the runtime uses.

A method (:class:`Algorithm`) bundles

- the client procedure, :meth:`Algorithm.client_update` — one virtual client's local work
  for one round, ``(broadcast, client) -> ClientOutput``;
- the server side, an :class:`AggregationPolicy` —
  ``aggregate(global_state, results, round) -> (new_state, metrics)`` plus checkpointable
  state (pure numpy: no torch, no Ray);
- what is resident on an executor (the model, built once and reused for every client);
- optional hooks, class methods with do-nothing defaults, that let a method plug into the
  generic layers without those layers naming it: :meth:`Algorithm.build_data`,
  :meth:`Algorithm.sweep_preset`, :meth:`Algorithm.summarize`,
  :meth:`Algorithm.report_sections` (and a ``continual``-style config section or a CLI
  sub-command through :mod:`fedray.core.registry`).

The runtime moves broadcasts and uploads as :class:`fedray.wire.payload.Payload` and never looks
inside them; the method never sees an actor, an object ref or a resource. What crosses
between them is typed: :class:`ClientResult` (with its :class:`Status` and the client-state
version it wrote), :class:`EvalResult`, :class:`ClientData`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from fedray.core.registry import CAPABILITIES, require

State = dict[str, np.ndarray]

# one help per shared key: a key several methods have means one thing (its default may differ)
BASE_HELP = ("the pretrained starting point: a `fedray pretrain` output of the configured model "
             "(FedAvg family, FLITE; a frozen head stays frozen and is not uploaded) or a "
             "causal LM hub id or directory (FAVoR)")
WEIGHTED_HELP = "weight clients by their sample count (else uniformly)"

__all__ = ["BASE_HELP", "ROW_BLOCK_BYTES", "SIDE_BY_SIDE", "TERM_BLOCK", "WEIGHTED_HELP",
           "AggregationPolicy", "Algorithm", "AsyncUpdate", "ClientContext", "ClientData",
           "ClientOutput", "ClientResult", "ClientSampler", "CohortFit", "CohortRule", "Draw",
           "EvalResult",
           "ReportSection", "StackRow", "State", "Status", "accumulate", "accumulate_rows",
           "add_weighted", "check_reduce", "cohort_size", "finite", "finite_rows", "require",
           "stack_runs", "stack_slice"]


def finite(tensors: Mapping[str, np.ndarray]) -> bool:
    """Every float tensor of a decoded upload is free of NaN and Inf. A finite sum settles
    it (any NaN or Inf makes the sum NaN or Inf); only a non-finite one, which an overflow
    of finite values can also give, is checked element by element."""
    with np.errstate(over="ignore", invalid="ignore"):
        return all(np.isfinite(v.sum()) or np.isfinite(v).all()
                   for v in map(np.asarray, tensors.values()) if v.dtype.kind == "f")


def finite_rows(stacked: Mapping[str, np.ndarray], k: int) -> np.ndarray:
    """:func:`finite` for each of ``k`` uploads stacked along the first axis (one bool per
    row), checked on the stack at once."""
    clean = np.ones(k, dtype=bool)
    for v in stacked.values():
        if v.dtype.kind == "f":
            clean &= np.isfinite(v.reshape(k, -1)).all(axis=1)
    return clean


def accumulate(acc: dict[str, np.ndarray], tensors: Mapping[str, np.ndarray],
               weight: float) -> None:
    """``acc += weight * tensors`` in float64, tensor by tensor (a missing key starts at 0):
    the one step of every weighted sum a linear rule's executors reduce
    (capability ``linear``), so the executors and any reference loop add the
    same bits in the same order. All or nothing: a tensor whose shape differs from the sum's
    raises before anything is added."""
    values = {name: np.asarray(value) for name, value in tensors.items()}
    for name, value in values.items():
        if name in acc and acc[name].shape != value.shape:
            raise ValueError(f"upload tensor {name!r} has shape {value.shape}, the sum "
                             f"{acc[name].shape}")
        if value.dtype.kind not in "biuf":  # not a number: fails here, before any addition
            np.multiply(value, weight, dtype=np.float64)
    for name, value in values.items():
        if isinstance(acc.get(name), np.ndarray):
            add_weighted(acc[name], value, weight)
        elif name in acc:  # a numpy scalar (the sum of 0-d terms): not added in place
            acc[name] += np.multiply(value, weight, dtype=np.float64)
        else:
            acc[name] = np.multiply(value, weight, dtype=np.float64)


TERM_BLOCK = 1 << 16  # float64 terms add_weighted forms at once (512 KB: stays in cache)


def add_weighted(acc: np.ndarray, value: np.ndarray, weight: float) -> None:
    """``acc += float64(value) · weight`` in place (``acc`` an array): the one addition of a
    term to a float64 sum. A large tensor's term is formed and added in blocks of
    :data:`TERM_BLOCK` numbers through a scratch buffer: each element gets the same product
    and the same sum (the same bits) as forming the whole term first, without writing and
    re-reading a term as large as the sum (an upload of LEAF's FEMNIST CNN, 6.6M numbers:
    12.3 → 6.9 ms here, ``benchmarks/reduce_cost.py``). A value of another shape or layout,
    one that overlaps ``acc`` or a weight that is not a scalar takes the whole-term path,
    as before."""
    value = np.asarray(value)
    if (acc.size <= TERM_BLOCK or value.shape != acc.shape or np.ndim(weight)
            or not value.flags.c_contiguous or not acc.flags.c_contiguous
            or np.may_share_memory(acc, value)):
        acc += np.multiply(value, weight, dtype=np.float64)
        return
    flat, src = acc.reshape(-1), value.reshape(-1)
    scratch = np.empty(TERM_BLOCK)
    for start in range(0, flat.size, TERM_BLOCK):
        term = scratch[:min(TERM_BLOCK, flat.size - start)]
        np.multiply(src[start:start + TERM_BLOCK], weight, out=term, dtype=np.float64)
        flat[start:start + TERM_BLOCK] += term


ROW_BLOCK_BYTES = 1 << 18  # float64 terms formed at once by accumulate_rows
SIDE_BY_SIDE = 1 << 14  # ... for uploads of at most this many numbers (above: memory-bound)


def accumulate_rows(acc: dict[str, np.ndarray], stacked: Mapping[str, np.ndarray],
                    weights: Sequence[float], block_bytes: int = ROW_BLOCK_BYTES) -> None:
    """``accumulate(acc, {name: v[i] for name, v in stacked.items()}, weights[i])`` for
    every row ``i`` of uploads stacked along the first axis, in row order, with the same
    bits: each row's weighted term is the same float64 product, added to the sum with the
    same one addition, row after row (a missing tensor starts at its first term). The
    tensors are laid side by side, so that a row costs one addition over all of them
    instead of a few small operations per tensor, which is what a cohort of small models
    spends its reduction on; the terms are formed in blocks of at most ``block_bytes``.
    Uploads of more than :data:`SIDE_BY_SIDE` numbers are memory-bound either way, and
    laying them side by side did not pay: they are added row by row with
    :func:`accumulate`. All or nothing, as :func:`accumulate`."""
    k = len(weights)
    for name, v in stacked.items():
        if len(v) != k:
            raise ValueError(f"upload tensor {name!r} has {len(v)} rows for {k} weights")
        if name in acc and acc[name].shape != v.shape[1:]:
            raise ValueError(f"upload tensor {name!r} has shape {v.shape[1:]}, the sum "
                             f"{acc[name].shape}")
    if not k or not stacked:
        return
    spans, end = {}, 0
    for name, v in stacked.items():
        spans[name] = slice(end, end + math.prod(v.shape[1:]))
        end = spans[name].stop
    if end > SIDE_BY_SIDE:
        for i, w in enumerate(weights):
            accumulate(acc, {name: v[i] for name, v in stacked.items()}, w)
        return
    fresh = {n for n in stacked if n not in acc}
    total = np.zeros(end)
    for name, span in spans.items():
        if name in acc:
            total[span] = acc[name].reshape(-1)
    w = np.asarray(weights, dtype=np.float64)[:, None]
    step = max(1, block_bytes // (8 * max(end, 1)))
    for first in range(0, k, step):
        last = min(k, first + step)
        terms = np.empty((last - first, end))
        for name, span in spans.items():
            np.multiply(stacked[name][first:last].reshape(last - first, -1), w[first:last],
                        out=terms[:, span])
        for row in terms:
            if fresh:
                for name, span in spans.items():
                    if name in fresh:
                        total[span] = row[span]
                    else:
                        total[span] += row[span]
                fresh = set()
            else:
                total += row
    for name, span in spans.items():
        acc[name] = total[span].reshape(stacked[name].shape[1:]).copy()


class StackRow(Mapping):
    """Row ``row`` of uploads stacked along their first axis (``stack``: name → array),
    read as that client's own upload (each tensor a view, made when read). A sum over
    consecutive rows of one stack (FedAvg's ``weighted_mean``) can add them as the
    stack's slice (:func:`accumulate_rows`) instead of client by client."""

    __slots__ = ("row", "stack")

    def __init__(self, stack: Mapping[str, np.ndarray], row: int):
        self.stack, self.row = stack, row

    def __getitem__(self, name: str) -> np.ndarray:
        return self.stack[name][self.row]

    def __iter__(self) -> Iterator[str]:
        return iter(self.stack)

    def __len__(self) -> int:
        return len(self.stack)


def stack_runs(uploads: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``uploads`` cut into maximal runs [i, j) of consecutive rows of one stack
    (:class:`StackRow`); any other upload is a run of its own."""
    runs, i = [], 0
    while i < len(uploads):
        j, first = i + 1, uploads[i]
        if isinstance(first, StackRow):
            while j < len(uploads) and isinstance(uploads[j], StackRow) and \
                    uploads[j].stack is first.stack and uploads[j].row == first.row + j - i:
                j += 1
        runs.append((i, j))
        i = j
    return runs


def stack_slice(uploads: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    """The uploads as one stack without copying, where they are consecutive rows of one
    stack (:class:`StackRow`): that stack's slice, a view. None otherwise."""
    if not uploads or not isinstance(uploads[0], StackRow) or \
            stack_runs(uploads) != [(0, len(uploads))]:
        return None
    first = uploads[0]
    return {k: v[first.row:first.row + len(uploads)] for k, v in first.stack.items()}


class Status(str, enum.Enum):
    """What became of one client's upload in a round (stored as its string value)."""

    OK = "ok"
    ERROR = "error"  # its update raised (or its executor died)
    REJECTED = "rejected"  # it uploaded NaN or Inf
    DROPPED = "dropped"  # it dropped out mid-round or went offline (fleet): no upload
    LATE = "late"  # it missed the round deadline (fleet.deadline_s)
    SURPLUS = "surplus"  # over-committed: the round closed on K faster reports

    def __str__(self) -> str:
        return self.value


_OK = Status.OK  # a module constant: an Enum member's lookup costs 0.1 µs, per client


@runtime_checkable
class ClientData(Protocol):
    """The federated data an executor holds: one client's arrays on demand.

    ``client_extra`` is per-client side data a method may use (FAVoR's style target);
    ``None`` when there is none. ``summary()`` is plain JSON (stored as ``data.json``).
    Optionally ``read_ahead(cids)``: the clients an executor is about to read, in order,
    so that the data can prepare them together (the synthetic population seeds their
    generators in one pass); what it returns must not change."""

    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    x_test: np.ndarray
    y_test: np.ndarray

    def client_arrays(self, cid: int, round: int, split: str = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Client ``cid``'s (inputs, labels) of ``split`` (``train`` or ``test``) as seen
        in ``round`` (a drifting or continual dataset may change by round); the same
        arrays for the same arguments, on any executor."""
        ...

    def client_extra(self, cid: int, round: int) -> dict[str, Any] | None:
        """What else a method needs of client ``cid`` (FAVoR's author texts, a task id),
        or None."""
        ...

    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the data (sizes, partition, fingerprint): stored as
        ``data.json``; a resume on other data is refused by comparing it."""
        ...


@dataclass
class ClientContext:
    """Everything one virtual client's update may use."""

    client_id: int
    round: int
    seed: int
    tier: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    resident: Any
    device: str = "cpu"
    state: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None  # ClientData.client_extra


@dataclass
class ClientOutput:
    """What a client update returns: the upload, its weight, its metrics and (for methods
    with client state) the state to keep until its next round."""

    upload: Mapping[str, np.ndarray]
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] | None = None


@dataclass
class ClientResult:
    """A client's upload as the server receives it, in encoded form. ``state_version`` is
    the round whose client state the executor wrote for it (``None``: none written)."""

    client_id: int
    round: int
    status: Status
    num_samples: int = 0
    payload: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    upload_bytes: int = 0
    seconds: float = 0.0
    executor: str = ""
    state_version: int | None = None
    state_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status is _OK


@dataclass
class EvalResult:
    """Loss and accuracy of a model on ``n`` samples; ``extra`` holds a method's further
    scores (e.g. per-task accuracies), ``finetuned`` the scores after local fine-tuning
    (``eval.finetune_epochs``)."""

    loss: float
    accuracy: float
    n: float
    extra: dict[str, float] = field(default_factory=dict)
    finetuned: EvalResult | None = None

    @classmethod
    def of(cls, scores: Mapping[str, float]) -> EvalResult:
        """From a method's ``{"loss", "accuracy", "n", ...}`` mapping."""
        rest = {k: float(v) for k, v in scores.items() if k not in ("loss", "accuracy", "n")}
        return cls(float(scores.get("loss", math.nan)), float(scores.get("accuracy", math.nan)),
                   float(scores.get("n", 0.0)), rest)


@dataclass
class Draw:
    """Who takes part in one synchronous round. ``clients``: sorted client ids (a draw may
    over-commit: more than ``reports``); ``reports``: how many reports close the round (its
    K). An empty draw either waits (``wait``: nobody is online, the clock jumps to the next
    client who comes online) or passes as an idle round at once (an empty Poisson draw)."""

    clients: list[int]
    reports: int
    wait: bool = True


@runtime_checkable
class ClientSampler(Protocol):
    """The client-selection extension point: who takes part in round ``round`` at
    simulated time ``sim_time``. The runtime's samplers (uniform, Poisson, fleet-available,
    :mod:`fedray.runtime.sampler`) implement it; a method supplies its own through
    :meth:`Algorithm.make_sampler`. A draw must be a pure function of (seed, round,
    sim_time, its own state), so that it is the same whatever the executor count; its state
    is checkpointed with the round."""

    def draw(self, round: int, sim_time: float) -> Draw:
        """The clients of synchronous round ``round`` starting at simulated ``sim_time``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The sampler's own state (plain values and arrays), checkpointed each round."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (on resume)."""
        ...


@dataclass
class ReportSection:
    """A method's part of ``fedray report``: a key (its entry in the result's
    ``diagnostics``), a title, Markdown, plot paths and the numbers behind them."""

    key: str
    title: str
    markdown: str
    plots: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class AsyncUpdate:
    """One upload as an asynchronous rule sees it: ``staleness`` τ = server steps taken since
    the client downloaded ``base`` (the global state it started from)."""

    client_id: int
    num_samples: int
    upload: State
    staleness: int
    base: State


class AggregationPolicy:
    """Server-side state and the aggregation rule. Pure numpy; checkpointable.

    An asynchronous rule (FedBuff, FedAsync) sets ``buffer_size`` (uploads per server step)
    and ``concurrency`` (clients kept training) and implements :meth:`aggregate_async`; the
    runtime then drives it from an event queue in simulated time instead of rounds."""

    buffer_size: int | None = None
    concurrency: int = 0
    # the server optimizer the rule hands its pseudo-gradient to (None: the rule's own step);
    # it is its own part of the checkpoint
    optimizer: Any = None

    def broadcast(self, global_state: State, round: int, tier: str) -> State:
        """The tensors sent to the clients of ``tier`` in ``round`` (default: everything)."""
        return global_state

    def aggregate(self, global_state: State, updates: list[tuple[int, int, State]],
                  round: int) -> tuple[State, dict[str, float]]:
        """``updates`` holds ``(client_id, num_samples, decoded upload)`` in client-id order.

        The metrics are round-level scalars; an optional ``per_client`` entry
        ``{client_id: {name: value}}`` lands in that client's row of the metrics."""
        raise NotImplementedError

    @property
    def root_samples(self) -> int:
        """Samples of a server root dataset on which the rule needs the server's own update
        each round before it aggregates (FLTrust); 0: none. The runtime trains it like a
        client (client id -1) and hands it over with :meth:`set_reference`."""
        return 0

    def set_reference(self, update: State) -> None:
        """This round's server update on the root dataset (only when ``root_samples``)."""

    def weight(self, num_samples: int) -> float:
        """A linear rule's (capability ``linear``) w_i of a client that trained on
        ``num_samples`` samples."""
        raise NotImplementedError

    def aggregate_sum(self, global_state: State, total: State, weight: float, round: int
                      ) -> tuple[State, dict[str, float]]:
        """A linear rule's step from ``total`` = Σ_i w_i Δ_i (float64, reduced on the
        executors with :func:`accumulate`) and ``weight`` = Σ_i w_i > 0."""
        raise NotImplementedError

    def aggregate_async(self, global_state: State, updates: list[AsyncUpdate], step: int
                        ) -> tuple[State, dict[str, float]]:
        """Apply ``buffer_size`` uploads, in the order they arrived in simulated time."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The rule's state across rounds (ORDERS' norm history, FedBuff's buffer),
        checkpointed each round; none by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (on resume)."""


def check_reduce(cfg: Any, method: Any) -> None:
    """``runtime.reduce=executors`` sums uploads where they are made, so nothing on the
    server may need a single upload: a linear synchronous rule, no update transforms, no
    central DP, no participation rule that picks reporters after the fact."""
    if cfg.runtime.reduce != "executors":
        return
    from fedray.core.spec import ConfigError

    require(method, "linear", "runtime.reduce", "executors")
    fl = cfg.fleet
    why = ("its asynchronous rule applies each buffer as it fills"
           if "asynchronous" in method.capabilities
           else "update transforms are decoded on the server" if method.transforms_of(cfg)
           else "central DP clips every upload on the server" if cfg.dp.enabled
           else "fleet.availability, fleet.deadline_s and fleet.overcommit pick the "
                "reporters after the round" if fl.availability or fl.deadline_s is not None
           or fl.overcommit else None)
    if why:
        raise ConfigError("runtime.reduce", "executors",
                          f"driver for {cfg.algorithm['name']} here: {why}")


AUTO_WORK = 1_000_000  # runtime.vectorize=auto: most multiply-adds in one client's local step
COHORT_FLOOR = 256  # runtime.cohort_size unset: at least this many clients a cohort ...
COHORT_SPLIT = 16  # ... and a tier's round in at most this many cohorts, where ...
COHORT_BYTES = 256 * 2**20  # ... a cohort past the floor holds at most this much state


@dataclass(frozen=True)
class CohortRule:
    """How a run cuts a tier's ``n`` clients of a round (one pass of it) into cohorts:
    :meth:`of` gives the most clients a cohort holds, and an executor call's clients are
    cut into ``⌈m / of(n)⌉`` near-equal runs (:func:`fedray.runtime.jobs.cohort_runs`),
    so no cohort is a short tail that pays a whole batched step for a few clients.

    ``size`` is ``runtime.cohort_size`` as set. Unset (None), the size follows the round:
    ``max(COHORT_FLOOR, ⌈n / COHORT_SPLIT⌉)`` clients, and past the floor only as far as
    ``cap`` allows (what :data:`COHORT_BYTES` holds of the method's per-client bytes,
    :attr:`CohortFit.client_bytes`; the floor where the method cannot say before it trains,
    as FAVoR): a big model keeps cohorts of 256, as before the rule. Why: a batched step
    has a fixed cost whatever its width (``train_cohort_stacked`` on the scale workload's
    MLP 32-32-10, one thread: 5.6 ms for 256 clients, 16.3 ms for 1,024), so 10,000
    clients a round in cohorts of 256 pay 40 fixed costs where 16 cohorts of 625 pay 16
    (``benchmarks/RESULTS.md``, "Cohorts sized by the round"); 16, not 8, keeps up to 16
    executor calls a round for ``runtime.reduce=driver``. A rule on the round's sample and
    the config alone, never on the executor count: results stay bitwise across executor
    counts and ``--resume``. Past the floor the size depends on the method's byte
    estimate, so a version that changes that estimate may cut such rounds differently."""

    size: int | None
    cap: int = COHORT_FLOOR

    def of(self, n: int) -> int:
        """The most clients in a cohort when a tier has ``n`` clients in the pass."""
        if self.size is not None:
            return self.size
        return min(max(COHORT_FLOOR, math.ceil(n / COHORT_SPLIT)),
                   max(COHORT_FLOOR, self.cap))


@dataclass(frozen=True)
class CohortFit:
    """What a config's local training asks of a cohort (:meth:`Algorithm.cohort_fit`):
    ``problems`` says why its clients cannot train as one batched computation (empty: they
    can), ``work`` the multiply-adds of one client's local step (trainable parameters ×
    batch size: the ``auto`` rule's input) and ``client_bytes`` what each client of a
    cohort adds to its executor's memory (its parameters, gradients, momentum and
    activations). ``pays`` is a method's own measured ``auto`` rule where the work rule
    does not fit its kind of step (None: ``work`` ≤ :data:`AUTO_WORK` decides)."""

    problems: list[str]
    work: float = 0.0
    client_bytes: int = 0
    pays: bool | None = None


def _owner(cls: type, name: str) -> type:
    return next(k for k in cls.__mro__ if name in k.__dict__)


def _cohort_refusal(cfg: Any, method: Any) -> str | None:
    """Why no config of this kind runs as cohorts, whatever the model (None: it may)."""
    if not issubclass(_owner(method, "cohort_update"), _owner(method, "client_update")):
        return (f"{method.__name__} overrides client_update but not cohort_update (a "
                f"cohort would skip its own client code)")
    if "asynchronous" in method.capabilities:
        return "its asynchronous rule dispatches one client per executor call"
    if cfg.local.dp_noise_multiplier is not None:
        return ("local DP-SGD (local.dp_noise_multiplier) clips per sample with Opacus, one "
                "client at a time")
    if cfg.local.bf16:
        return "local.bf16 autocasts one client's model at a time"
    return None


def cohort_size(cfg: Any, method: Any, input_shape: tuple[int, ...] | None,
                num_classes: int | None) -> CohortRule | None:
    """The run's cohorts (:class:`CohortRule`: ``runtime.cohort_size``, or sized by the
    round where it is unset), or None: its clients train one at a time.
    ``runtime.vectorize``: ``off`` never; ``on`` always, and a :class:`ConfigError` naming
    the reason where the method, the config or the model cannot (or where the largest
    cohort in every executor does not fit this machine's memory); ``auto`` where
    they can, the model is dense (linear layers and activations: batched convolutions and
    LSTM cells measured slower) and one client's local step is small — at most
    :data:`AUTO_WORK` multiply-adds (trainable parameters × ``local.batch_size``), the size
    below which batching measured faster than one client after another on a CPU
    (``benchmarks/cohorts.py``; ``benchmarks/RESULTS.md``, "Vectorized cohorts") — or
    where the method's own measured rule says so (:attr:`CohortFit.pays`; FLITE's, whose
    factor products a cohort shares: :meth:`fedray.methods.flite.method.Flite.cohort_fit`).
    The rule reads the config only, so every executor count and every resume decides alike.
    Without the input shape (a table read at run time) the method's fit decides what it
    can without it (the FedAvg family: nothing yet; the run checks again with the data's
    shape before Ray starts)."""
    from fedray.core.spec import ConfigError

    mode, size = cfg.runtime.vectorize, cfg.runtime.cohort_size
    if mode == "off":
        return None
    if mode == "on":
        require(method, "vectorizable", "runtime.vectorize", "on")
    elif "vectorizable" not in method.capabilities:
        return None
    why = _cohort_refusal(cfg, method)
    shape = None if input_shape is None else tuple(input_shape)
    fit = CohortFit([why]) if why else method.cohort_fit(cfg, shape, num_classes)
    rule = CohortRule(size, max(1, COHORT_BYTES // fit.client_bytes) if fit.client_bytes
                      else COHORT_FLOOR)
    if mode == "auto":
        pays = fit.work <= AUTO_WORK if fit.pays is None else fit.pays
        return rule if not fit.problems and pays else None
    if fit.problems:
        raise ConfigError("runtime.vectorize", "on",
                          f"off for {cfg.algorithm['name']}: {fit.problems[0]}")
    _check_cohort_memory(cfg, fit, rule)
    return rule


def _check_cohort_memory(cfg: Any, fit: CohortFit, rule: CohortRule) -> None:
    """On a local Ray, the largest cohort a round can hold (:meth:`CohortRule.of` the
    clients a round samples, all in one tier at worst) in every CPU executor at once must
    fit this machine's available memory (GPU memory is the device's, checked when it
    trains)."""
    from fedray.core.spec import ConfigError
    from fedray.data.memory import machine_memory, remote_ray
    from fedray.services.fleet import sampled_per_round

    rt = cfg.runtime
    have = machine_memory()
    if remote_ray(rt.ray_address) or have is None:
        return
    # executors that may train on the CPU: GPU tiers too unless the run insists on CUDA
    # (runtime.device=auto on a machine without a GPU runs them on the CPU)
    executors = sum(t.executors for t in rt.tiers if t.num_gpus == 0 or rt.device != "cuda")
    size = rule.of(sampled_per_round(cfg))
    need = fit.client_bytes * size * executors
    if need > have[0]:
        raise ConfigError("runtime.cohort_size", rt.cohort_size if rt.cohort_size is not None
                          else f"unset (cohorts of {size})",
                          f"at most {max(1, have[0] // max(fit.client_bytes * executors, 1))}"
                          f": {executors} executor(s) × {size} clients × "
                          f"{fit.client_bytes / 1e6:.1f} MB each need {need / 1e9:.1f} GB, "
                          f"this machine has {have[0] / 1e9:.1f} GB available")


def local_work(num_samples: np.ndarray, epochs: int, cap: int | None) -> np.ndarray:
    """Samples processed by ``epochs`` passes over each client's ``num_samples``, capped at
    ``cap`` samples (a step cap times the samples a step takes; None: no cap)."""
    seen = num_samples * epochs
    return np.minimum(seen, cap) if cap else seen


class Algorithm:
    """A federated method: typed parameters, a client update and an aggregation policy.

    ``capabilities`` (names of :data:`fedray.core.registry.CAPABILITIES`) say, once, which
    cross-cutting features the method takes; :meth:`check` refuses a config that asks for
    another, before any Ray work. ``server_optimizer`` is the server optimizer it runs by
    default (None: its rule makes its own step); with the ``server_optimizer`` capability
    ``server.optimizer`` picks any other, without it the optimizer is fixed (a preset such
    as FedAvgM)."""

    name: ClassVar[str]
    Params: ClassVar[type]
    capabilities: ClassVar[frozenset[str]] = frozenset()
    server_optimizer: ClassVar[str | None] = None
    # parameters renamed since an earlier version (old -> new): an error naming the new
    # key in a config, moved silently in a run's stored config.yaml (--resume)
    renamed_keys: ClassVar[dict[str, str]] = {}
    # ``local.*`` keys the method's client half does not read, each with what it uses
    # instead: :func:`fedray.core.config.check_unread` refuses any other value than the
    # key's default
    unread_local: ClassVar[dict[str, str]] = {}

    @classmethod
    def upgrade_config(cls, algorithm: dict[str, Any], server: dict[str, Any]) -> None:
        """Move what an earlier version kept in ``algorithm.*`` of a stored config to where
        it lives now (in place); default: nothing."""

    def __init__(self, cfg: Any, params: Any):
        self.cfg = cfg
        self.params = params

    @property
    def uses_client_state(self) -> bool:
        """Whether this run of the method keeps per-client state (a method with the
        ``client_state`` capability may decide from its parameters)."""
        return "client_state" in self.capabilities

    @classmethod
    def transforms_of(cls, cfg: Any) -> list:
        """The update transforms every upload passes through: ``payload.transforms`` (a
        method that compresses by construction adds its own stage)."""
        return list(cfg.payload.transforms or [])

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse, before any Ray work, a config that asks this method for something it
        cannot do (one :func:`require` per cross-cutting feature, then the reduce rule).
        A method adds its own rules by overriding this and calling ``super().check``."""
        if cfg.dp.enabled:
            require(cls, "dp", "dp.enabled", True)
        if cfg.local.dp_noise_multiplier is not None:
            require(cls, "dp_sgd", "local.dp_noise_multiplier", cfg.local.dp_noise_multiplier)
        if cfg.payload.transforms:
            require(cls, "transforms", "payload.transforms", cfg.payload.transforms)
        from fedray.core.config import check_unread

        for cap, key in (("before_after", "local_before_after"), ("finetune", "finetune_epochs")):
            if cap not in cls.capabilities:  # an evaluation the method's client half lacks
                check_unread(cfg.eval, "eval", {key: f"it lacks the {cap!r} capability: "
                                                     f"{CAPABILITIES[cap]}"}, cls.name)
        check_unread(cfg.local, "local", cls.unread_local, cls.name)
        check_reduce(cfg, cls)
        if cfg.runtime.vectorize != "off":
            cohort_size(cfg, cls, *cls.input_of(cfg))

    @classmethod
    def input_of(cls, cfg: Any) -> tuple[tuple[int, ...] | None, int | None]:
        """(input shape, class count) of the configured dataset where the config says them
        (None, None: a table read at run time, text)."""
        from fedray.core.config import dataset_shape
        from fedray.core.spec import ConfigError

        try:
            return dataset_shape(cfg.data)
        except ConfigError:
            return None, None

    @classmethod
    def cohort_fit(cls, cfg: Any, input_shape: tuple[int, ...] | None,
                   num_classes: int | None) -> CohortFit:
        """Whether this config's clients can train as cohorts (a method with the
        ``vectorizable`` capability says, from its model and local training; without the
        input shape, from what it can tell without it)."""
        return CohortFit([f"{cls.name} trains one client at a time"])

    def make_optimizer(self) -> Any:
        """The run's server optimizer (``cfg.server``, resolved by the config), for a
        method whose rule hands it the pseudo-gradient."""
        from fedray.services.server_opt import make_optimizer

        return make_optimizer(self.cfg.server)

    # ------------------------------------------------------------------ client half

    def build_resident(self, input_shape: tuple[int, ...], num_classes: int, device: str) -> Any:
        """Heavy objects an executor keeps for all its clients (default: the model)."""
        raise NotImplementedError

    def init_global_state(self, resident: Any, seed: int) -> State:
        """The global state of round 0 (``{name: array}``), from :meth:`build_resident`'s
        objects and ``seed`` alone: computed once, by the first executor, and broadcast."""
        raise NotImplementedError

    def state_schema(self, input_shape: tuple[int, ...], num_classes: int
                     ) -> dict[str, tuple[tuple[int, ...], str]] | None:
        """``{entry: (shape, dtype)}`` of the global state this config starts from, which a
        checkpoint must match before a resume starts Ray. Built here on the CPU from the
        method's own resident and start state; None where that would cost more than a
        check should (a language model), and the driver's own load then decides."""
        state = self.init_global_state(self.build_resident(input_shape, num_classes, "cpu"),
                                       0)
        return {k: (tuple(np.shape(v)), np.asarray(v).dtype.str) for k, v in state.items()}

    def base_bytes(self) -> int:
        """Bytes every client downloads once, at its first round (a pretrained base)."""
        return 0

    def client_update(self, ctx: ClientContext, broadcast: State) -> ClientOutput:
        """One client's local work of one round from the decoded ``broadcast``: its upload,
        metrics and new client state (:class:`ClientOutput`). Must be a pure function of
        ``ctx`` (seed, round, client, data, stored state) and ``broadcast``, so a client's
        result is the same on any executor, in any order."""
        raise NotImplementedError

    def cohort_update(self, contexts: list[ClientContext], broadcast: State
                      ) -> list[ClientOutput]:
        """The updates of a cohort of clients of one tier, trained from one broadcast as one
        batched computation (capability ``vectorizable``): one :class:`ClientOutput` per
        context, in order, each equal to :meth:`client_update`'s for that client up to
        float32 rounding. The runtime hands a method its cohorts only where
        :func:`cohort_size` says so; a cohort that raises is re-run client by client."""
        raise NotImplementedError

    def evaluate(self, resident: Any, broadcast: State, x: np.ndarray, y: np.ndarray,
                 device: str = "cpu") -> dict[str, float]:
        """Loss/accuracy of the broadcast model on (x, y); keys ``loss``, ``accuracy``, ``n``
        and any further scores."""
        raise NotImplementedError

    def finetune_evaluate(self, ctx: ClientContext, broadcast: State, epochs: int
                          ) -> dict[str, float]:
        """Personalized accuracy after ``epochs`` of local fine-tuning of the broadcast model
        on the client's train split (nothing is uploaded or kept)."""
        raise NotImplementedError

    def samples_seen(self, num_samples: np.ndarray) -> np.ndarray:
        """Samples each client's local training processes, for the fleet clock's compute time
        (from an int64 array of the clients' sample counts): ``local.epochs`` over its data,
        capped by ``local.max_steps`` batches of ``local.batch_size``. A method that trains
        by its own schedule says so here."""
        loc = self.cfg.local
        return local_work(num_samples, loc.epochs,
                          loc.max_steps * loc.batch_size if loc.max_steps else None)

    def compute_cost(self, tier: Any) -> float:
        """Training FLOPs per sample of a client of ``tier`` relative to the full model: the
        fleet clock's ``cost`` (:mod:`fedray.services.fleet`). 1 unless the method trains
        sub-models."""
        return 1.0

    def to_delta(self, global_state: State, upload: State) -> State:
        """The update central DP clips, from a decoded upload (default: the upload's tensors
        named in the global state — the FedAvg family uploads Δ itself; anything else, such
        as a client's own norm, is dropped)."""
        return {k: v for k, v in upload.items() if k in global_state}

    @classmethod
    def dp_cohort(cls, cfg: Any) -> tuple[int, int]:
        """(population, reports per release) for central DP's accountant and denominator:
        by default K of the N clients, sampled uniformly each round (asynchronous rules
        override it)."""
        return cfg.clients.num_clients, cfg.clients.sampled_count()

    def from_delta(self, global_state: State, delta: State) -> State:
        """An upload standing for the (privatized) update ``delta`` (inverse of
        :meth:`to_delta`)."""
        return delta

    def upgrade_state(self, state: Any) -> Any:
        """A client state as this version stores it, from one an older version wrote (a run
        continued across versions); default: as it is."""
        return state

    def update_chain(self) -> Any:
        """The :class:`fedray.wire.transforms.TransformChain` every upload passes through: the
        configured ``payload.transforms`` (methods that compress by construction prepend
        their own stage)."""
        from fedray.wire.transforms import TransformChain, parse_transforms

        p = self.cfg.payload
        return TransformChain(parse_transforms(p.transforms), p.error_feedback)

    # ------------------------------------------------------------------ server half

    def make_policy(self) -> AggregationPolicy:
        """The server half: the :class:`AggregationPolicy` that weighs the uploads and turns
        their sum into the next global state (the server optimizer applies its step)."""
        raise NotImplementedError

    def make_sampler(self, default: ClientSampler, fleet: Any) -> ClientSampler:
        """Who takes part in each synchronous round (client selection): by default the
        runtime's ``default`` (uniform, Poisson with central DP, or among the clients the
        ``fleet`` has online). Override to select clients another way."""
        return default

    # ------------------------------------------------------------------ hooks

    @classmethod
    def build_data(cls, cfg: Any, dataset: Any = None) -> ClientData:
        """The experiment's client data (default: the configured dataset split among the
        clients, or a population drawn on demand or read by natural id,
        :func:`fedray.data.population.build_client_data`)."""
        from fedray.data.population import build_client_data

        return build_client_data(cfg, dataset)

    @classmethod
    def check_data(cls, cfg: Any, data: ClientData) -> None:
        """Refuse, before Ray starts, a config that this run's data makes dishonest (e.g. a
        pretrained base that has seen the run's test samples); default: nothing."""

    @classmethod
    def sweep_preset(cls, cfg: Any) -> dict[str, dict]:
        """The search space ``fedray tune --preset`` uses for this method (default none)."""
        return {}

    @classmethod
    def summarize(cls, cfg: Any, run_dir: str) -> dict[str, Any]:
        """Method-specific entries merged into ``summary.json`` when a run closes."""
        return {}

    @classmethod
    def report_sections(cls, run: dict[str, Any], out_dir: str) -> list[ReportSection]:
        """This method's diagnostics in ``fedray report`` (``run`` holds ``run_dir``,
        ``label``, ``config``, ``rounds`` and ``clients`` tables)."""
        return []
