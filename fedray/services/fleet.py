"""The fleet: each client's device speed, network link and availability, and the virtual
clock that turns bytes and samples into simulated seconds.

A client's simulated time in a round (the model of FedScale, Lai et al., ICML 2022)::

    t = download_bytes / bw_down + latency + samples x epochs x cost x ms_per_sample / 1000
        + upload_bytes / bw_up

with the bytes taken from the run's exact byte ledger, ``samples x epochs`` capped by
``local.max_steps x local.batch_size``, and ``cost`` the method's compute cost of the tier
(:meth:`fedray.methods.base.Algorithm.compute_cost`: the sub-model methods' budget ρ, so
sliced sub-models train faster; 1 for full-model methods). Nothing here
reads a wall clock: results never depend on which executor finished first.

**Profiles** come from a trace file or are drawn per client from (seed, client):

- drawn: ``ms_per_sample = fleet.compute_ms_per_sample / tier_speed[tier] x exp(σ_c z)``,
  ``bw = fleet.{down,up}_kbps x exp(σ_b z')`` (log-normal around the stated medians, z and z'
  standard normal from the client's own seed), ``latency = fleet.latency_ms``;
- trace (``fleet.trace``, CSV or Parquet), one row per client, columns ``client_id``
  (0..N-1), ``compute_ms_per_sample`` (> 0), ``down_kbps`` (> 0), ``up_kbps`` (> 0) and
  optionally ``latency_ms`` (>= 0). This is FedScale's ``client_device_capacity``
  (``computation`` = ms per sample, ``communication`` = kbps, one link speed for both
  directions) in a columnar form: ``fedray fleet import-fedscale`` converts one. Clients
  absent from the trace draw their profile as above.

**Availability** (``fleet.availability``, CSV or Parquet): rows ``client_id, start_s,
end_s``, the client online during [start_s, end_s); per client the intervals are ordered
and do not overlap. With ``fleet.availability_period_s`` the trace repeats with that period
(FedScale's behaviour trace wraps at ``finish_time``). Clients absent from the file are
always online. A client is sampled only when online at the round's start and drops out when
it goes offline before it finishes.

Every check of a trace fails with one :class:`ConfigError` naming the file, the row and the
column, before any Ray work.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.outputs import OutputFiles
from fedray.core.seeding import rng, uniform
from fedray.core.spec import ConfigError, short_repr
from fedray.core.storage import read_error

TRACE_COLUMNS = ("client_id", "compute_ms_per_sample", "down_kbps", "up_kbps")
AVAILABILITY_COLUMNS = ("client_id", "start_s", "end_s")

# The clock check (:func:`check_clock`): a link or a speed is refused when the largest round
# it allows for would take longer than MAX_ROUND_S simulated seconds. Above that the clock
# overflows to inf within a few rounds, and inf turns into NaN (inf - inf, inf mod period)
# in every later comparison, silently.
ROUND_BYTES = 2.0 ** 50  # bytes each way (1 PiB: more than any model's download)
ROUND_SAMPLES = 2.0 ** 50  # samples x epochs x compute cost
MAX_ROUND_S = 1e300  # room for 10**8 such rounds below the largest float (1.8e308)
# the largest |z| :func:`_normal` can draw (u1 = 1 - 2**-53 in Box-Muller)
Z_MAX = math.sqrt(-2.0 * math.log(2.0 ** -53))
CLOCK_RULE = (f"a value whose simulated time for one round stays finite (at most "
              f"{MAX_ROUND_S:g} s for a round of 2**50 bytes each way and 2**50 samples)")
DRAWN_CLOCK_RULE = CLOCK_RULE[:-1] + ", at the slowest draw of the log-normal spread)"


def read_table(path: str, field: str, columns: tuple[str, ...],
               optional: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The named columns of a CSV or Parquet trace file as numpy arrays (rows in file
    order); a missing file, an unreadable one, a missing column or a non-numeric or
    non-finite value is a :class:`ConfigError` naming the file, row and column."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if not os.path.isfile(path):
        raise ConfigError(field, path, "an existing CSV or Parquet file")
    try:
        if path.endswith(".parquet"):
            table = pq.read_table(path)
        else:
            table = pacsv.read_csv(path)
        names = table.column_names  # decoded here: a header that is not UTF-8 fails now
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as e:
        raise ConfigError(field, path, f"a readable CSV or Parquet file "
                                       f"({read_error(e)})") from None
    out = {}
    for col in columns + optional:
        if col not in names:
            if col in optional:
                continue
            # the header is not echoed: a path that points at another file (a link to
            # /etc/passwd) would otherwise print that file's first line
            raise ConfigError(f"{field} ({path})",
                              f"a header of {table.num_columns} column(s)",
                              f"a column named {col!r} (required: {', '.join(columns)})")
        arr = table.column(col)
        if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
            raise ConfigError(f"{field} ({path}) column {col}", str(arr.type),
                              "numbers in every row")
        values = arr.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isfinite(values.astype(np.float64)))
        if bad.size:
            raise ConfigError(f"{field} ({path}) row {bad[0] + 1} column {col}",
                              values[bad[0]], "a finite number")
        out[col] = values
    return out


def _check(field: str, path: str, col: str, values: np.ndarray, ok: np.ndarray,
           rule: str) -> None:
    bad = np.flatnonzero(~ok)
    if bad.size:
        raise ConfigError(f"{field} ({path}) row {bad[0] + 1} column {col}",
                          values[bad[0]].item(), rule)


def _client_ids(field: str, path: str, ids: np.ndarray, num_clients: int) -> np.ndarray:
    """The ``client_id`` column as int64, checked on the values as read (a float id of
    1e30 is reported as 1e+30, not as what the cast to int64 wraps it to)."""
    if ids.dtype.kind == "f":
        _check(field, path, "client_id", ids, ids == np.floor(ids), "an integer client id")
    _check(field, path, "client_id", ids, (ids >= 0) & (ids < num_clients),
           f"a client id in 0..{num_clients - 1} (clients.num_clients = {num_clients})")
    return ids.astype(np.int64)


def _worst_round(compute_ms_per_sample: Any, down_kbps: Any, up_kbps: Any,
                 latency_ms: Any) -> dict[str, np.ndarray]:
    """Simulated seconds of each part of the largest round the clock check allows for
    (:data:`ROUND_BYTES` each way, :data:`ROUND_SAMPLES`), by the formula of
    :meth:`Fleet.seconds`; an overflow gives inf, never an exception."""
    with np.errstate(all="ignore"):
        f = np.float64
        return {"compute_ms_per_sample": ROUND_SAMPLES * f(compute_ms_per_sample) / 1000,
                "down_kbps": ROUND_BYTES * 8 / (f(down_kbps) * 1000),
                "up_kbps": ROUND_BYTES * 8 / (f(up_kbps) * 1000),
                "latency_ms": f(latency_ms) / 1000}


def _too_slow(parts: dict[str, np.ndarray]) -> np.ndarray:
    """Where the parts of :func:`_worst_round` add up to more than :data:`MAX_ROUND_S` (or
    to inf or NaN)."""
    with np.errstate(all="ignore"):
        total = sum(parts.values())
    return ~(total <= MAX_ROUND_S)


def _check_trace_clock(field: str, path: str, cols: dict[str, np.ndarray]) -> None:
    """Every row of a device trace keeps the clock finite (:data:`CLOCK_RULE`): the first
    row that does not is named with the column that makes it slowest."""
    n = len(cols["client_id"])
    parts = _worst_round(cols["compute_ms_per_sample"], cols["down_kbps"], cols["up_kbps"],
                         cols.get("latency_ms", np.zeros(n)))
    bad = np.flatnonzero(_too_slow(parts))
    if bad.size:
        row = int(bad[0])
        col = max(parts, key=lambda c: parts[c][row])
        raise ConfigError(f"{field} ({path}) row {row + 1} column {col}",
                          cols[col][row].item(), CLOCK_RULE)


def check_clock(fleet_cfg: Any, tier_names: list[str]) -> None:
    """The drawn profiles' settings keep the clock finite (:data:`CLOCK_RULE`) even for the
    slowest draw (z = ±:data:`Z_MAX`) and the slowest tier: ``fleet.down_kbps=1e-300``
    would otherwise turn every simulated time into inf and then NaN, silently. One
    :class:`ConfigError` names the key that makes the round too slow: the median, else the
    tier speed, else the spread (sigma). Called by :class:`Fleet` (so by the config check,
    before any Ray work)."""
    f = fleet_cfg
    speeds = {n: float(f.tier_speed.get(n, 1.0)) for n in tier_names} or {"": 1.0}
    slowest = min(speeds, key=speeds.get)
    with np.errstate(all="ignore"):
        spread_c = np.exp(np.float64(f.compute_sigma) * Z_MAX)
        spread_b = np.exp(np.float64(f.bandwidth_sigma) * Z_MAX)
        candidates = {  # per part: (key, value, that part's worst time with it alone)
            "compute_ms_per_sample": [
                ("fleet.compute_ms_per_sample", f.compute_ms_per_sample,
                 f.compute_ms_per_sample),
                (f"fleet.tier_speed.{slowest}", speeds[slowest],
                 f.compute_ms_per_sample / np.float64(speeds[slowest])),
                ("fleet.compute_sigma", f.compute_sigma,
                 f.compute_ms_per_sample / np.float64(speeds[slowest]) * spread_c)],
            "down_kbps": [("fleet.down_kbps", f.down_kbps, f.down_kbps),
                          ("fleet.bandwidth_sigma", f.bandwidth_sigma, f.down_kbps / spread_b)],
            "up_kbps": [("fleet.up_kbps", f.up_kbps, f.up_kbps),
                        ("fleet.bandwidth_sigma", f.bandwidth_sigma, f.up_kbps / spread_b)],
            "latency_ms": [("fleet.latency_ms", f.latency_ms, f.latency_ms)]}
    worst = {part: c[-1][2] for part, c in candidates.items()}
    parts = _worst_round(**worst)
    if not _too_slow(parts):
        return
    part = max(parts, key=lambda p: parts[p])
    others = {**dict.fromkeys(worst, 1.0), "latency_ms": 0.0}  # a fast device otherwise
    key, value = next(((k, v) for k, v, alone in candidates[part]
                       if _too_slow(_worst_round(**{**others, part: alone}))),
                      candidates[part][-1][:2])
    raise ConfigError(key, value, DRAWN_CLOCK_RULE)


@dataclass
class Trace:
    """Device profiles read from a trace file, indexed by client id (``known`` marks the
    clients the file lists)."""

    known: np.ndarray  # bool per client
    compute_ms: np.ndarray
    down_kbps: np.ndarray
    up_kbps: np.ndarray
    latency_ms: np.ndarray


def read_trace(path: str, num_clients: int, field: str = "fleet.trace") -> Trace:
    """A device-capacity trace (columns :data:`TRACE_COLUMNS`, optional ``latency_ms``),
    checked: ids in the population and unique, speeds and bandwidths > 0, latency >= 0,
    and no row so slow that the clock overflows (:data:`CLOCK_RULE`)."""
    cols = read_table(path, field, TRACE_COLUMNS, ("latency_ms",))
    ids = _client_ids(field, path, cols["client_id"], num_clients)
    order = np.argsort(ids, kind="stable")
    dup = np.flatnonzero(np.diff(ids[order]) == 0)
    if dup.size:
        row = int(order[dup[0] + 1])
        raise ConfigError(f"{field} ({path}) row {row + 1} column client_id", int(ids[row]),
                          "one row per client (this id appears twice)")
    for col in TRACE_COLUMNS[1:]:
        _check(field, path, col, cols[col], cols[col] > 0, "a number > 0")
    lat = cols.get("latency_ms")
    if lat is not None:
        _check(field, path, "latency_ms", lat, lat >= 0, "a number >= 0")
    _check_trace_clock(field, path, cols)
    known = np.zeros(num_clients, dtype=bool)
    known[ids] = True

    def spread(v: np.ndarray | None) -> np.ndarray:
        out = np.full(num_clients, np.nan)
        if v is not None:
            out[ids] = v
        return out

    return Trace(known, spread(cols["compute_ms_per_sample"]), spread(cols["down_kbps"]),
                 spread(cols["up_kbps"]), spread(lat))


@dataclass
class Availability:
    """Online intervals per client in CSR form: client c's intervals are
    ``start[offsets[c]:offsets[c+1]]`` / ``end[...]``, ordered; an empty segment means always
    online; ``period`` wraps time (None: no wrap, offline after the last interval)."""

    offsets: np.ndarray
    start: np.ndarray
    end: np.ndarray
    period: float | None = None
    _sorted: np.ndarray | None = None

    def _find(self, ids: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per client: (has intervals, index of the last interval starting at or before t)."""
        lo, hi = self.offsets[ids].copy(), self.offsets[ids + 1].copy()
        has = hi > lo
        # vectorised binary search for the last start <= t within each segment
        left, right = lo, hi
        while True:
            active = left < right
            if not active.any():
                break
            mid = (left + right) // 2
            go_right = active & (self.start[np.minimum(mid, len(self.start) - 1)] <= t)
            left = np.where(go_right, mid + 1, left)
            right = np.where(active & ~go_right, mid, right)
        return has, left - 1

    def _local(self, t: float | np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        return np.mod(t, self.period) if self.period else t

    def online(self, ids: np.ndarray, t: float) -> np.ndarray:
        """Whether each client of ``ids`` is online at simulated time ``t``."""
        ids = np.asarray(ids, dtype=np.int64)
        local = np.broadcast_to(self._local(t), ids.shape)
        has, k = self._find(ids, local)
        found = has & (k >= self.offsets[ids])
        kk = np.clip(k, 0, max(len(self.end) - 1, 0))
        inside = found & (local < self.end[kk]) if len(self.end) else found
        return ~has | inside

    def next_start(self, t: float) -> float:
        """The earliest time after ``t`` at which a listed client comes online (inf: never
        again)."""
        if not len(self.start):
            return math.inf
        if self._sorted is None:
            self._sorted = np.sort(self.start)
        starts = self._sorted
        local = t % self.period if self.period else t
        i = int(np.searchsorted(starts, local, side="right"))
        if i < len(starts):
            return t - local + float(starts[i])
        return t - local + self.period + float(starts[0]) if self.period else math.inf

    def online_until(self, ids: np.ndarray, t: float) -> np.ndarray:
        """For clients online at ``t``: when they go offline (inf: never)."""
        ids = np.asarray(ids, dtype=np.int64)
        local = np.broadcast_to(self._local(t), ids.shape)
        has, k = self._find(ids, local)
        kk = np.clip(k, 0, max(len(self.end) - 1, 0))
        if not len(self.end):
            return np.full(ids.shape, np.inf)
        end = self.end[kk] - local + float(t)
        if self.period:  # a session running through the wrap: [x, P) then [0, y)
            first = np.clip(self.offsets[ids], 0, len(self.start) - 1)
            wraps = (self.end[kk] >= self.period) & (self.start[first] <= 0) & (kk != first)
            end = np.where(wraps, end + self.end[first], end)
        return np.where(has, end, np.inf)


def read_availability(path: str, num_clients: int, period: float | None = None,
                      field: str = "fleet.availability") -> Availability:
    """An availability trace (columns :data:`AVAILABILITY_COLUMNS`), checked: ids in the
    population, 0 <= start < end (<= period when wrapping), each client's rows in time
    order and not overlapping."""
    cols = read_table(path, field, AVAILABILITY_COLUMNS)
    ids = _client_ids(field, path, cols["client_id"], num_clients)
    start = cols["start_s"].astype(np.float64)
    end = cols["end_s"].astype(np.float64)
    _check(field, path, "start_s", start, start >= 0, "a time >= 0 s")
    _check(field, path, "end_s", end, end > start, "an end after the row's start_s")
    if period is not None:
        _check(field, path, "end_s", end, end <= period,
               f"at most fleet.availability_period_s = {period}")
    order = np.argsort(ids, kind="stable")
    ids_s, start_s, end_s = ids[order], start[order], end[order]
    same = ids_s[1:] == ids_s[:-1]
    bad = same & (start_s[1:] < end_s[:-1])
    if bad.any():
        row = int(order[np.flatnonzero(bad)[0] + 1])
        raise ConfigError(f"{field} ({path}) row {row + 1} column start_s", float(start[row]),
                          f"intervals of client {int(ids[row])} in time order, each starting "
                          f"at or after the previous one's end_s")
    touching = np.r_[False, same & (start_s[1:] == end_s[:-1])]  # one session, two rows
    if touching.any():  # merged: [a, b) + [b, c) = [a, c)
        last = np.r_[np.flatnonzero(~touching)[1:] - 1, len(ids_s) - 1]
        ids_s, start_s, end_s = ids_s[~touching], start_s[~touching], end_s[last]
    offsets = np.zeros(num_clients + 1, dtype=np.int64)
    np.add.at(offsets, ids_s + 1, 1)
    return Availability(np.cumsum(offsets), start_s, end_s, period)


@dataclass
class Profiles:
    """Device profiles of some clients (arrays aligned with the ids asked for)."""

    compute_ms: np.ndarray
    down_kbps: np.ndarray
    up_kbps: np.ndarray
    latency_ms: np.ndarray


def sampled_per_round(cfg: Any) -> int:
    """Clients a synchronous round samples: K, or ⌈(1 + o) K⌉ with over-commitment
    ``fleet.overcommit`` = o (the round closes on the first K reports), at most N."""
    k, o = cfg.clients.sampled_count(), cfg.fleet.overcommit
    return min(cfg.clients.num_clients, math.ceil((1 + o) * k)) if o else k


class Fleet:
    """Profiles, availability and the time formula of a run's clients (see the module)."""

    def __init__(self, fleet_cfg: Any, num_clients: int, seed: int,
                 tier_capacity: dict[str, float], tier_names: list[str]):
        self.cfg, self.seed, self.num_clients = fleet_cfg, seed, num_clients
        self.capacity = tier_capacity
        self.tier_names = tier_names
        check_clock(fleet_cfg, tier_names)
        self.trace = read_trace(fleet_cfg.trace, num_clients) if fleet_cfg.trace else None
        self.availability = (read_availability(fleet_cfg.availability, num_clients,
                                               fleet_cfg.availability_period_s)
                             if fleet_cfg.availability else None)

    @classmethod
    def of(cls, cfg: Any, cost: dict[str, float] | None = None) -> Fleet:
        """The fleet of ``cfg``; ``cost`` is the compute cost per tier (default 1)."""
        return cls(cfg.fleet, cfg.clients.num_clients, cfg.seed, cost or {},
                   [t.name for t in cfg.runtime.tiers])

    def profiles(self, ids: np.ndarray, tiers: list[str]) -> Profiles:
        """Profiles of ``ids`` (of the given tiers): from the trace where it lists them,
        else drawn log-normally from (seed, client) around the configured medians."""
        f = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        speed = np.array([f.tier_speed.get(t, 1.0) for t in tiers], dtype=np.float64)
        z = _normal(self.seed, ids, "fleet-compute")
        zd, zu = _normal(self.seed, ids, "fleet-down"), _normal(self.seed, ids, "fleet-up")
        compute = f.compute_ms_per_sample / speed * np.exp(f.compute_sigma * z)
        down = f.down_kbps * np.exp(f.bandwidth_sigma * zd)
        up = f.up_kbps * np.exp(f.bandwidth_sigma * zu)
        lat = np.full(ids.shape, float(f.latency_ms))
        if self.trace is not None:
            tr, known = self.trace, self.trace.known[ids]
            compute = np.where(known, tr.compute_ms[ids], compute)
            down = np.where(known, tr.down_kbps[ids], down)
            up = np.where(known, tr.up_kbps[ids], up)
            lat = np.where(known & ~np.isnan(tr.latency_ms[ids]), tr.latency_ms[ids], lat)
        return Profiles(compute, down, up, lat)

    def seconds(self, ids: np.ndarray, tiers: list[str], download: np.ndarray,
                upload: np.ndarray, samples: np.ndarray) -> dict[str, np.ndarray]:
        """Simulated seconds of each client's round (see the module's formula) and its
        parts: ``down``, ``compute``, ``up``, ``total`` (``samples`` = samples x epochs
        processed). A time that is not finite (a link or speed so slow that it overflows)
        is a :class:`ConfigError`, never a silent inf that becomes NaN later."""
        p = self.profiles(ids, tiers)
        cost = np.array([self.capacity.get(t, 1.0) for t in tiers], dtype=np.float64)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            down = np.asarray(download, dtype=np.float64) * 8 / (p.down_kbps * 1000)
            up = np.asarray(upload, dtype=np.float64) * 8 / (p.up_kbps * 1000)
            compute = np.asarray(samples, dtype=np.float64) * cost * p.compute_ms / 1000
        lat = p.latency_ms / 1000
        total = down + lat + compute + up
        bad = np.flatnonzero(~np.isfinite(total))
        if bad.size:  # the config check should have refused it: never let inf/NaN through
            i = int(bad[0])
            raise ConfigError(
                f"fleet: simulated time of client {int(np.asarray(ids)[i])}",
                float(total[i]),
                f"a finite number of seconds (profile: {p.compute_ms[i]:g} ms per sample x "
                f"{float(np.asarray(samples, dtype=np.float64)[i]):g} samples x cost "
                f"{cost[i]:g}, down {p.down_kbps[i]:g} kbps for "
                f"{float(np.asarray(download, dtype=np.float64)[i]):g} bytes, up "
                f"{p.up_kbps[i]:g} kbps for {float(np.asarray(upload, dtype=np.float64)[i]):g}"
                f" bytes, latency {p.latency_ms[i]:g} ms): a link or a speed this slow "
                f"overflows the virtual clock")
        return {"down": down + lat, "compute": compute, "up": up, "total": total}

    def online(self, ids: np.ndarray, t: float) -> np.ndarray:
        if self.availability is None:
            return np.ones(len(ids), dtype=bool)
        return self.availability.online(ids, t)

    def online_until(self, ids: np.ndarray, t: float) -> np.ndarray:
        if self.availability is None:
            return np.full(len(ids), np.inf)
        return self.availability.online_until(ids, t)

    def next_online(self, t: float) -> float:
        """When the next client comes online after ``t`` (the clock jumps there when no
        one is online); inf when no one ever will."""
        return math.inf if self.availability is None else self.availability.next_start(t)

    def dropped(self, round: int, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` drop out mid-round (probability ``fleet.dropout``, a pure function
        of (seed, round, client))."""
        if not self.cfg.dropout:
            return np.zeros(len(ids), dtype=bool)
        return uniform(self.seed, round, ids, "fleet-dropout") < self.cfg.dropout

    def sample(self, round: int, k: int, t: float, exclude: set[int] = frozenset()
               ) -> list[int]:
        """``k`` distinct clients online at ``t`` (fewer if fewer are), drawn from (seed,
        round): batches of uniform ids are drawn until enough online ones are found, so the
        cost follows ``k``, not the population."""
        gen = rng(self.seed, round, -1, "fleet-sample")
        chosen: dict[int, None] = {}
        tries = 0
        while len(chosen) < k and tries < 64:
            tries += 1
            batch = gen.integers(0, self.num_clients, size=max(2 * k, 64))
            ok = batch[self.online(batch, t)]
            for c in ok.tolist():
                if c not in chosen and c not in exclude:
                    chosen[c] = None
                    if len(chosen) == k:
                        break
        if len(chosen) < k:  # a sparse fleet: scan everyone once
            every = np.flatnonzero(self.online(np.arange(self.num_clients), t))
            for c in every[gen.permutation(len(every))].tolist():
                if c not in chosen and c not in exclude:
                    chosen[c] = None
                    if len(chosen) == k:
                        break
        return sorted(chosen)


def _normal(seed: int, ids: np.ndarray, purpose: str) -> np.ndarray:
    """A standard normal per client (Box-Muller over two :func:`uniform` draws)."""
    u1 = uniform(seed, -1, ids, purpose + "/1")
    u2 = uniform(seed, -1, ids, purpose + "/2")
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2 * math.pi * u2)


def write_example(out_dir: str, num_clients: int = 100, seed: int = 0,
                  overwrite: bool = False) -> tuple[str, str]:
    """A small heterogeneous example fleet: ``devices.csv`` (three device classes — phone,
    tablet, laptop, half / 30 % / 20 % of the clients — with log-normal spread) and
    ``availability.csv`` (each client alternates online sessions of 2-30 minutes with
    offline gaps of 5-60 minutes over a 24-hour day, from a random phase: about a third of
    the fleet online at any time). Both files are written all or nothing
    (:class:`~fedray.core.outputs.OutputFiles`): an existing one is a :class:`ConfigError`
    unless ``overwrite``. Returns the two paths."""
    with OutputFiles(out_dir, ["devices.csv", "availability.csv"], overwrite) as out:
        gen = rng(seed, -1, -1, "example-trace")
        classes = np.array([[40.0, 2_000.0, 500.0, 120.0],  # ms/sample, down, up kbps, latency
                            [15.0, 10_000.0, 2_000.0, 60.0],
                            [5.0, 50_000.0, 10_000.0, 20.0]])
        kind = gen.choice(3, size=num_clients, p=[0.5, 0.3, 0.2])
        spread = np.exp(0.3 * gen.standard_normal((num_clients, 3)))
        with out.open("devices.csv", "w") as f:
            f.write("client_id,compute_ms_per_sample,down_kbps,up_kbps,latency_ms\n")
            for c in range(num_clients):
                ms, down, up, lat = classes[kind[c]]
                f.write(f"{c},{ms * spread[c, 0]:.3f},{down * spread[c, 1]:.1f},"
                        f"{up * spread[c, 2]:.1f},{lat:.1f}\n")
        day = 86_400.0
        with out.open("availability.csv", "w") as f:
            f.write("client_id,start_s,end_s\n")
            for c in range(num_clients):
                t = -gen.uniform(0, 3_600.0)  # a random phase
                while t < day:
                    on = gen.uniform(120.0, 1_800.0)
                    a, b = max(t, 0.0), min(t + on, day)
                    if b > a:
                        f.write(f"{c},{a:.1f},{b:.1f}\n")
                    t += on + gen.uniform(300.0, 3_600.0)
    return out.path("devices.csv"), out.path("availability.csv")


def import_fedscale(capacity_pickle: str, out_dir: str, behaviour_pickle: str | None = None,
                    overwrite: bool = False) -> list[str]:
    """Convert FedScale's pickled traces (``client_device_capacity``: {id: {'computation',
    'communication'}}; ``client_behave_trace``: {id: {'active', 'inactive', 'finish_time'}})
    to fedray's CSV schema. The pickles are read with an unpickler that admits only plain
    containers and numbers (any class or function reference fails), so a planted pickle
    cannot run code; ids are renumbered 0..N-1 in sorted order (the mapping is written to
    ``ids.csv``). ``computation`` is taken as ms per sample as it is; FedScale's own
    simulator multiplies it by an augmentation factor of 3 (forward plus backward) — scale
    ``compute_ms_per_sample`` yourself to match it. Its per-client ``finish_time`` becomes
    one period for everyone (``fleet.availability_period_s``).

    Every value is checked (a finite number, > 0 for speeds, >= 0 for times: a Python int
    too large for a float, inf, NaN, a negative or a non-number is one :class:`ConfigError`
    naming the pickle, the client id as written and the field). The files (``ids.csv``,
    ``devices.csv``, and ``availability.csv`` with a behaviour trace) are written all or
    nothing (:class:`~fedray.core.outputs.OutputFiles`): an existing one is refused unless
    ``overwrite``, and after any failure nothing is left. Returns the paths written
    (devices, ids[, availability])."""
    names = ["ids.csv", "devices.csv"] + (["availability.csv"] if behaviour_pickle else [])
    with OutputFiles(out_dir, names, overwrite) as out:
        try:
            _import_fedscale(capacity_pickle, behaviour_pickle, out)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError("trace pickle", capacity_pickle, f"FedScale's trace layout "
                              f"({type(e).__name__}: {e})") from None
    return [out.path(n) for n in ("devices.csv", "ids.csv", "availability.csv")
            if n in names]


_FLOAT_MAX = sys.float_info.max


def _shown(value: Any) -> Any:
    """``value`` for a message: an int too long for ``repr`` (Python refuses to print more
    than 4300 digits) is described by its length."""
    if isinstance(value, int) and value.bit_length() > 4000:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return value


def _number(what: str, pickle_path: str, client: Any, name: str, value: Any,
            positive: bool) -> None:
    """Refuse a pickled value that is not a finite int or float (> 0 if ``positive``, else
    >= 0): ``float()`` of a Python int above 1.8e308 raises OverflowError, and inf, NaN or
    a negative would become a trace the run refuses much later."""
    if type(value) in (int, float) and (0 < value if positive else 0 <= value) \
            and value <= _FLOAT_MAX:
        return
    rule = "a finite number " + ("> 0" if positive else ">= 0 (seconds)")
    raise ConfigError(f"{what} ({pickle_path}) client {short_repr(client)} field {name}",
                      _shown(value), rule)


def _times(what: str, pickle_path: str, client: Any, name: str, values: Any) -> list:
    """The list ``values`` of behaviour times, each checked by :func:`_number`."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(f"{what} ({pickle_path}) client {short_repr(client)} field {name}",
                          type(values).__name__, "a list of times in seconds")
    for j, v in enumerate(values):
        if not (type(v) in (int, float) and 0 <= v <= _FLOAT_MAX):
            _number(what, pickle_path, client, f"{name}[{j}]", v, positive=False)
    return list(values)


def fedscale_sessions(active: list, inactive: list, finish: float) -> list[tuple[Any, Any]]:
    """The online sessions (start, end) of one FedScale behaviour trace: each ``active[j]``
    runs to the first ``inactive`` time after it, in list order (``finish`` when there is
    none), cut at the next ``active`` time; empty ones are dropped. The first later
    ``inactive`` in list order is the first whose running maximum exceeds the start, so one
    binary search over that maximum finds it: O(n log n) where the straight search of each
    interval's end was quadratic (40,000 intervals took 35 s). Values are compared as given
    (Python ints and floats exactly), so the result is the straight search's."""
    reach = list(itertools.accumulate(inactive, max))
    last = len(active) - 1
    out = []
    for j, a in enumerate(active):
        i = bisect.bisect_right(reach, a)
        end = inactive[i] if i < len(inactive) else finish
        if j < last:
            end = min(end, active[j + 1])
        if end > a:
            out.append((a, end))
    return out


def _import_fedscale(capacity_pickle: str, behaviour_pickle: str | None,
                     out: OutputFiles) -> None:
    import csv

    cap = _safe_unpickle(capacity_pickle)
    if not isinstance(cap, dict):
        raise ConfigError("capacity trace", capacity_pickle, "a pickled dict {client id: "
                                                             "{'computation', 'communication'}}")
    keys = sorted(cap, key=lambda k: (str(type(k)), k))
    index = {k: i for i, k in enumerate(keys)}
    rows = []
    for k in keys:
        d = cap[k]
        if not isinstance(d, dict) or not {"computation", "communication"} <= d.keys():
            raise ConfigError(f"capacity trace ({capacity_pickle}) client {short_repr(k)}",
                              type(d).__name__ if not isinstance(d, dict) else sorted(map(
                                  str, d)), "a dict with 'computation' and 'communication'")
        for name in ("computation", "communication"):
            _number("capacity trace", capacity_pickle, k, name, d[name], positive=True)
        comp, comm = float(d["computation"]), float(d["communication"])
        rows.append(f"{index[k]},{comp},{comm},{comm}\n")
    beh = _safe_unpickle(behaviour_pickle) if behaviour_pickle else None
    if beh is not None and not isinstance(beh, dict):
        raise ConfigError("behaviour trace", behaviour_pickle, "a pickled dict {client id: "
                                                               "{'active', 'inactive', ...}}")

    with out.open("ids.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["client_id", "fedscale_id"])
        w.writerows([i, k] for k, i in index.items())
    with out.open("devices.csv", "w") as f:
        f.write("client_id,compute_ms_per_sample,down_kbps,up_kbps\n")
        f.writelines(rows)
    if beh is None:
        return
    what = "behaviour trace"
    with out.open("availability.csv", "w") as f:
        f.write("client_id,start_s,end_s\n")
        for k in keys:
            if k not in beh:
                continue
            b = beh[k]
            if not isinstance(b, dict) or not {"active", "inactive"} <= b.keys():
                raise ConfigError(f"{what} ({behaviour_pickle}) client {short_repr(k)}",
                                  type(b).__name__ if not isinstance(b, dict) else sorted(map(
                                      str, b)), "a dict with 'active' and 'inactive'")
            active = _times(what, behaviour_pickle, k, "active", b["active"])
            inactive = _times(what, behaviour_pickle, k, "inactive", b["inactive"])
            if "finish_time" in b:
                _number(what, behaviour_pickle, k, "finish_time", b["finish_time"], False)
            finish = float(b.get("finish_time", max(active + inactive or [0])))
            f.writelines(f"{index[k]},{float(a)},{float(end)}\n"
                         for a, end in fedscale_sessions(active, inactive, finish))


def _safe_unpickle(path: str) -> Any:
    """The object in a FedScale pickle, read by an unpickler that refuses every class and
    function reference. A malformed file is one :class:`ConfigError` whose reason never
    quotes its bytes ("invalid load key, 'r'" is the first byte of a linked /etc/passwd)."""
    import pickle

    class Plain(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise ConfigError("trace pickle", path, f"plain dicts, lists and numbers only (it "
                                                    f"references {module}.{name})")

    if not os.path.isfile(path):
        raise ConfigError("trace pickle", path, "an existing file")
    with open(path, "rb") as f:
        try:
            return Plain(f).load()
        except ConfigError:
            raise
        except (pickle.UnpicklingError, EOFError) as e:
            reason = "not a pickle" if "load key" in str(e) else str(e)
        except Exception as e:  # noqa: BLE001 — any malformed pickle is bad input
            reason = f"{type(e).__name__} while reading it"
    raise ConfigError("trace pickle", path, f"a readable pickle ({reason})")


__all__ = ["Availability", "Fleet", "Profiles", "Trace", "check_clock", "fedscale_sessions",
           "import_fedscale", "read_availability",
           "read_trace", "write_example"]
