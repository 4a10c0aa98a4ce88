"""Byzantine-robust aggregation rules as free functions on the round's updates.

Each rule takes the updates as the rows of one float64 matrix ``X`` (n clients × d, the
clients in client-id order, each client's tensors flattened in name order) and returns a
:class:`Robust`: the aggregate (d,) and, per client, the weight it had in it relative to a
plain mean (``kept``: 1 = as in the mean, 0 = excluded; what the defence did to it, for
detection precision and recall against the malicious set). Ties are broken by the lower
row (the lower client id), so the result depends on the updates alone.

- ``krum`` / ``multi_krum`` (Blanchard et al., NeurIPS 2017): score(i) = the sum of the
  squared distances from Δ_i to its n − f − 2 nearest other updates; Krum returns the
  update of the lowest score, Multi-Krum the mean of the m lowest (m = n − f by default).
  Needs n > 2f + 2 (at least one neighbour after excluding f + 1).
- ``median`` (Yin et al., ICML 2018): the coordinate-wise median (the mean of the two
  middle values for even n, as ``numpy.median`` and Flower's FedMedian).
- ``trimmed_mean`` (Yin et al., ICML 2018): per coordinate, drop the ⌊βn⌋ largest and the
  ⌊βn⌋ smallest values and average the rest (``scipy.stats.trim_mean``'s count, Flower's
  FedTrimmedAvg); needs 2⌊βn⌋ < n.
- ``bulyan`` (El Mhamdi et al., ICML 2018): θ = n − 2f updates chosen by Krum one after
  another (each time among those left, scores recomputed on them, at least one neighbour
  counted), then per coordinate the
  mean of the β = θ − 2f values closest to the coordinate's median of the chosen. Needs
  n ≥ 4f + 3.
- ``norm_bound`` (Sun et al., "Can you really backdoor federated learning?", 2019): every
  update scaled to L2 norm at most M, then the (sample-weighted) mean.
- ``centered_clip`` (Karimireddy et al., ICML 2021, eq. 2): from the previous round's
  aggregate v (zero at the first round), ``L`` times v ← v + (1/n) Σ_i clip_τ(Δ_i − v)
  with clip_τ(z) = z · min(1, τ / ‖z‖).
- ``fltrust`` (Cao et al., NDSS 2021, Algorithm 2 and eqs. 4–6): the server's own update
  g₀ (trained on its root dataset from the same global model), each client's trust score
  TS_i = ReLU(cos(Δ_i, g₀)), its update rescaled to g₀'s norm, ḡ_i = (‖g₀‖ / ‖Δ_i‖) Δ_i,
  and the aggregate Σ_i TS_i ḡ_i / Σ_j TS_j (zero when every score is zero: the model
  does not move). ``kept`` is TS_i (0: excluded). A zero update (or a zero g₀) scores 0.

The coordinate-wise and selection rules are unweighted (the papers' rules); ``kept`` of a
coordinate-wise rule is the share of coordinates in which the client's value entered the
result (for the median: was one of the middle values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RULES = ("none", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_bound",
         "centered_clip", "fltrust")


@dataclass
class Robust:
    """A rule's aggregate (float64, d) and each client's weight in it relative to a plain
    mean (``kept``, n values in [0, 1])."""

    aggregate: np.ndarray
    kept: np.ndarray


def requirement(rule: str, n: int, f: int, trim: float = 0.0, m: int | None = None
                ) -> tuple[str, str] | None:
    """What ``rule`` needs of n updates with f assumed malicious, as (the knob that breaks
    it: ``f``, ``m`` or ``trim``; the rule in words), or None: it holds."""
    if rule in ("krum", "multi_krum") and not n > 2 * f + 2:
        return "f", f"n > 2f + 2 updates per round (n = {n}, f = {f})"
    if rule == "multi_krum" and m is not None and not 1 <= m <= n - f:
        return "m", f"1 <= m <= n - f (m = {m}, n = {n}, f = {f})"
    if rule == "bulyan" and not n >= 4 * f + 3:
        return "f", f"n >= 4f + 3 updates per round (n = {n}, f = {f})"
    if rule == "trimmed_mean" and not 2 * int(np.floor(trim * n)) < n:
        return "trim", f"2 floor(trim * n) < n (trim = {trim}, n = {n})"
    if rule == "median" and n < 1:
        return "f", "at least one update"
    return None


def _check(rule: str, x: np.ndarray, f: int, trim: float = 0.0, m: int | None = None) -> None:
    why = requirement(rule, len(x), f, trim, m)
    if why:
        raise ValueError(f"robust.rule={rule} needs {why[1]}")


def squared_distances(x: np.ndarray) -> np.ndarray:
    """The rows' squared pairwise L2 distances (n × n, from the Gram matrix)."""
    sq = (x * x).sum(1)
    return np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0)


