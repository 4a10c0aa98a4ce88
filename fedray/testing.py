"""What a method's own tests call: run a registered method (fedray's or a plugin's) for a
few rounds in this process, through its own client hooks and server policy exactly as an
executor and the driver call them, one client at a time or as vectorized cohorts — to hold
it to a plain-PyTorch reference of your own, in both engine modes.

    from fedray.testing import local_rounds, relative_gap

    run = local_rounds("feddyn", clients, rounds=3, input_shape=(6,), num_classes=3,
                       cohort=True, overrides={"algorithm.alpha": 0.1})
    assert relative_gap(run.final, my_reference(run.model, run.start)) < 1e-6

That needs no Ray. The conformance suite that fedray runs on every registered method is
here too, for a plugin's own tests to run on its method: :func:`check_capabilities`
(before any Ray work) and :func:`check_resume` (on a local Ray: two executors against one
cut and resumed, bit for bit; the bytes add up; the stored config round-trips), each
failing with one line that names the part and key that differ (:func:`difference`)::

    from fedray.testing import check_capabilities, check_resume

    check_capabilities("mymethod", ["model.hidden=[16]"])
    check_resume("mymethod", ["model.hidden=[16]"], str(tmp_path))  # inside ray.init()
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.methods.base import ClientContext, State

__all__ = ["NEEDS", "TINY", "ConformanceError", "Rounds", "check_capabilities", "check_resume",
           "conformance_config", "difference", "local_rounds", "relative_gap"]


@dataclass
class Rounds:
    """:func:`local_rounds`' result: the resident model, θ₀, θ after the last round, each
    round's server metrics and the clients' states after the last round."""

    model: Any
    start: State
    final: State
    metrics: list[dict[str, Any]] = field(default_factory=list)
    states: dict[int, Any] = field(default_factory=dict)


def local_rounds(algorithm: str, clients: Mapping[int, tuple[np.ndarray, np.ndarray]], *,
                 rounds: int, input_shape: tuple[int, ...], num_classes: int,
                 cohort: bool = False, seed: int = 0,
                 overrides: Mapping[str, Any] | None = None) -> Rounds:
    """``rounds`` rounds of ``algorithm`` in which every client of ``clients``
    ({client id: (x, y)}, any sizes, empty included) takes part in client-id order: the
    policy's broadcast to its ``client_update`` (or, with ``cohort``, one
    ``cohort_update`` of all of them), the uploads handed to its policy's ``aggregate``,
    each client's state carried to its next round. ``overrides`` are config keys
    (``{"algorithm.alpha": 0.1, "local.lr": 0.05}``)."""
    from fedray.core import registry
    from fedray.core.config import load_config
    from fedray.core.registry import make_method

    keys = {"algorithm.name": algorithm, "seed": seed, "clients.num_clients": len(clients),
            **(overrides or {})}
    cfg = load_config(None, [f"{k}={v}" for k, v in keys.items()])
    method = make_method(registry.method(algorithm), cfg)
    model = method.build_resident(tuple(input_shape), num_classes, "cpu")
    theta = start = method.init_global_state(model, seed)
    policy, states, metrics = method.make_policy(), {}, []
    for t in range(1, rounds + 1):
        ctxs = [ClientContext(c, t, seed, "default", x, y, x[:0], y[:0], model,
                              state=states.get(c)) for c, (x, y) in sorted(clients.items())]
        sent = policy.broadcast(theta, t, "default")
        outs = method.cohort_update(ctxs, sent) if cohort else \
            [method.client_update(ctx, sent) for ctx in ctxs]
        updates = []
        for ctx, out in zip(ctxs, outs, strict=True):
            states[ctx.client_id] = out.state
            updates.append((ctx.client_id, out.num_samples,
                            {k: np.array(v) for k, v in out.upload.items()}))
        theta, round_metrics = policy.aggregate(theta, updates, t)
        metrics.append(round_metrics)
    return Rounds(model, start, theta, metrics, states)


def relative_gap(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """The largest absolute difference over every tensor of ``want``, relative to its
    largest entry (a missing tensor raises ``KeyError``)."""
    scale = max(float(np.abs(v).max()) for v in want.values())
    return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max())
               for k in want) / scale


# ------------------------------------------------------------------ the conformance suite

TINY = ["rounds=2", "seed=5", "clients.num_clients=4", "clients.fraction=1.0",
        "local.batch_size=16", "local.epochs=1", "local.max_steps=3", "eval.every=2",
        "eval.clients=sampled", "runtime.keep_warm=true", "runtime.placement_timeout_s=300"]
"""The conformance runs' base: 2 rounds of 4 clients, at most 3 local steps each."""

