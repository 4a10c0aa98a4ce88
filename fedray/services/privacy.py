"""Central, client-level differential privacy: DP-FedAvg (McMahan et al., ICLR 2018) with an
accountant from Google's ``dp-accounting`` (RDP or PLD), optional adaptive clipping
(Andrew et al., NeurIPS 2021).

One round's release, on the server after the uploads are decoded (the trusted server of
central DP; the transform chain's codecs have run, so the bound holds on exactly what is
aggregated, whatever the compression):

1. each accepted client's update Δ_i (as the method's :meth:`Algorithm.to_delta` states it:
   the FedAvg family uploads Δ itself, FLITE its latent minus the broadcast latent) is
   clipped jointly over all its tensors to ``‖Δ_i‖₂ ≤ C``;
2. the clipped updates are summed *unweighted* and Gaussian noise N(0, (z·C)² I) is added to
   the sum — drawn from ``rng(seed, round, -1, "dp-noise")``, so a run repeats bit for bit;
3. the sum is divided by a fixed denominator: the cohort size K (``sampling=fixed``) or the
   expected cohort q·N (``sampling=poisson``) — McMahan et al.'s estimator f̃_f, whose
   sensitivity does not depend on who reported. Every round releases, even one in which
   nobody reported (an empty Poisson draw, all uploads lost): then the mean is noise alone,
   applied as the update of a pseudo-client -1, so that whether a round "happened" reveals
   nothing either;
4. every accepted client's update is replaced by that privatized mean with unit weight, and
   the method's server rule runs on them (post-processing: no privacy cost). A rule that
   averages (FedAvg, FedProx, FedAvgM, FLITE's latent mean) gets the mean itself and applies
   its server step (η_s, server momentum); FedBuff scales it by the buffer's mean staleness
   weight (``reducer=buffer``; ``weighted`` takes the mean itself); ORDERS ranks equal
   norms, so its rank coefficients sum to one factor on the mean (the top rank's weight
   with ``combine=difference``). By design, what DP hides is exactly
   the per-client information such rules would read: norms, staleness per client, sample
   counts.

Adaptive clipping (Andrew et al., Alg. 1): each client also reports b_i = 1[‖Δ_i‖ ≤ C],
centred to b_i − ½ (sensitivity ½, as TF Privacy's quantile estimator); the server releases
b̄ = clamp((Σ (b_i − ½) + N(0, σ_b²)) / K + ½, 0, 1) and sets C ← C·exp(−η_C (b̄ − γ)). The
two releases together are one Gaussian mechanism of multiplier z = (z_Δ⁻² + (2σ_b)⁻²)^(−1/2)
(their Thm. 1), so the update noise is z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) for the accounted z.

Accounting. ``z`` is always noise std over the clip C; what the accountant receives is
noise std over the sensitivity of the released sum:

- ``sampling=poisson`` (every client joins with q = K/N; add/remove-one: sensitivity C):
  Poisson-subsampled Gaussian of multiplier z, RDP or PLD;
- ``sampling=fixed`` (K of N without replacement; replace-one: one client's clipped update
  swapped for another moves the sum by up to 2C): the sampled-without-replacement Gaussian
  of multiplier z/2, RDP only (dp-accounting's PLD does not cover it);
- no sampling (``sampling=fixed`` with K = N, and the asynchronous rules FedBuff and
  FedAsync: each server step releases the noisy sum of one buffer, which fills with whoever
  finishes first — no uniform sampling, so no amplification; :meth:`Algorithm.dp_cohort`
  says the cohort: (B, B) for a buffer of B): a plain Gaussian of multiplier z/2 per
  release, composed. ``dp.accountant=auto`` (the default) accounts it with its exact privacy
  loss distribution (PLD): T composed Gaussians are one Gaussian, μ-GDP with μ = 2√T/z,
  whose PLD has Balle & Wang's closed form (:func:`gaussian_epsilon`), evaluated directly —
  dp-accounting's discretized PLD meets it within 0.1 % (tested) but costs seconds per ε.
  RDP is a valid but looser bound (z = 4, 100 releases: 35.08 against the exact 33.10).
  Elsewhere ``auto`` is RDP.

dp-accounting 0.6 is not consistent across its accountants under replace-one: its RDP
accountant reads a Gaussian event's multiplier as std over the sensitivity and leaves the
factor 2 to the caller (google/differential-privacy#378; fedray passes z/2), while its PLD
accountant applies the factor itself. :func:`check_convention` verifies the RDP convention
against a reference that does not depend on it before the first replace-one ε of a process,
so a library upgrade that moves the factor (the open google/differential-privacy#464 would)
stops with an error instead of silently changing ε.

ε is reported at δ (default min(1/N^1.1, 1e-5)) after every release. The accountant
assumes who contributes is decided by data-independent randomness, so DP refuses fleet
availability (who is online decides who is sampled), over-commitment (the first K to
finish, which depends on the others' data, are kept) and ``fleet.min_reports`` (whether a
round releases would depend on the data).

What the guarantee covers: the sequence of global models (and what is computed from them
alone). The simulator's own logs are not private: per-client rows (train loss, sample
counts, a method's per-client diagnostics such as ORDERS' norms), and the noise and the
sample are functions of the run's seed, which ``config.yaml`` stores — a deployment would
draw them from secret randomness. ε is therefore the guarantee the simulated deployment
would have, not a property of the run directory.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedray.core.seeding import rng
from fedray.core.spec import ConfigError

State = dict[str, np.ndarray]

__all__ = ["CentralDP", "calibrate_noise", "check_config", "check_convention", "clip_update",
           "default_delta", "epsilon", "gaussian_epsilon", "noise_multiplier", "poisson_sample",
           "resolve_accountant", "update_noise_multiplier"]


def default_delta(num_clients: int) -> float:
    """δ = min(1/N^1.1, 1e-5): below 1/N, the custom for client-level guarantees (McMahan et
    al. use 1/N^1.1 at N ≈ 760,000), and never looser than 1e-5 for small populations."""
    return min(1.0 / float(num_clients) ** 1.1, 1e-5)


def resolve_accountant(accountant: str, n: int, k: int, sampling: str) -> str:
    """``dp.accountant`` as run: ``auto`` is PLD where it is exact — a release without
    sampling (K = N under fixed sampling, an asynchronous buffer) — and RDP elsewhere
    (Poisson sampling: the established default; fixed K < N: the only accountant
    dp-accounting has for sampling without replacement)."""
    if accountant != "auto":
        return accountant
    return "pld" if sampling == "fixed" and k >= n else "rdp"


def _event(z: float, releases: int, n: int, k: int, sampling: str) -> Any:
    """``releases`` rounds of noise z·C on a sum of clipped updates, as dp-accounting events
    for its RDP accountant (whose multiplier is std over sensitivity: C under add/remove, 2C
    under replace-one — the caller's factor, :func:`check_convention`) or, under Poisson
    sampling, its PLD accountant."""
    import dp_accounting as dpa

    if sampling == "poisson":
        one = dpa.PoissonSampledDpEvent(k / n, dpa.GaussianDpEvent(z))
    elif k < n:
        one = dpa.SampledWithoutReplacementDpEvent(n, k, dpa.GaussianDpEvent(z / 2))
    else:
        one = dpa.GaussianDpEvent(z / 2)
    return dpa.SelfComposedDpEvent(one, releases)


def _unsampled(sampling: str, n: int, k: int) -> bool:
    return sampling == "fixed" and k >= n


def _accountant(kind: str, sampling: str) -> Any:
    import dp_accounting as dpa

    relation = (dpa.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling == "poisson"
                else dpa.NeighboringRelation.REPLACE_ONE)
    return _library_accountant(kind, relation)


def _library_accountant(kind: str, relation: Any) -> Any:
    from dp_accounting import pld, rdp

    if kind == "pld":
        return pld.PLDAccountant(relation, value_discretization_interval=PLD_GRID)
    return rdp.RdpAccountant(neighboring_relation=relation)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε at ``delta`` of a μ-GDP mechanism — T composed Gaussians of multiplier σ
    (std over sensitivity) are μ = √T/σ — from Balle & Wang (ICML 2018, Thm. 8):
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), solved for ε."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def gap(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2)
                     - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta)

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
    return float(brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-12))


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-accounting")
    except PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def check_convention() -> None:
    """Stop, with one line, when the installed dp-accounting's RDP accountant does not read
    replace-one Gaussians as std over the sensitivity (fedray passes z/2 for the sum's
    sensitivity 2C). The known case: z = 2, 10 releases, δ = 1e-5, computed both ways —
    through fedray's replace-one events (everyone released, plainly and as a fully sampled
    draw without replacement, which #464 would rescale too) and from add/remove-one RDP of
    multiplier z/2 (sensitivity C: a reading that does not depend on the convention)."""
    import dp_accounting as dpa

    z, releases, n, delta = 2.0, 10, 5, 1e-5
    relation = dpa.NeighboringRelation
    with _quiet():
        ref = _library_accountant("rdp", relation.ADD_OR_REMOVE_ONE)
        ref.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z / 2), releases))
        want = float(ref.get_epsilon(delta))
        cases = {"everyone released": _event(z, releases, n, n, "fixed"),
                 "a fully sampled draw without replacement": dpa.SelfComposedDpEvent(
                     dpa.SampledWithoutReplacementDpEvent(n, n, dpa.GaussianDpEvent(z / 2)),
                     releases)}
        for what, event in cases.items():
            acc = _library_accountant("rdp", relation.REPLACE_ONE)
            acc.compose(event)
            got = float(acc.get_epsilon(delta))
            if abs(got - want) > 1e-9 * want:
                raise ConfigError(
                    "dp.accountant", "rdp",
                    f"a dp-accounting whose RDP accountant reads a replace-one Gaussian's "
                    f"multiplier as std over the sensitivity (fedray passes z/2): "
                    f"dp-accounting {_library_version()} gives ε = {got:.4f} where that "
                    f"reading gives {want:.4f} ({what}, z = 2, 10 releases, δ = 1e-5), so "
                    f"it moved the replace-one factor and fedray would mis-account; install "
                    f"dp-accounting 0.6 or a fedray that knows this version (Poisson "
                    f"sampling, which is add/remove-one, is unaffected)")


def _exact_unsampled(z: float, releases: int, delta: float) -> float:
    """ε of ``releases`` Gaussians of multiplier z/2 (replace-one, everyone released)."""
    return gaussian_epsilon(2.0 * math.sqrt(releases) / z, delta)


@functools.lru_cache(maxsize=4096)
def epsilon(z: float, releases: int, *, n: int, k: int, delta: float,
            accountant: str = "rdp", sampling: str = "fixed") -> float:
    """ε at ``delta`` after ``releases`` rounds of the Gaussian mechanism with multiplier
    ``z``, cohorts of ``k`` out of ``n`` clients (``sampling``: fixed or Poisson with
    q = k/n). 0 before the first release, inf without noise."""
    if releases <= 0:
        return 0.0
    if z <= 0:
        return math.inf
    accountant = resolve_accountant(accountant, n, k, sampling)
    if accountant == "pld" and _unsampled(sampling, n, k):
        return _exact_unsampled(float(z), int(releases), delta)
    if sampling == "fixed":
        check_convention()
    acc = _accountant(accountant, sampling)
    with _quiet():
        acc.compose(_event(float(z), int(releases), n, k, sampling))
        return float(acc.get_epsilon(delta))


MIN_NOISE = 0.1  # the smallest multiplier calibration returns (PLD's grid grows as 1/z²)
PLD_GRID = 1e-3  # PLD's privacy-loss discretization (pessimistic rounding: still a bound)


@contextlib.contextmanager
def _quiet():
    """dp-accounting's RDP logs a warning per order it drops (a convergence limit of
    fractional orders at small z); the bound it returns stays valid, so hide them."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@functools.lru_cache(maxsize=256)