def krum_scores(dist: np.ndarray, f: int) -> np.ndarray:
    """From the rows' :func:`squared_distances`, each row's sum of them to its
    max(1, n − f − 2) nearest other rows (the max only matters inside Bulyan, whose last
    Krum rounds see fewer rows: Flower's convention)."""
    dist = dist.copy()
    np.fill_diagonal(dist, np.inf)  # a row is not its own neighbour
    k = max(1, len(dist) - f - 2)
    return np.sort(dist, axis=1)[:, :k].sum(1)


def multi_krum(x: np.ndarray, f: int, m: int | None = None) -> Robust:
    """The mean of the m rows of lowest Krum score (m = 1: Krum; default n − f)."""
    m = len(x) - f if m is None else m
    _check("multi_krum", x, f, m=m)
    chosen = np.argsort(krum_scores(squared_distances(x), f), kind="stable")[:m]
    kept = np.zeros(len(x))
    kept[chosen] = len(x) / m
    return Robust(x[np.sort(chosen)].mean(0), np.minimum(kept, 1.0))


def krum(x: np.ndarray, f: int) -> Robust:
    """The row of lowest Krum score."""
    _check("krum", x, f)
    return multi_krum(x, f, 1)


def median(x: np.ndarray) -> Robust:
    _check("median", x, 0)
    med = np.median(x, axis=0)
    lo, hi = np.sort(x, axis=0)[[(len(x) - 1) // 2, len(x) // 2]]
    kept = ((x >= lo) & (x <= hi)).mean(1)
    return Robust(med, kept)


def trimmed_mean(x: np.ndarray, trim: float) -> Robust:
    _check("trimmed_mean", x, 0, trim)
    n = len(x)
    k = int(np.floor(trim * n))
    order = np.argsort(x, axis=0, kind="stable")
    inner = order[k:n - k]
    agg = np.take_along_axis(x, inner, 0).mean(0)
    kept = np.zeros(n)
    np.add.at(kept, inner.ravel(), 1.0)
    return Robust(agg, kept / x.shape[1])


def bulyan(x: np.ndarray, f: int) -> Robust:
    _check("bulyan", x, f)
    n = len(x)
    left = list(range(n))
    chosen = []
    dist = squared_distances(x)  # once: Krum among those left reads its sub-matrix
    for _ in range(n - 2 * f):
        best = left[int(np.argmin(krum_scores(dist[np.ix_(left, left)], f)))] \
            if len(left) > 1 else left[0]
        chosen.append(best)
        left.remove(best)
    sel = x[sorted(chosen)]
    beta = len(sel) - 2 * f
    med = np.median(sel, axis=0)
    closest = np.argsort(np.abs(sel - med), axis=0, kind="stable")[:beta]
    agg = np.take_along_axis(sel, closest, 0).mean(0)
    kept = np.zeros(n)
    rows = np.asarray(sorted(chosen))
    np.add.at(kept, rows[closest.ravel()], 1.0)
    return Robust(agg, kept / x.shape[1] * n / beta)


def norm_bound(x: np.ndarray, bound: float, weights: np.ndarray | None = None) -> Robust:
    norms = np.linalg.norm(x, axis=1)
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    w = np.full(len(x), 1.0 / len(x)) if weights is None else weights / weights.sum()
    return Robust((w * scale) @ x, scale)


def centered_clip(x: np.ndarray, tau: float, iters: int, start: np.ndarray | None
                  ) -> Robust:
    v = np.zeros(x.shape[1]) if start is None else np.asarray(start, np.float64).copy()
    scale = np.ones(len(x))
    for _ in range(iters):
        z = x - v
        scale = np.minimum(1.0, tau / np.maximum(np.linalg.norm(z, axis=1), 1e-300))
        v = v + (scale[:, None] * z).mean(0)
    return Robust(v, scale)


def fltrust(x: np.ndarray, reference: np.ndarray) -> Robust:
    """FLTrust's aggregate of the rows of ``x`` against the server's update ``reference``."""
    g0 = float(np.linalg.norm(reference))
    norms = np.linalg.norm(x, axis=1)
    ok = (norms > 0) & (g0 > 0)
    safe = np.where(ok, norms, 1.0)
    trust = np.where(ok, np.maximum(x @ reference / (safe * (g0 or 1.0)), 0.0), 0.0)
    if not trust.sum() > 0:
        return Robust(np.zeros(x.shape[1]), trust)
    scaled = x * (np.where(ok, g0 / safe, 0.0) * trust)[:, None]
    return Robust(scaled.sum(0) / trust.sum(), trust)
