"""Secure aggregation in the round (issue #32): the ``secagg`` config section and
:class:`SecureAggregator`, which turns one synchronous round's accepted uploads into the
sum the server may learn, by really running :func:`fedray.services.secagg.secure_sum`.

What a client does (simulated on the driver, each step a pure function of (seed, round,
client), so a round repeats bit for bit on any executor count and after ``--resume``):

1. its decoded upload — after the update transform chain, whose loss stays — as one float64
   vector over its floating tensors in the upload's order (with central DP: its update Δ,
   :meth:`Algorithm.to_delta`, clipped to L2 ≤ C first, plus one word saying whether it was
   within C, for adaptive clipping);
2. every coordinate clipped to [−``clip``, ``clip``], scaled by ``scale`` and rounded
   stochastically (:func:`~fedray.services.secagg.quantize`) into Z_{2^bits};
3. masked and summed by the protocol (``secagg`` complete graph, ``secagg_plus`` a random
   k-regular graph, ``none`` the same integers summed in the clear — the baseline a SecAgg
   run equals bit for bit).

The server learns only Σ over the clients whose masked input it holds, so the mean is
**unweighted** — every included client weight 1, as in DP-FedAvg and Kairouz et al. 2021 —
and the method's step is :meth:`AggregationPolicy.aggregate_sum` (capability ``linear``);
with central DP the server adds its Gaussian noise to the unmasked sum
(:meth:`fedray.services.privacy.CentralDP.release`: accountant and denominator unchanged),
its std z · (C + √m / scale): stochastic rounding moves a clipped update by less than
√m / scale in L2, so that is the sensitivity the quantized sum really has.

Dropouts at every phase: a client sampled advertises keys; it leaves before sharing with
probability ``secagg.dropout`` (its training is wasted: status ``dropped``); the fleet's
mid-round dropouts, deadlines, over-commitment surplus, NaN uploads and training errors send
no masked input (their pairwise masks are removed through their shares); a client that
sent one leaves before unmasking with probability ``secagg.dropout`` again, or when its
availability session ends before the round's training part does. Fewer than the threshold
left in any phase, or too few shares for any secret: the round fails as the protocol does
(logged ``round_failed``, model unchanged, nothing released). The threshold t defaults to a
majority of the neighbours that can answer the unmasking — with over-commitment only K of
the S clients sampled send inputs, so d (K − 1)/(S − 1) of a client's d neighbours in
expectation. Shares go to a client's neighbours only (Bonawitz et al. also keep one for
oneself; the neighbourhood form is SecAgg+'s, used for both). Non-floating tensors (a
BatchNorm counter) are not summed: the server keeps its own.

Costs: every message's bytes per client and phase go to the byte ledger (the masked input is
the client's upload, ⌈bits · m / 8⌉ bytes, in place of the chain's encoding) and to
``rounds.parquet`` (``secagg/<phase>_up_bytes`` / ``_down_bytes``), each client's row gets its
per-phase bytes; the simulated clock adds the key phases before training (the slowest
client's messages on its link plus a latency) and the unmasking after it (the slowest
survivor's shares, the clients' mask expansions — (1 + neighbours) · m PRG words each — and
the server's: one per survivor's seed and one per pairwise mask of each client that dropped
after sharing), at ``secagg.prg_ns`` simulated nanoseconds per PRG word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from fedray.core import registry
from fedray.core.seeding import rng, uniform
from fedray.core.spec import ConfigError, spec
from fedray.services.fleet import sampled_per_round
from fedray.services.secagg import (
    PHASES,
    Drops,
    dequantize,
    quantize,
    required_bits,
    secure_sum,
)

State = dict[str, np.ndarray]


class Masked(NamedTuple):
    """One upload as the secure sum takes it (:meth:`SecureRound.vector`)."""

    tensors: dict[str, np.ndarray]  # the tensors summed (after DP's clip, as a delta)
    flat: np.ndarray  # the same, as one float64 vector
    within: bool  # the update was within DP's clip norm (always, without DP)


@dataclass
class SecAggConfig:
    """Secure aggregation of each round's uploads (:mod:`fedray.services.secure_round`)."""

    enabled: bool = spec(False, help="sum the round's quantized uploads through secure "
                                     "aggregation: the server learns only their sum")
    protocol: Literal["secagg_plus", "secagg", "none"] = spec(
        "secagg_plus", help="secagg_plus (Bell et al. 2020: masks among a random k-regular "
                            "graph), secagg (Bonawitz et al. 2017: among all clients), none "
                            "(the same quantized sum in the clear: the baseline)")
    bits: int = spec(32, ge=2, le=62, help="k of Z_{2^k}, the ring masks and sums live in")
    clip: float = spec(1.0, gt=0, help="every coordinate of an update clipped to [-clip, clip] "
                                       "before quantization")
    scale: float | None = spec(None, gt=0, help="quantization scale s (x -> round(s x)); "
                                                "default the largest whose sum cannot wrap: "
                                                "floor((2^(bits-1) - 1) / n) / clip for n the "
                                                "most clients summed")
    threshold: int | None = spec(None, ge=1, help="t of Shamir's t-of-d shares among a client's "
                                                  "d neighbours (default floor(d/2) + 1)")
    degree: int | None = spec(None, ge=2, help="secagg_plus: k, the graph's even degree "
                                               "(default 2 ceil(log2 n), Bell et al.'s "
                                               "O(log n))")
    dropout: float = spec(0.0, ge=0, lt=1, help="probability that a client leaves before "
                                                "sharing keys, and again before unmasking, on "
                                                "top of the fleet's dropouts")
    prg_ns: float = spec(20.0, ge=0, help="simulated ns of compute per PRG word (AES-256-CTR "
                                          "via cryptography: 11-44 ns per word on one core "
                                          "here; benchmarks/secagg_study.py measures it)")

    def validate(self, cfg: Any) -> None:
        """The method, runtime and aggregation allow a sum-only server, and bits, clip and
        scale cannot wrap for the most clients a round sums."""
        if not self.enabled:
            return
        method = registry.method_of(cfg)
        if "asynchronous" in method.capabilities:
            raise ConfigError("secagg.enabled", True,
                              f"false for {method.name}: secure aggregation sums a "
                              f"synchronous round's cohort (no buffered variant here)")
        if not cfg.dp.enabled:  # with DP the release is a clipped mean any dp method takes
            registry.require(method, "linear", "secagg.enabled", True)
        if cfg.runtime.reduce == "executors":
            raise ConfigError("runtime.reduce", "executors",
                              "driver with secagg.enabled (the server sums masked inputs; "
                              "the executors' partial sums would be in the clear)")
        rule = getattr(getattr(cfg, "robust", None), "rule", "none")
        if rule != "none":
            raise ConfigError("robust.rule", rule,
                              "none with secagg.enabled (a robust rule needs each client's "
                              "update; the server sees only their sum)")
        k = cfg.clients.sampled_count()
        if k < 2:
            raise ConfigError("clients.per_round", k, "at least 2 with secagg.enabled (a "
                                                      "client's secrets are shared with others)")
        for knob, value, unused in (("dropout", self.dropout, 0.0),
                                    ("threshold", self.threshold, None),
                                    ("degree", self.degree, None)):
            if value != unused and (self.protocol == "none" or (
                    knob == "degree" and self.protocol == "secagg")):
                raise ConfigError(f"secagg.{knob}", value,
                                  f"unset with secagg.protocol={self.protocol} (it has no "
                                  f"{'graph degree' if knob == 'degree' else knob})")
        if self.protocol == "secagg_plus" and self.degree is not None and self.degree % 2:
            raise ConfigError("secagg.degree", self.degree, "an even number (Harary graph)")
        sampled = sampled_per_round(cfg)  # all of them share keys
        d = self.responding(sampled, k)
        if self.threshold is not None and self.threshold > d:
            extra = (f", of the {sampled} clients sampled only the first {k} to report send "
                     f"masked inputs (fleet.overcommit)" if sampled > k else "")
            raise ConfigError("secagg.threshold", self.threshold,
                              f"at most {d}: each client's secrets are shared among its "
                              f"neighbours and at most {d} of them answer the unmasking "
                              f"(clients.per_round {k}, {self.protocol}{extra})")
        n = max_summed(cfg)
        scale = self.resolved_scale(n)
        if scale is None or required_bits(self.clip, scale, n) > self.bits:
            need = required_bits(self.clip, scale, n) if scale else (n.bit_length() + 1)
            reach = (f"reaches ±{n * math.ceil(self.clip * scale):,}" if scale
                     else "cannot hold even one step per client")
            raise ConfigError("secagg.bits", self.bits,
                              f"at least {need}: the sum of {n} clients' coordinates, each "
                              f"clipped to secagg.clip = ±{self.clip:g} and scaled by "
                              f"secagg.scale = {scale if scale else 'any'}, {reach} and would "
                              f"wrap in Z_2^{self.bits} (raise bits, or lower clip or scale)")

    def neighbours(self, n: int) -> int:
        """d: how many others each of n clients masks and shares with."""
        return min(n - 1, self.graph_degree(n) or n - 1)

    def responding(self, sampled: int, reports: int) -> int:
        """How many of a client's neighbours can answer the unmasking when ``sampled``
        clients share keys and at most ``reports`` of them send masked inputs (over-
        commitment's surplus never does): d, or d (K − 1) / (S − 1) of them in expectation."""
        d = self.neighbours(sampled)
        return d if sampled <= reports else max(1, d * (reports - 1) // (sampled - 1))

    def resolved_threshold(self, sampled: int, reports: int) -> int:
        """t: ``threshold``, or a majority of the neighbours that can answer, ⌊d'/2⌋ + 1.
        (t ≤ d/2 is enough against a semi-honest server; Bonawitz et al.'s active-server
        variant needs t > n/2, which fedray does not simulate.)"""
        if self.threshold is not None:
            return self.threshold
        return self.responding(sampled, reports) // 2 + 1

    def graph_degree(self, n: int) -> int | None:
        """SecAgg+'s k for a cohort of n (None: the complete graph)."""
        if self.protocol != "secagg_plus":
            return None
        k = self.degree if self.degree is not None else 2 * math.ceil(math.log2(max(n, 2)))
        return None if k >= n - 1 else k

    def resolved_scale(self, n: int) -> float | None:
        """``scale``, or the largest whose sum of n clipped coordinates fits (None: none
        does)."""
        if self.scale is not None:
            return self.scale
        q = ((1 << (self.bits - 1)) - 1) // n
        while q >= 1 and required_bits(self.clip, q / self.clip, n) > self.bits:
            q -= 1  # float rounding of q / clip * clip above q
        return q / self.clip if q >= 1 else None


def max_summed(cfg: Any) -> int:
    """The most clients one round's sum can hold: K (over-commitment's surplus sends no
    input), or every client under Poisson-sampled DP."""
    if cfg.dp.enabled and cfg.dp.sampling == "poisson":
        return cfg.clients.num_clients
    return cfg.clients.sampled_count()


@dataclass
class SecureRound:
    """One round's outcome: the float64 sum of the included clients' (clipped, quantized)
    vectors as named tensors (None: the protocol failed, ``reason``), how many of them were
    within DP's clip, each client's bytes per phase, the phases' simulated seconds and who
    left in each."""

    total: State | None
    included: list[int]
    within: int
    reason: str | None
    elements: int
    up: dict[str, dict[int, int]]
    down: dict[str, dict[int, int]]
    seconds: dict[str, float] = field(default_factory=dict)
    left: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.total is None

    def extra_bytes(self) -> tuple[dict[int, int], dict[int, int]]:
        """Every client's protocol bytes (up, down) beyond its masked input, which the
        ledger charges as its upload."""
        up: dict[int, int] = {}
        down: dict[int, int] = {}
        for ph in PHASES:
            for c, b in self.up[ph].items():
                if ph != "masked_input":
                    up[c] = up.get(c, 0) + b
            for c, b in self.down[ph].items():
                down[c] = down.get(c, 0) + b
        return up, down

    def row(self) -> dict[str, float]:
        """The round row's ``secagg/*`` columns."""
        out = {"secagg/failed": float(self.failed), "secagg/included": float(len(self.included))}
        for ph in PHASES:
            out[f"secagg/{ph}_up_bytes"] = float(sum(self.up[ph].values()))
            out[f"secagg/{ph}_down_bytes"] = float(sum(self.down[ph].values()))
            out[f"secagg/{ph}_seconds"] = float(self.seconds.get(ph, 0.0))
        out |= {f"secagg/left_{k}": float(v) for k, v in self.left.items()}
        return out

    def client_row(self, c: int) -> dict[str, float]:
        return {f"secagg_{ph}_{way}_bytes": float(side[ph].get(c, 0))
                for ph in PHASES for way, side in (("up", self.up), ("down", self.down))}


class SecureAggregator:
    """The run's secure aggregation (module docstring); stateless between rounds."""

    def __init__(self, cfg: Any, privacy: Any = None):
        self.s: SecAggConfig = cfg.secagg
        self.seed = cfg.seed
        self.privacy = privacy
        self.reports = cfg.clients.sampled_count()
        self.scale = self.s.resolved_scale(max_summed(cfg))
        self.words_extra = 1 if privacy is not None and privacy.adaptive else 0

    def masked_bytes(self, m: int) -> int:
        return (self.s.bits * (m + self.words_extra) + 7) // 8

    def vector(self, global_state: State, upload: State) -> Masked:
        """What of one upload is masked and summed (:class:`Masked`)."""
        if self.privacy is not None:
            from fedray.services.privacy import clip_update

            delta = self.privacy.to_delta(global_state, upload)
            tensors, norm = clip_update(delta, self.privacy.clip)
            within = norm <= self.privacy.clip
        else:
            tensors = {k: np.asarray(v, np.float64) for k, v in upload.items()
                       if np.issubdtype(np.asarray(v).dtype, np.floating)}
            within = True
        flat = np.concatenate([np.ravel(v) for v in tensors.values()]) if tensors else \
            np.zeros(0)
        return Masked(tensors, flat, bool(within))

    def leave_before_sharing(self, r: int, sampled: list[int]) -> set[int]:
        """The clients that leave after advertising keys, before sharing them (drawn with
        probability ``dropout`` from (seed, round, client): a pure function, so
        :meth:`run` draws the same set)."""
        ids = np.array(sorted(sampled), dtype=np.int64)
        gone = (ids[uniform(self.seed, r, ids, "secagg-leave-share") < self.s.dropout]
                if self.s.protocol != "none" and self.s.dropout > 0 else ids[:0])
        return {int(c) for c in gone}

    def sensitivity_slack(self, m: int) -> float:
        """How far stochastic rounding can move a clipped update in L2: every coordinate
        by less than 1/scale, so ‖q − x‖ < √m / scale. Central DP's noise is calibrated to
        C plus this (the bound the quantized update really has)."""
        return math.sqrt(m) / self.scale

    def run(self, r: int, global_state: State, sampled: list[int],
            accepted: list[tuple[int, int, State]], link_seconds: Any,
            online_until: dict[int, float], end: float) -> SecureRound:
        """One round's protocol over the ``sampled`` cohort; ``accepted`` send masked
        inputs. ``link_seconds(ids, down, up)`` times messages on each client's link;
        ``online_until`` and ``end`` (simulated time the unmasking starts) say who is gone
        by then."""
        s = self.s
        template: State = {}
        inputs: dict[int, np.ndarray] = {}
        for c, _, upload in accepted:
            tensors, flat, ok = self.vector(global_state, upload)
            if not template:
                template = {k: np.shape(v) for k, v in tensors.items()}
            elif {k: np.shape(v) for k, v in tensors.items()} != template:
                raise ValueError("secure aggregation needs every client's update to have the "
                                 "same tensors")
            words = quantize(flat, s.clip, self.scale, s.bits,
                             rng(self.seed, r, c, "secagg-quant"))
            if self.words_extra:
                words = np.append(words, np.uint64(ok))
            inputs[c] = words
        m = len(next(iter(inputs.values()))) if inputs else self.words_extra
        senders = sorted(inputs)
        left_share = self.leave_before_sharing(r, sampled)
        cohort = sorted(set(sampled) - left_share)
        if s.protocol == "none":
            return self._plain(inputs, senders, sampled, template, m)
        for c in sampled:
            inputs.setdefault(c, np.zeros(m, np.uint64))  # never sent: not in the sum
        arr = np.array(senders, dtype=np.int64)
        leave = arr[uniform(self.seed, r, arr, "secagg-leave-unmask") < s.dropout] \
            if s.dropout > 0 else arr[:0]
        gone = {int(c) for c in leave} | {c for c in senders if online_until[c] < end}
        drops = Drops(before_share=left_share,
                      before_masked=set(cohort) - set(senders), before_unmask=gone)
        k = s.graph_degree(len(sampled))
        t = s.resolved_threshold(len(sampled), self.reports)
        res = secure_sum(inputs, s.bits, t, self.seed, r, drops, k)
        out = SecureRound(None, res.included, 0, res.reason, m - self.words_extra, res.up,
                          res.down, left={"share": len(drops.before_share),
                                "masked_input": len(drops.before_masked),
                                "unmask": len(drops.before_unmask)})
        out.seconds = self._seconds(res, sampled, m, link_seconds)
        if not res.failed:
            out.total, out.within = self._decode(res.total, template)
        return out

    def _plain(self, inputs: dict[int, np.ndarray], senders: list[int], sampled: list[int],
               template: State, m: int) -> SecureRound:
        total = np.zeros(m, np.uint64)
        mod = np.uint64((1 << self.s.bits) - 1)
        for c in senders:
            total = (total + inputs[c]) & mod
        up = {ph: dict.fromkeys(sampled, 0) for ph in PHASES}
        down = {ph: dict.fromkeys(sampled, 0) for ph in PHASES}
        for c in senders:
            up["masked_input"][c] = self.masked_bytes(m - self.words_extra)
        out = SecureRound(None, senders, 0, None if senders else "no masked input arrived",
                          m - self.words_extra, up, down)
        if senders:
            out.total, out.within = self._decode(total, template)
        return out

    def _decode(self, total: np.ndarray, template: dict[str, tuple]) -> tuple[State, int]:
        """The float sum as named tensors, and the within-clip count word."""
        within = int(total[-1]) if self.words_extra else 0
        body = total[:len(total) - self.words_extra]
        flat = dequantize(body, self.scale, self.s.bits)
        out, at = {}, 0
        for name, shape in template.items():
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = flat[at:at + size].reshape(shape)
            at += size
        return out, within

    def _seconds(self, res: Any, sampled: list[int], m: int, link_seconds: Any
                 ) -> dict[str, float]:
        """Simulated seconds of each phase the round waits for (module docstring), over the
        neighbour graph the protocol used."""
        per = self.s.prg_ns * 1e-9 * m
        graph = res.graph
        deg = {c: len(graph[c]) for c in sampled}
        ids = np.array(sampled, dtype=np.int64)
        out = {}
        for ph in ("advertise", "share", "unmask"):
            up = np.array([res.up[ph][c] for c in sampled], dtype=np.float64)
            down = np.array([res.down[ph][c] for c in sampled], dtype=np.float64)
            active = (up + down) > 0
            t = link_seconds(ids, down, up)
            out[ph] = float(np.max(t[active], initial=0.0))
        shared = {c for c in sampled if res.up["share"][c] > 0}
        senders = list(res.seen)
        out["masked_input"] = max(((1 + sum(v in shared for v in graph[c])) * per
                                   for c in senders), default=0.0)
        if sum(res.up["unmask"].values()):  # the server expanded masks only if it unmasked
            dropped = [c for c in shared if c not in res.seen]
            out["unmask"] += (len(senders) + sum(deg[c] for c in dropped)) * per
        return out


registry.register_section("secagg", SecAggConfig)


def secagg_summary(cfg: Any, rounds: Any, protocol_bytes: int, total_bytes: int
                   ) -> dict[str, Any]:
    """What ``summary.json`` reports under ``secagg``: the protocol and its resolved
    arithmetic, the rounds it failed, its bytes (and their share of all bytes) and its
    simulated seconds per phase, from the run's ``rounds`` table (pyarrow)."""
    s: SecAggConfig = cfg.secagg
    n = max_summed(cfg)

    def total(col: str) -> float:
        return float(np.nansum(rounds.column(col).to_numpy(zero_copy_only=False))) \
            if col in rounds.column_names else 0.0

    k, sampled = cfg.clients.sampled_count(), sampled_per_round(cfg)
    return {"protocol": s.protocol, "bits": s.bits, "clip": s.clip,
            "scale": s.resolved_scale(n), "max_clients_summed": n,
            "degree": s.neighbours(sampled) if s.protocol != "none" else None,
            "threshold": s.resolved_threshold(sampled, k) if s.protocol != "none" else None,
            "failed_rounds": int(total("secagg/failed")),
            "protocol_bytes": int(protocol_bytes),
            "protocol_share_of_bytes": protocol_bytes / total_bytes if total_bytes else 0.0,
            "bytes_per_phase": {ph: int(total(f"secagg/{ph}_up_bytes")
                                        + total(f"secagg/{ph}_down_bytes")) for ph in PHASES},
            "sim_seconds_per_phase": {ph: total(f"secagg/{ph}_seconds") for ph in PHASES}}