def calibrate_noise(target_epsilon: float, releases: int, *, n: int, k: int, delta: float,
                    accountant: str = "rdp", sampling: str = "fixed") -> float:
    """The smallest multiplier z whose ε after ``releases`` rounds is at most
    ``target_epsilon`` (dp-accounting's bisection, tolerance 1e-3 on z; without sampling
    under PLD the closed form is solved for μ instead)."""
    import dp_accounting as dpa

    accountant = resolve_accountant(accountant, n, k, sampling)
    if accountant == "pld" and _unsampled(sampling, n, k):
        return max(MIN_NOISE, _solve_unsampled(target_epsilon, releases, delta))
    if sampling == "fixed":
        check_convention()
    if epsilon(MIN_NOISE, releases, n=n, k=k, delta=delta, accountant=accountant,
               sampling=sampling) <= target_epsilon:
        return MIN_NOISE
    bracket = dpa.LowerEndpointAndGuess(MIN_NOISE, 1.0)
    if accountant == "pld":  # PLD is tighter than RDP: z_pld <= z_rdp brackets the search
        hi = calibrate_noise(target_epsilon, releases, n=n, k=k, delta=delta,
                             accountant="rdp", sampling=sampling)
        bracket = dpa.ExplicitBracketInterval(MIN_NOISE, hi)
    with _quiet():
        return float(dpa.calibrate_dp_mechanism(
            lambda: _accountant(accountant, sampling),
            lambda z: _event(z, releases, n, k, sampling), target_epsilon, delta,
            bracket_interval=bracket, tol=1e-3))


