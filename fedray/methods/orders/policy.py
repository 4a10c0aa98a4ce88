"""ORDERS — norm-rank difference aggregation (papers/orders-norm-rank-aggregation.zh.txt).

The core, :func:`orders_step`, is a pure function of (previous global parameters, client
updates, client ids, server state, config) returning (new parameters, new state,
diagnostics). It never touches Ray, torch or the round loop; :class:`OrdersPolicy` adapts
it to fedray's :class:`~fedray.methods.base.AggregationPolicy` and
``fedray.integrations.flower`` to Flower's ``Strategy``.

One round t, with the uploads Δθ_i = θ_i^local − θ_{t−1} of the participating clients
(§2.2–3 of the text):

1. norm n_i = max(‖Δθ_i‖, ``min_norm``) — ``l2`` over all parameters (the text's choice),
   ``l1``, ``key_layer`` (L2 over the named parameters, default the classifier = the last
   module's tensors), or ``normalized`` (L2 ÷ max(‖θ_{t−1}‖₂, ``min_norm``): the guard the
   text asks for when ‖θ_{t−1}‖ ≈ 0). Norms are accumulated in float64 (the float32
   updates cast element-wise first), so two clients whose norms differ by less than float32
   resolution are still ranked by their true norms, not by a rounding tie broken on id.
   Clients may report n_i themselves (the text: "one extra float" per upload); then the
   server does not recompute it. The reported float64 travels as its raw bits viewed as one
   int64 (:func:`encode_norm` / :func:`decode_norm`): the payload sends integer tensors
   exactly under every codec, whereas the fp32 codec would round a float64 to float32 (and
   bf16/int8/int4 coarser still). It costs 8 bytes plus its header entry, counted in the
   upload's ``nbytes`` like any tensor.
2. smoothing (§3.2): each client's last ``smoothing_window`` norms (from the rounds it
   took part in) are kept; s_i is their mean.
3. participation (§3.2): a client is ranked only if it took part in at least
   ``participation_threshold`` of the last ``participation_horizon`` rounds (this one
   included). Clients below it are left out of the ranking *and* of this round's
   aggregate. Warm-up — read literally nobody qualifies in round 1 and the model never
   moves; with ``warmup="ramp"`` (default) the threshold in round t is
   min(threshold, t), so round 1 ranks every participant and the rule binds fully from
   round ``threshold`` on. ``warmup="none"`` keeps the literal rule.
4. rank: s descending (i_1 = largest smoothed norm); ties broken by ascending client id.
5. weights for k = 1..N (N = ranked clients): ``inverse`` 1/k, ``smoothed_inverse``
   1/(k+α), ``sigmoid`` 1/(1+exp(β(k−γ))) with γ = N/3 unless given. The text's table
   glosses N as "本轮参与数" (this round's participants), and the same N bounds the rank
   sum of step 6; the two differ once the participation rule leaves clients out, and we
   take the ranked count for both (as the project's restatement does), so that γ puts the
   sigmoid's centre at a third of the ranks that receive a weight. ``freeze_top`` = m
   sets w_k = 0 for k ≤ m (the text's "freeze the top users" diagnostic, §5.2).
6. aggregate (§2.2): θ_t = θ_{t−1} + η Σ_k w_k (Δθ_{i_k} − Δθ_{i_{k+1}}), Δθ_{i_{N+1}} = 0,
   computed in its telescoped form Σ_k c_k Δθ_{i_k} with c_1 = w_1, c_k = w_k − w_{k−1}
   (identical, one pass over the updates). η = 1 is the text; in a run the rank-weighted
   sum is the pseudo-gradient the server optimizer applies (``server.optimizer=sgd``,
   ``server.lr`` = η: the text's step; any other optimizer takes it the same way).

   As written the coefficients after the first rank are negative for every decreasing
   weight scheme and sum to w_N: the model moves along the top client's update and
   *against* everyone else's. ``combine="rank_mean"`` is the clearly separate usable
   variant: θ_t = θ_{t−1} + η Σ_k (w_k / Σ_j w_j) Δθ_{i_k} — the rank weights applied
   directly and normalized, all coefficients ≥ 0, summing to 1.

Extensions (§6):

- Laplace noise on the ranked norms, scale b_k = b_0 / w_k (``dp_b0``), then re-ranking by
  the noisy norms. This perturbs *only the ordering*: the updates themselves are summed
  exactly, so the released model is not differentially private. With ``dp_clip`` = C the
  norms are clipped to C first. **No ε is reported, because none holds**: the scale b_k
  follows the client's rank, which is computed from every client's noise-free norm, so
  two neighbouring inputs can give a client Laplace noise of different scales, and the
  ratio of two Laplace densities of different scales is unbounded in the tails (not even
  C / min b_k bounds it). The per-client scales are reported. A rank with w_k = 0
  (``freeze_top``) has b_k = ∞: its noisy norm is the formula's limit, ±∞ by the sign of
  the Laplace draw, which carries nothing of the norm (re-ranking puts +∞ first, −∞
  last). Note that b_k = b_0 / w_k, as written, gives the *top* ranks (largest w_k) the
  *smallest* noise — the opposite of the text's stated intent that high-weight users get
  more privacy; we implement the formula and report the scales.
- hierarchical ORDERS: ORDERS within each capacity tier, then the mean of the tier
  updates weighted by the tier's ranked-client count (the text: "组内用户数", the
  group's users; counting its ranked clients keeps the tier shares summing to 1 when
  the participation rule leaves a whole tier unranked).
- personalization maturity map: per client, the trajectory of its smoothed norm over the
  rounds it took part in; over the last ``maturity_window`` points: least-squares slope,
  curvature (2 × the quadratic coefficient), steady state (their mean).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fedray.core.config import ConfigError, spec
from fedray.methods.base import AggregationPolicy, State


@dataclass
class OrdersParams:
    weighting: Literal["sigmoid", "inverse", "smoothed_inverse"] = spec(
        "sigmoid", help="rank weights w_k: sigmoid 1/(1+e^{β(k−γ)}), inverse 1/k, "
                        "smoothed_inverse 1/(k+α)")
    beta: float = spec(0.5, gt=0, help="sigmoid steepness β (text: 0.3–0.7)")
    gamma: float | None = spec(None, ge=1, help="sigmoid centre γ (default N/3 of the ranked)")
    offset: float = spec(10.0, ge=0, help="smoothed_inverse offset α in 1/(k+α)")
    smoothing_window: int = spec(3, ge=1, help="norms averaged per client")
    participation_threshold: int = spec(2, ge=1, help="rounds of the horizon a client must "
                                                      "have joined to be ranked")
    participation_horizon: int = spec(5, ge=1, help="rounds looked back for participation")
    warmup: Literal["ramp", "none"] = spec(
        "ramp", help="ramp: threshold min(threshold, t) in round t; none: literal rule")
    min_norm: float = spec(1e-6, gt=0, help="norm floor")
    norm: Literal["l2", "l1", "key_layer", "normalized"] = spec(
        "l2", help="the update norm ranked: l2, l1, key_layer (L2 over key_layers) or "
                   "normalized (L2 ÷ the global model's L2)")
    key_layers: list[str] | None = spec(None, help="parameter names for norm=key_layer "
                                                   "(default: the last module's tensors)")
    combine: Literal["difference", "rank_mean"] = spec(
        "difference", help="difference: the text's formula; rank_mean: normalized positive "
                           "rank weights (a usable variant)")
    freeze_top: int = spec(0, ge=0, help="w_k = 0 for the top m ranks (diagnostic)")
    dp_b0: float = spec(0.0, ge=0, help="Laplace noise base scale b_0 on ranked norms (0: off)")
    dp_clip: float | None = spec(None, gt=0, help="clip norms to C before the noise (no ε "
                                                  "follows: the scale depends on the rank)")
    hierarchical: bool = spec(False, help="ORDERS per tier, then tier mean by ranked count")
    maturity_window: int = spec(5, ge=2, help="points of the maturity-map fit")
    client_norms: bool = spec(True, help="clients report their norm with the upload (the "
                                         "text's one extra float); else the server computes it")

    def validate(self, cfg: Any = None) -> None:
        num_clients = cfg.clients.num_clients if cfg is not None else None
        if self.participation_threshold > self.participation_horizon:
            raise ConfigError("algorithm.participation_threshold", self.participation_threshold,
                              f"at most algorithm.participation_horizon = "
                              f"{self.participation_horizon}")
        if self.gamma is not None and num_clients is not None and self.gamma > num_clients:
            raise ConfigError("algorithm.gamma", self.gamma,
                              f"a rank in [1, N] with N = {num_clients} clients")


@dataclass
class OrdersState:
    """Server-side memory: per-client norm window, participation rounds, MA trajectory."""

    norms: dict[int, list[float]] = field(default_factory=dict)
    rounds: dict[int, list[int]] = field(default_factory=dict)
    trajectory: dict[int, list[tuple[int, float]]] = field(default_factory=dict)


def rank_weights(n: int, p: OrdersParams) -> np.ndarray:
    """w_k for k = 1..n (float64), after ``freeze_top``."""
    k = np.arange(1, n + 1, dtype=np.float64)
    if p.weighting == "inverse":
        w = 1.0 / k
    elif p.weighting == "smoothed_inverse":
        w = 1.0 / (k + p.offset)
    else:
        gamma = p.gamma if p.gamma is not None else n / 3.0
        w = 1.0 / (1.0 + np.exp(p.beta * (k - gamma)))
    w[: min(p.freeze_top, n)] = 0.0
    return w


def rank_coefficients(w: np.ndarray, combine: str) -> np.ndarray:
    """Coefficients c_k multiplying Δθ_{i_k}: the telescoped difference form
    (c_1 = w_1, c_k = w_k − w_{k−1}) or the normalized rank mean."""
    if combine == "rank_mean":
        total = w.sum()
        return w / total if total > 0 else np.zeros_like(w)
    return np.diff(w, prepend=0.0)


def _l2_rows(rows: np.ndarray) -> np.ndarray:
    """‖row‖₂ of each row, every element cast to float64 before it is squared and summed
    (one row at a time: no float64 copy of the whole (N, P) matrix)."""
    out = np.empty(len(rows), dtype=np.float64)
    for j, row in enumerate(rows):
        r = np.asarray(row, dtype=np.float64)
        out[j] = math.sqrt(float(np.dot(r, r)))
    return out


def update_norms(deltas: np.ndarray, p: OrdersParams, prev: np.ndarray,
                 key_mask: np.ndarray | None = None) -> np.ndarray:
    """Per-row norms of the (N, P) update matrix for the configured variant, computed and
    returned in float64 (a float32 accumulation would tie norms closer than its precision)."""
    if p.norm == "l1":
        n = np.abs(deltas).sum(axis=1, dtype=np.float64)
    elif p.norm == "key_layer":
        n = _l2_rows(deltas[:, key_mask])
    else:
        n = _l2_rows(deltas)
        if p.norm == "normalized":
            n = n / max(float(np.linalg.norm(np.asarray(prev, dtype=np.float64))), p.min_norm)
    return n


def encode_norm(norm: float) -> np.ndarray:
    """A client's reported norm as it is uploaded: the float64's raw bits viewed as one
    int64. Integer tensors cross every payload codec exactly (the fp32 codec would round a
    float64 to float32); 8 bytes plus the tensor's header entry, counted in ``nbytes``."""
    return np.array([norm], dtype=np.float64).view(np.int64)


