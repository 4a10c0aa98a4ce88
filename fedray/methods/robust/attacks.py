"""Attacks of malicious clients as free functions (issue #30): the model-poisoning rules on
float64 update rows, and the data-poisoning transforms on a client's samples.

Model poisoning (what a malicious client uploads instead of its honest update ``own``;
the colluding rules see the round's benign updates ``benign``, one row each, in client-id
order — an omniscient attacker):

- ``sign_flip``: −own.
- ``scale``: λ · own (model replacement's boost, Bagdasaryan et al., AISTATS 2020, is
  λ = n / η for n clients and server rate η).
- ``gaussian``: N(0, σ²) per coordinate, drawn from the generator it is given.
- ``alie`` ("A Little Is Enough", Baruch et al., NeurIPS 2019): μ − z_max σ, μ and σ the
  benign coordinate-wise mean and standard deviation (population, ddof 0), z_max =
  Φ⁻¹((n − s) / n) with s = ⌊n / 2 + 1⌋ − m for n clients of which m are malicious.
- ``ipm`` (inner-product manipulation, Xie et al., UAI 2020): −ε · μ.
- ``min_max`` / ``min_sum`` (Shejwalkar & Houmansadr, NDSS 2021, the aggregation-agnostic
  attacks): μ + γ p with p a perturbation direction (``unit``: −μ/‖μ‖, ``std``: −σ,
  ``sign``: −sign μ) and γ the largest found by their halving search (γ₀ = 10, stop when
  the step is below 1e-5) such that the malicious update's largest distance to a benign one
  is at most the largest benign pairwise distance (min-max), or its sum of squared
  distances at most the largest benign one's (min-sum).

Data poisoning: ``flip_labels`` (a stated permutation, default c → C − 1 − c) and
``add_trigger`` (a square pixel pattern in the bottom-right corner set to one value, by
default the images' maximum: Gu et al.'s BadNets trigger as Bagdasaryan et al. use it)
on a fraction of the attacker's samples, relabelled to the target.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from fedray.methods.robust.rules import squared_distances

DIRECTIONS = ("unit", "std", "sign")


def sign_flip(own: np.ndarray) -> np.ndarray:
    return -own


def scale(own: np.ndarray, factor: float) -> np.ndarray:
    return factor * own


def gaussian(shape: tuple[int, ...], sigma: float, gen: np.random.Generator) -> np.ndarray:
    return gen.normal(0.0, sigma, size=shape)


def alie_z(n: int, m: int) -> float:
    """Baruch et al.'s z_max for n clients of which m are malicious. Where their formula
    leaves (0, 1) — s = ⌊n/2 + 1⌋ − m ≤ 0 once the malicious are a majority — s is taken as
    1 (our choice: the largest z their rule reaches)."""
    s = max(int(np.floor(n / 2 + 1)) - m, 1)
    return NormalDist().inv_cdf((n - s) / n) if s < n else 0.0


def alie(benign: np.ndarray, n: int, m: int, z: float | None = None) -> np.ndarray:
    """μ − z σ, z = ``z`` or :func:`alie_z` (n, m)."""
    return benign.mean(0) - (alie_z(n, m) if z is None else z) * benign.std(0)


def ipm(benign: np.ndarray, eps: float) -> np.ndarray:
    return -eps * benign.mean(0)


def direction(benign: np.ndarray, kind: str) -> np.ndarray:
    """The perturbation p of the min-max / min-sum attacks."""
    mu = benign.mean(0)
    if kind == "unit":
        return -mu / max(float(np.linalg.norm(mu)), 1e-300)
    if kind == "std":
        return -benign.std(0)
    if kind == "sign":
        return -np.sign(mu)
    raise ValueError(f"perturbation {kind!r}: one of {', '.join(DIRECTIONS)}")


def _search(benign: np.ndarray, p: np.ndarray, fits) -> np.ndarray:
    """Shejwalkar & Houmansadr's halving search for the largest γ with ``fits(μ + γ p)``."""
    mu = benign.mean(0)
    gamma, step, best = 10.0, 10.0, 0.0
    while abs(best - gamma) > 1e-5:
        if fits(mu + gamma * p):
            best = gamma
            gamma = gamma + step / 2
        else:
            gamma = gamma - step / 2
        step /= 2
    return mu + best * p


def min_max(benign: np.ndarray, kind: str = "unit") -> np.ndarray:
    limit = np.sqrt(squared_distances(benign)).max()
    return _search(benign, direction(benign, kind),
                   lambda v: np.linalg.norm(benign - v, axis=1).max() <= limit)


def min_sum(benign: np.ndarray, kind: str = "unit") -> np.ndarray:
    limit = squared_distances(benign).sum(1).max()
    return _search(benign, direction(benign, kind),
                   lambda v: (np.linalg.norm(benign - v, axis=1) ** 2).sum() <= limit)


def flip_labels(y: np.ndarray, num_classes: int, permutation: list[int] | None = None
                ) -> np.ndarray:
    """Every label through ``permutation`` (default c → C − 1 − c)."""
    perm = np.asarray(permutation if permutation is not None
                      else np.arange(num_classes)[::-1], np.int64)
    if sorted(perm.tolist()) != list(range(num_classes)):
        raise ValueError(f"a permutation of 0..{num_classes - 1}: {perm.tolist()}")
    return perm[y]


def add_trigger(x: np.ndarray, size: int = 3, value: float | None = None) -> np.ndarray:
    """Images (N, C, H, W) with the bottom-right ``size`` × ``size`` square of every
    channel set to ``value`` (default the images' maximum; a copy). One trigger for a
    whole run needs one ``value`` for every client and the test set."""
    if x.ndim != 4:
        raise ValueError(f"images (N, C, H, W), got shape {x.shape}")
    out = x.copy()
    out[:, :, -size:, -size:] = x.max() if value is None else value
    return out


def backdoor(x: np.ndarray, y: np.ndarray, target: int, fraction: float,
             gen: np.random.Generator, size: int = 3, value: float | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """A client's samples with ⌊fraction · N⌋ of them (drawn by ``gen``, without
    replacement) triggered and relabelled ``target``."""
    k = int(np.floor(fraction * len(x) + 1e-9))  # 0.29 of 100 is 29, float rounding aside
    pick = np.sort(gen.choice(len(x), k, replace=False))
    x, y = x.copy(), y.copy()
    if k:
        x[pick] = add_trigger(x[pick], size, value)
        y[pick] = target
    return x, y