def _solve_unsampled(target_epsilon: float, releases: int, delta: float) -> float:
    """The z whose exact ε (:func:`_exact_unsampled`) is ``target_epsilon``, rounded up so
    that it never exceeds it."""
    from scipy.optimize import brentq

    lo, hi = 1e-6, 1.0
    while gaussian_epsilon(hi, delta) < target_epsilon:
        hi *= 2
    mu = brentq(lambda m: gaussian_epsilon(m, delta) - target_epsilon, lo, hi,
                xtol=1e-12, rtol=1e-12)
    z = 2.0 * math.sqrt(releases) / mu
    while _exact_unsampled(z, releases, delta) > target_epsilon:
        z *= 1 + 1e-9
    return z


def _count_noise(dp: Any, k: int) -> float:
    return dp.count_noise if dp.count_noise is not None else k / 20.0


def update_noise_multiplier(z: float, count_noise: float | None) -> float:
    """The update's share z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) of an accounted multiplier ``z``
    when a clipped count with noise σ_b is released too (Andrew et al., Thm. 1); ``z``
    itself without one. NaN when 2σ_b ≤ z (the count alone would spend the budget)."""
    if count_noise is None or z == 0:
        return z
    rest = z ** -2 - (2.0 * count_noise) ** -2
    return rest ** -0.5 if rest > 0 else math.nan