def decode_norm(value: Any) -> float:
    """The float64 norm of an ``orders.norm`` upload: int64 bits from :func:`encode_norm`
    viewed back as float64; a floating value (an in-process float, an old float32 upload)
    is read as it is."""
    arr = np.asarray(value).reshape(-1)
    if arr.dtype.kind in "iu":
        return float(arr.astype(np.int64, copy=False).view(np.float64)[0])
    return float(arr.astype(np.float64)[0])


def _fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(slope, curvature, steady state) of a short trajectory."""
    r = np.array([x for x, _ in points], dtype=np.float64)
    v = np.array([y for _, y in points], dtype=np.float64)
    steady = float(v.mean())
    if len(points) < 2 or np.ptp(r) == 0:
        return math.nan, math.nan, steady
    slope = float(np.polyfit(r, v, 1)[0])
    curv = float(2 * np.polyfit(r, v, 2)[0]) if len(points) >= 3 else math.nan
    return slope, curv, steady


def orders_step(prev: np.ndarray, deltas: np.ndarray, client_ids: np.ndarray, round: int,
                state: OrdersState, p: OrdersParams, *, server_lr: float = 1.0,
                **kwargs: Any) -> tuple[np.ndarray, OrdersState, dict[str, Any]]:
    """One ORDERS aggregation on flat parameters: θ_t = θ_{t−1} + η Σ_k c_k Δθ_{i_k}
    (float32; η = ``server_lr``, 1 = the text) with :func:`orders_update`'s state and
    diagnostics; ``kwargs`` are its keywords."""
    update, state, diag = orders_update(prev, deltas, client_ids, round, state, p, **kwargs)
    new = (prev.astype(np.float64) + server_lr * update.astype(np.float64)).astype(np.float32)
    return new, state, diag


def orders_update(prev: np.ndarray, deltas: np.ndarray, client_ids: np.ndarray, round: int,
                  state: OrdersState, p: OrdersParams, *, norms: np.ndarray | None = None,
                  tiers: np.ndarray | None = None, rng: np.random.Generator | None = None,
                  key_mask: np.ndarray | None = None
                  ) -> tuple[np.ndarray, OrdersState, dict[str, Any]]:
    """The ORDERS aggregation rule on flat parameters: the pseudo-gradient Σ_k c_k Δθ_{i_k}.

    ``prev`` (P,) is θ_{t−1}; ``deltas`` (N, P) holds the uploads in ascending
    ``client_ids`` order; ``norms`` optionally the clients' reported norms; ``tiers`` the
    tier of each row (used when ``p.hierarchical``); ``rng`` draws the Laplace noise.
    Returns the update (float32, (P,)), the new state (the input is not modified) and
    diagnostics: round-level scalars plus ``per_client`` {client_id: {...}}.
    """
    ids = np.asarray(client_ids, dtype=np.int64)
    if deltas.ndim != 2 or deltas.shape[0] != ids.size or deltas.shape[1] != prev.size:
        raise ValueError(f"deltas must be (N, P) = ({ids.size}, {prev.size}), got "
                         f"{deltas.shape}")
    if ids.size and np.any(np.diff(ids) <= 0):
        raise ValueError("client_ids must be strictly ascending (aggregation runs in "
                         "client-id order)")
    state = copy.deepcopy(state)
    raw = update_norms(deltas, p, prev, key_mask) if norms is None else np.asarray(
        norms, dtype=np.float64)
    raw = np.maximum(raw, p.min_norm)
    smoothed, eligible = _track(ids, raw, round, state, p)
    groups = [np.arange(ids.size)]
    if p.hierarchical and tiers is not None:
        tiers = np.asarray(tiers)
        groups = [np.flatnonzero(tiers == g) for g in sorted(set(tiers.tolist()))]
    ranked = _rank(ids, smoothed, eligible, groups, p, rng)
    update = ranked.coef.astype(np.float32) @ deltas if ids.size else np.zeros_like(prev)
    return update, state, _diagnostics(ids, raw, smoothed, eligible, ranked, update, state, p)


def _track(ids: np.ndarray, raw: np.ndarray, round: int, state: OrdersState,
           p: OrdersParams) -> tuple[np.ndarray, np.ndarray]:
    """Each client's norm history (smoothed over ``smoothing_window``), participation
    within the horizon and maturity trajectory, updated in ``state``; returns the smoothed
    norms and who is eligible for ranking (participated in at least the threshold's rounds
    of the horizon; the threshold ramps up with ``warmup=ramp``)."""
    smoothed = np.empty(ids.size, dtype=np.float64)
    eligible = np.zeros(ids.size, dtype=bool)
    threshold = min(p.participation_threshold, round) if p.warmup == "ramp" \
        else p.participation_threshold
    for j, cid in enumerate(ids.tolist()):
        hist = state.norms.setdefault(cid, [])
        hist.append(float(raw[j]))
        del hist[:-p.smoothing_window]
        smoothed[j] = float(np.mean(hist))
        seen = [r for r in state.rounds.get(cid, []) if r > round - p.participation_horizon]
        seen.append(round)
        state.rounds[cid] = seen
        eligible[j] = len(seen) >= threshold
        traj = state.trajectory.setdefault(cid, [])
        traj.append((round, smoothed[j]))
        del traj[:-p.maturity_window]
    return smoothed, eligible


@dataclass
class Ranking:
    """Per client (in ``ids`` order; NaN for a client not ranked): its coefficient c_k
    (0 unranked), rank, rank weight w_k, and with Laplace noise the noisy norm and b_k."""

    coef: np.ndarray
    rank: np.ndarray
    weight: np.ndarray
    noisy: np.ndarray
    scale: np.ndarray


def _rank(ids: np.ndarray, smoothed: np.ndarray, eligible: np.ndarray,
          groups: list[np.ndarray], p: OrdersParams, rng: np.random.Generator | None
          ) -> Ranking:
    """Rank the eligible clients of each group by smoothed norm, descending (ties by client
    id), through the Laplace noise when ``dp_b0`` > 0 (b_k = b_0 / w_k on the norm, clipped
    to ``dp_clip``), and give them the rank coefficients; a group's coefficients are scaled
    by its share of the ranked clients when there are several groups (hierarchical)."""
    out = Ranking(np.zeros(ids.size), *(np.full(ids.size, np.nan) for _ in range(4)))
    total_ranked = sum(int(eligible[g].sum()) for g in groups)
    for g in groups:
        idx = g[eligible[g]]
        n = idx.size
        if n == 0:
            continue
        order = idx[np.lexsort((ids[idx], -smoothed[idx]))]
        w = rank_weights(n, p)
        if p.dp_b0 > 0:
            with np.errstate(divide="ignore"):
                b = np.where(w > 0, p.dp_b0 / w, np.inf)
            base = smoothed[order] if p.dp_clip is None else np.minimum(smoothed[order],
                                                                        p.dp_clip)
            gen = rng if rng is not None else np.random.default_rng(0)
            draw = gen.laplace(0.0, 1.0, size=n)
            with np.errstate(invalid="ignore"):  # b = ∞: the limit, ±∞ by the draw's sign
                noise = np.where(np.isfinite(b), b * draw, np.copysign(np.inf, draw))
            out.noisy[order] = base + noise
            out.scale[order] = b
            order = idx[np.lexsort((ids[idx], -out.noisy[idx]))]
        c = rank_coefficients(w, p.combine)
        share = n / total_ranked if len(groups) > 1 else 1.0
        out.coef[order] = share * c
        out.rank[order] = np.arange(1, n + 1)
        out.weight[order] = w
    return out


def _diagnostics(ids: np.ndarray, raw: np.ndarray, smoothed: np.ndarray,
                 eligible: np.ndarray, ranked: Ranking, update: np.ndarray,
                 state: OrdersState, p: OrdersParams) -> dict[str, Any]:
    """Round-level scalars plus ``per_client`` {client_id: {...}} (norms, rank, weight,
    coefficient, participations, maturity fit; the noise with ``dp_b0``)."""
    coef, scale = ranked.coef, ranked.scale
    per_client = {}
    for j, cid in enumerate(ids.tolist()):
        slope, curv, steady = _fit(state.trajectory[cid])
        per_client[cid] = {
            "orders/norm": float(raw[j]), "orders/smoothed_norm": float(smoothed[j]),
            "orders/eligible": float(eligible[j]), "orders/rank": float(ranked.rank[j]),
            "orders/weight": float(ranked.weight[j]), "orders/coefficient": float(coef[j]),
            "orders/participations": float(len(state.rounds[cid])),
            "orders/maturity_slope": slope, "orders/maturity_curvature": curv,
            "orders/maturity_steady": steady,
        }
        if p.dp_b0 > 0:
            per_client[cid]["orders/noisy_norm"] = float(ranked.noisy[j])
            per_client[cid]["orders/noise_scale"] = float(scale[j])
    s = smoothed[eligible]
    finite_b = scale[np.isfinite(scale)]
    diag: dict[str, Any] = {
        "ranked": float(eligible.sum()), "excluded": float((~eligible).sum()),
        "coefficient_sum": float(coef.sum()),
        "negative_coefficients": float((coef < 0).sum()),
        "norm_skewness": skewness(raw), "smoothed_norm_mean": float(s.mean()) if s.size else 0.0,
        "update_norm": float(np.linalg.norm(update.astype(np.float64))),
        "per_client": per_client,
    }
    if p.dp_b0 > 0 and finite_b.size:
        diag.update(noise_scale_min=float(finite_b.min()), noise_scale_max=float(
            finite_b.max()), noise_scale_mean=float(finite_b.mean()))
    return diag


def skewness(x: np.ndarray) -> float:
    """Sample skewness E[z³] of ``x`` (NaN for fewer than 3 values or no spread): the text's
    health signal, healthy norm distributions being right-skewed (> 0)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size < 3 or x.std() == 0:
        return math.nan
    z = (x - x.mean()) / x.std()
    return float((z ** 3).mean())