NEEDS = {
    "dp": ("dp.enabled", ["dp.enabled=true", "dp.noise_multiplier=1.0"]),
    "dp_sgd": ("local.dp_noise_multiplier", ["local.dp_noise_multiplier=1.0"]),
    "transforms": ("payload.transforms", ["payload.transforms=[int8]"]),
    "linear": ("runtime.reduce", ["runtime.reduce=executors"]),
    "server_optimizer": ("server.optimizer", ["server.optimizer={other}"]),
    "continual": ("continual.tasks", ["continual.tasks=2", "continual.rounds_per_task=2",
                                      "continual.class_order=[0,1,2,3,4,5,6,7,8,9]"]),
    "robust": ("robust.rule", ["robust.rule=median"]),
    "attack": ("adversary.attack", ["adversary.attack=sign_flip", "adversary.clients=[0]"]),
}
"""capability → (the key that needs it, a setting of it)."""


class ConformanceError(AssertionError):
    """One line naming the method, what broke and where (a part and key, not a dump)."""


def difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two nested states (dicts, lists, arrays, numbers) first differ — a dotted path
    with what differs there — or None when they are equal bit for bit (NaN equal to
    NaN)."""
    where = path or "<root>"
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            return f"{where}: a mapping against {type(b if isinstance(a, Mapping) else a).__name__}"
        if set(a) != set(b):
            return f"{where}: keys {sorted(set(a) ^ set(b), key=str)[:3]} on one side only"
        for k in sorted(a, key=str):
            found = difference(a[k], b[k], f"{path}.{k}" if path else str(k))
            if found is not None:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{where}: {x.dtype}{list(x.shape)} against {y.dtype}{list(y.shape)}"
        if x.dtype.kind == "f":
            same = (x == y) | (np.isnan(x) & np.isnan(y))
        else:
            same = x == y
        if same.all():
            return None
        first = tuple(int(i) for i in np.argwhere(~same)[0])
        return f"{where}{list(first)}: {str(x[first])} against {str(y[first])}"
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else f"{where}: {a!r} against {b!r}"


def conformance_config(name: str, overrides: Sequence[str] = (), executors: int = 2
                       ) -> list[str]:
    """``name``'s conformance config: :data:`TINY` (less the ``local.*`` keys it does not
    read) + ``overrides`` (its smallest config) + one tier of ``executors`` executors (one
    per capacity tier beside them for a continual method)."""
    from fedray.core import registry

    cls = registry.method(name)
    tiny = [o for o in TINY if o.split("=")[0].removeprefix("local.") not in cls.unread_local]
    if "continual" in cls.capabilities:
        tier = (f"runtime.tiers=[{{name: t100, executors: {executors}, num_cpus: 0.25, "
                "capacity: 1.0}, {name: t025, executors: 1, num_cpus: 0.25, capacity: 0.251}]")
    else:
        tier = f"runtime.tiers=[{{name: default, executors: {executors}, num_cpus: 0.5}}]"
    return [*tiny, *overrides, tier, f"algorithm.name={name}"]


def check_capabilities(name: str, overrides: Sequence[str] = ()) -> None:
    """Each setting that needs a capability ``name`` lacks is refused when the config loads
    (one line naming the setting and the method); each one it has is taken; its policy is
    asynchronous exactly when it says so and has a server optimizer exactly when it names
    one. Raises :class:`ConformanceError`."""
    from fedray.core import registry
    from fedray.core.config import load_config
    from fedray.core.registry import make_method
    from fedray.core.spec import ConfigError

    cls = registry.method(name)
    other = "yogi" if cls.server_optimizer != "yogi" else "adam"  # not the method's own
    for cap, (key, settings) in NEEDS.items():
        extra = [o.format(other=other) for o in settings]
        try:
            load_config(None, conformance_config(name, [*overrides, *extra]))
        except ConfigError as e:  # a preset's fixed optimizer is refused as fixed
            refused = e.path == key and ("lacks the" in str(e) or "is fixed" in str(e))
            if refused and cap in cls.capabilities or not refused and cap not in \
                    cls.capabilities:
                raise ConformanceError(f"{name}: {key} ({cap!r}) refused as {str(e)!r}, "
                                       f"capability declared: {cap in cls.capabilities}") \
                    from None
            if refused and (name not in str(e) or len(str(e).splitlines()) != 1):
                raise ConformanceError(f"{name}: the refusal of {key} is not one line "
                                       f"naming the method: {str(e)!r}") from None
        else:
            if cap not in cls.capabilities:
                raise ConformanceError(f"{name} took {key} without the {cap!r} capability")
    policy = make_method(cls, load_config(None, conformance_config(name, overrides))
                         ).make_policy()
    if (policy.buffer_size is not None) != ("asynchronous" in cls.capabilities):
        raise ConformanceError(f"{name}: its policy's buffer_size is {policy.buffer_size} "
                               f"but 'asynchronous' declared: "
                               f"{'asynchronous' in cls.capabilities}")
    if (policy.optimizer is not None) != (cls.server_optimizer is not None):
        raise ConformanceError(f"{name}: its policy's optimizer is {policy.optimizer!r} but "
                               f"server_optimizer is {cls.server_optimizer!r}")


PARTS = ("server", "policy", "ledger", "clients", "loop", "optimizer")
"""The checkpoint parts that must match bit for bit."""


def _rows(run_dir: str, kind: str) -> list[dict]:
    from fedray.observe.metrics import read_metrics

    return [{k: v for k, v in r.items() if k not in ("seconds", "executor")}
            for r in read_metrics(run_dir, kind).to_pylist()]


def check_resume(name: str, overrides: Sequence[str], work_dir: str) -> dict[str, Any]:
    """On the local Ray this process started: a run of ``name`` on two executors and a run
    on one executor stopped after round 1 and resumed end bit for bit equal — every
    checkpoint part of :data:`PARTS`, the rounds and clients tables (less wall-clock
    columns) — its bytes add up (each round's are its clients', the running totals and the
    summary theirs) and its stored config loads back to itself. Runs go under
    ``work_dir``; returns the uninterrupted run's summary. Raises
    :class:`ConformanceError` naming the part and key that differ."""
    import yaml

    from fedray.core import checkpoint, registry
    from fedray.core.config import load_config
    from fedray.core.storage import Storage
    from fedray.runtime import Experiment, run_experiment

    full_dir, cut_dir = os.path.join(work_dir, "full"), os.path.join(work_dir, "cut")
    two = load_config(None, conformance_config(name, overrides, 2))
    one = load_config(None, conformance_config(name, overrides, 1))
    full = run_experiment(two, full_dir, progress=False)
    exp = Experiment(one, cut_dir)
    try:
        exp.start()
        exp.step()
    finally:
        exp.release()
    resumed = run_experiment(one, cut_dir, resume=True, progress=False)
    if not full["rounds"] == resumed["rounds"] == two.rounds or \
            resumed["rounds_this_session"] != two.rounds - 1:
        raise ConformanceError(f"{name}: rounds {full['rounds']} straight, "
                               f"{resumed['rounds']} resumed "
                               f"({resumed['rounds_this_session']} after the resume)")
    a, b = checkpoint.read(Storage(full_dir)), checkpoint.read(Storage(cut_dir))
    for part in PARTS:
        found = difference(a.get(part), b.get(part), part)
        if found is not None:
            raise ConformanceError(f"{name}: two executors against one cut and resumed, "
                                   f"checkpoint part {found}")
    if not all(np.isfinite(v).all() for v in a["server"]["params"].values()):
        raise ConformanceError(f"{name}: the final global state is not finite")
    for kind in ("rounds", "clients"):
        found = difference(_rows(full_dir, kind), _rows(cut_dir, kind), kind)
        if found is not None:
            raise ConformanceError(f"{name}: two executors against one cut and resumed, "
                                   f"{kind}.parquet row {found}")
    check_bytes(full_dir, full, "asynchronous" in registry.method(name).capabilities)
    with open(os.path.join(full_dir, "config.yaml"), encoding="utf-8") as f:
        stored = yaml.safe_load(f)
    found = difference(load_config(None, base=stored).to_dict(), stored, "config")
    if found is not None:
        raise ConformanceError(f"{name}: the stored config.yaml does not load back to "
                               f"itself: {found}")
    return full


def check_bytes(run_dir: str, summary: dict[str, Any], asynchronous: bool) -> None:
    """Rows sum to rounds, rounds to the running totals, the totals to the summary. An
    asynchronous rule charges a download when its client is dispatched, so the running
    download total also holds the clients still in flight (at least the rows' sum)."""
    rounds, clients = _rows(run_dir, "rounds"), _rows(run_dir, "clients")
    up = down = 0
    for r in rounds:
        mine = [c for c in clients if c["round"] == r["round"] and c["sampled"]]
        for way in ("upload", "download"):
            if r[f"{way}_bytes"] != sum(c[f"{way}_bytes"] for c in mine):
                raise ConformanceError(f"round {r['round']}: {way}_bytes {r[f'{way}_bytes']} "
                                       f"is not its clients' sum")
        up, down = up + r["upload_bytes"], down + r["download_bytes"]
        if r["cum_upload_bytes"] != up or (r["cum_download_bytes"] < down if asynchronous
                                           else r["cum_download_bytes"] != down):
            raise ConformanceError(f"round {r['round']}: the running byte totals "
                                   f"{r['cum_upload_bytes']}/{r['cum_download_bytes']} are "
                                   f"not the rounds' sums {up}/{down}")
    if summary["total_upload_bytes"] != up or \
            summary["total_download_bytes"] != rounds[-1]["cum_download_bytes"]:
        raise ConformanceError("summary.json's byte totals are not the rounds'")
    if not (up > 0 and down > 0):
        raise ConformanceError("no bytes were charged")