def _cohort(cfg: Any) -> tuple[int, int]:
    """(population, reports per release) for the accountant and the denominator: the
    method's :meth:`Algorithm.dp_cohort` (default N and K)."""
    from fedray.core import registry

    return registry.method_of(cfg).dp_cohort(cfg)


def noise_multiplier(cfg: Any) -> float:
    """The accounted multiplier z: ``dp.noise_multiplier``, or the one calibrated to
    ``dp.target_epsilon`` over ``rounds`` releases."""
    dp = cfg.dp
    if dp.noise_multiplier is not None:
        return float(dp.noise_multiplier)
    n, k = _cohort(cfg)
    return calibrate_noise(float(dp.target_epsilon), int(cfg.rounds), n=n, k=k,
                           delta=_delta(cfg), accountant=dp.accountant, sampling=dp.sampling)


def _delta(cfg: Any) -> float:
    d = cfg.dp.delta
    return float(d) if d is not None else default_delta(cfg.clients.num_clients)


def check_config(cfg: Any) -> None:
    """The rules of ``dp.*`` with ``dp.enabled`` (a :class:`ConfigError` naming the key)."""
    from fedray.core import registry

    dp = cfg.dp
    method = registry.method_of(cfg)
    name = method.name
    registry.require(method, "dp", "dp.enabled", True)
    n, k = _cohort(cfg)
    if n == k and dp.sampling == "poisson" and k < cfg.clients.num_clients:
        raise ConfigError("dp.sampling", "poisson", f"fixed for {name} (its releases are "
                                                    f"accounted without sampling)")
    if (dp.noise_multiplier is None) == (dp.target_epsilon is None):
        raise ConfigError("dp.noise_multiplier", dp.noise_multiplier,
                          "exactly one of dp.noise_multiplier and dp.target_epsilon")
    if dp.noise_multiplier == 0 and not dp.allow_no_noise:
        raise ConfigError("dp.noise_multiplier", 0, "> 0: no noise gives ε = ∞, no privacy "
                                                    "at all (for a clipping-only baseline "
                                                    "add -s dp.allow_no_noise=true)")
    if dp.accountant == "pld" and dp.sampling == "fixed" and k < n:
        raise ConfigError("dp.accountant", "pld", f"rdp or auto with dp.sampling=fixed and "
                                                  f"{k} of {n} clients per release (PLD has "
                                                  f"no sampling without replacement; it "
                                                  f"accounts Poisson sampling, and releases "
                                                  f"without sampling exactly)")
    if dp.sampling == "fixed" and resolve_accountant(dp.accountant, n, k, "fixed") == "rdp":
        check_convention()
    if cfg.fleet.availability is not None:
        raise ConfigError("fleet.availability", cfg.fleet.availability,
                          "unset with dp.enabled (the accountant assumes uniform sampling)")
    if cfg.fleet.overcommit:
        raise ConfigError("fleet.overcommit", cfg.fleet.overcommit,
                          "0 with dp.enabled (which K of the over-committed clients report "
                          "would depend on the others' data)")
    if cfg.fleet.min_reports:
        raise ConfigError("fleet.min_reports", cfg.fleet.min_reports,
                          "0 with dp.enabled (every round releases, reports or not)")
    try:
        z = noise_multiplier(cfg)
    except Exception as e:  # noqa: BLE001 — the library's own reason, one line
        raise ConfigError("dp.target_epsilon", dp.target_epsilon,
                          f"a budget the accountant can reach ({e})") from None
    if dp.adaptive_clip and math.isnan(update_noise_multiplier(z, _count_noise(dp, k))):
        raise ConfigError("dp.count_noise", _count_noise(dp, k),
                          f"more than z/2 = {z / 2:g} (the clipped-count noise would spend "
                          f"the whole budget)")