class OrdersPolicy(AggregationPolicy):
    """:func:`orders_update` over fedray's named-tensor states; the update goes to the run's
    server optimizer (``sgd`` with η = 1 by default: the text's θ_{t−1} + Σ_k c_k Δθ_{i_k})."""

    def __init__(self, params: OrdersParams, seed: int,
                 tier_of: Callable[[int], str] | None = None, optimizer: Any = None):
        from fedray.services.server_opt import SGD

        self.p, self.seed, self.tier_of = params, seed, tier_of
        self.state = OrdersState()
        self.optimizer = optimizer if optimizer is not None else SGD.of()

    def aggregate(self, global_state: State, updates: list, round: int):
        from fedray.core.seeding import rng

        names = [k for k in global_state if k in updates[0][2]]
        prev = np.concatenate([global_state[k].reshape(-1) for k in names]).astype(np.float32)
        deltas = np.stack([np.concatenate([np.asarray(u[k], dtype=np.float32).reshape(-1)
                                           for k in names]) for _, _, u in updates])
        ids = np.array([cid for cid, _, _ in updates])
        reported = [u.get("orders.norm") for _, _, u in updates]
        norms = None if not self.p.client_norms or any(r is None for r in reported) else np.array(
            [decode_norm(r) for r in reported], dtype=np.float64)
        if norms is not None and not np.isfinite(norms).all():
            norms = None  # a corrupt report (the bits bypass the NaN check): recompute here
        tiers = np.array([self.tier_of(c) for c in ids]) if self.tier_of else None
        mask = None
        if self.p.norm == "key_layer":
            mask = key_layer_mask({k: global_state[k] for k in names}, self.p.key_layers)
        update, self.state, diag = orders_update(
            prev, deltas, ids, round, self.state, self.p, norms=norms, tiers=tiers,
            rng=rng(self.seed, round, -1, "orders-dp"), key_mask=mask)
        delta, offset = {}, 0
        for k in names:
            size = global_state[k].size
            delta[k] = update[offset:offset + size].reshape(global_state[k].shape)
            offset += size
        out, metrics = self.optimizer.step(global_state, delta)
        return out, {**diag, **metrics}

    def state_dict(self) -> dict[str, Any]:
        """Plain data (dicts keyed by client id, lists, (round, value) tuples)."""
        return {"state": dataclasses.asdict(self.state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = OrdersState(**copy.deepcopy(state["state"]))


def key_layer_names(names: list[str], key_layers: list[str] | None) -> list[str]:
    """The parameters of the key layer: ``key_layers`` if given, else the tensors of the
    last module (the classifier), e.g. ``net.3.weight`` and ``net.3.bias``."""
    if key_layers:
        missing = [k for k in key_layers if k not in names]
        if missing:
            raise ConfigError("algorithm.key_layers", missing, f"parameter names among {names}")
        return list(key_layers)
    prefix = names[-1].rsplit(".", 1)[0]
    return [n for n in names if n.rsplit(".", 1)[0] == prefix]


def key_layer_mask(state: State, key_layers: list[str] | None) -> np.ndarray:
    names = list(state)
    keep = set(key_layer_names(names, key_layers))
    return np.concatenate([np.full(state[k].size, k in keep) for k in names])