def clip_update(update: State, clip: float) -> tuple[dict[str, np.ndarray], float]:
    """``update`` scaled jointly so that its L2 norm over all tensors is at most ``clip``
    (float64), and its norm before clipping."""
    norm = math.sqrt(sum(float(np.square(np.asarray(v, np.float64)).sum())
                         for v in update.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {k: np.asarray(v, np.float64) * scale for k, v in update.items()}, norm


def poisson_sample(seed: int, round: int, num_clients: int, q: float) -> list[int]:
    """Every client independently with probability ``q`` (SplitMix64 of (seed, round,
    client): no per-population state), in id order."""
    from fedray.core.seeding import uniform

    draws = uniform(seed, round, np.arange(num_clients, dtype=np.int64), "dp-poisson")
    return np.flatnonzero(draws < q).tolist()


class CentralDP:
    """One run's DP-FedAvg release and its accountant (module docstring).

    ``to_delta(global_state, upload)`` and ``from_delta(global_state, mean)`` are the
    method's hooks between its upload and the vector that is clipped."""

    def __init__(self, cfg: Any, to_delta: Callable[[State, State], State],
                 from_delta: Callable[[State, State], State]):
        dp = cfg.dp
        self.seed = cfg.seed
        self.n, self.k = _cohort(cfg)
        self.delta, self.delta_set = _delta(cfg), dp.delta is not None
        self.z = noise_multiplier(cfg)
        self.count_noise = _count_noise(dp, self.k) if dp.adaptive_clip else None
        self.z_update = update_noise_multiplier(self.z, self.count_noise)
        self.denominator = float(self.k)  # K, or the expected Poisson cohort q·N = K
        self.clip = float(dp.clip_norm)
        self.adaptive = dp.adaptive_clip
        self.quantile, self.clip_lr = dp.target_quantile, dp.clip_lr
        self.sampling = dp.sampling
        self.accountant = resolve_accountant(dp.accountant, self.n, self.k, dp.sampling)
        self.to_delta, self.from_delta = to_delta, from_delta
        self.releases = 0
        self.template: dict[str, tuple[int, ...]] | None = None  # the update's tensors

    def epsilon(self) -> float:
        return epsilon(self.z, self.releases, n=self.n, k=self.k, delta=self.delta,
                       accountant=self.accountant, sampling=self.sampling)

    def privatize(self, global_state: State, uploads: list[State], round: int
                  ) -> tuple[State, dict[str, float]]:
        """The privatized mean (in upload form, via ``from_delta``) of one round's decoded
        uploads (none: noise alone), and the round's DP metrics."""
        deltas = [self.to_delta(global_state, u) for u in uploads]
        if deltas:
            self.template = {k: tuple(np.shape(v)) for k, v in deltas[0].items()}
        elif self.template is None:  # nobody has reported yet: the update's full shape
            zero = {k: np.zeros_like(v) for k, v in global_state.items()}
            self.template = {k: tuple(np.shape(v))
                             for k, v in self.to_delta(global_state, zero).items()}
        names = list(self.template)
        if any(list(d) != names or any(np.shape(d[k]) != self.template[k] for k in names)
               for d in deltas):
            raise ValueError("DP needs every client's update to have the same tensors")
        total = {k: np.zeros(self.template[k], np.float64) for k in names}
        within = 0
        for d in deltas:
            clipped, norm = clip_update(d, self.clip)
            within += norm <= self.clip
            for k in names:
                total[k] += clipped[k]
        return self.release(global_state, total, within, len(deltas), round)

    def release(self, global_state: State, total: State, within: int, count: int, round: int,
                slack: float = 0.0) -> tuple[State, dict[str, float]]:
        """The round's release from ``total`` = Σ of ``count`` clipped updates, ``within``
        of which were inside the clip before clipping: Gaussian noise of std z·C on the sum,
        divided by K (or q·N). :meth:`privatize` computes the sum here; secure aggregation
        (:mod:`fedray.services.secure_round`) hands over the unmasked sum of the clients'
        own clipped, quantized updates — the server's noise comes after unmasking, calibrated
        to C + ``slack``, the bound a quantized clipped update really has."""
        names = list(total)
        if self.template is None:
            self.template = {k: tuple(np.shape(v)) for k, v in total.items()}
        g = rng(self.seed, round, -1, "dp-noise")
        std = self.z_update * (self.clip + slack)
        mean = {k: ((total[k] + g.standard_normal(np.shape(total[k])) * std)
                    / self.denominator).astype(np.float32) for k in names}
        used = self.clip
        metrics = {"dp_clip": used, "dp_noise_std": std / self.denominator}
        if self.adaptive:  # centred count: sensitivity 1/2 (Andrew et al., TF Privacy)
            centred = within - 0.5 * count + rng(self.seed, round, -1, "dp-count"
                                                 ).standard_normal() * self.count_noise
            noisy = min(1.0, max(0.0, centred / self.denominator + 0.5))
            self.clip = float(self.clip * math.exp(-self.clip_lr * (noisy - self.quantile)))
            metrics["dp_unclipped_share"] = float(noisy)
        self.releases += 1
        metrics["dp_epsilon"] = self.epsilon()
        return self.from_delta(global_state, mean), metrics

    def state_dict(self) -> dict[str, Any]:
        return {"clip": self.clip, "releases": self.releases, "z": self.z,
                "template": {k: list(v) for k, v in (self.template or {}).items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a run: its current clip, release count and multiplier. The stored
        multiplier wins over a recalibration, so a resume that raises ``rounds`` keeps the
        noise the run had (and reports the larger ε honestly)."""
        self.clip, self.releases = float(state["clip"]), int(state["releases"])
        self.z = float(state["z"])
        self.template = {k: tuple(v) for k, v in state.get("template", {}).items()} or None
        self.z_update = update_noise_multiplier(self.z, self.count_noise)

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` reports under ``dp``."""
        eps = self.epsilon()
        return {"epsilon": None if math.isinf(eps) else eps, "delta": self.delta,
                "delta_rule": "dp.delta" if self.delta_set else "min(1/N^1.1, 1e-5)",
                "noise_multiplier": self.z, "update_noise_multiplier": self.z_update,
                "clip_norm": self.clip, "releases": self.releases,
                "accountant": self.accountant, "sampling": self.sampling,
                "sampling_rate": self.k / self.n, "adaptive_clip": self.adaptive}
